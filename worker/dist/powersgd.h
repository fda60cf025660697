// PowerSGD (Vogels et al., 2019) as PyTorch's DDP communication hook
// torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook:
// the arithmetic on one float32 gradient bucket, in three stages around two
// sum all-reduces that the GradientBucketer issues.
//
// Per bucket, every parameter gradient with >= 2 dimensions is viewed as an
// n x m matrix M (n = size(0)); it is compressed at rank r = min(n, m,
// matrix_approximation_rank) when PyTorch's _should_compress says so:
// (n + m) * r * min_compression_rate < n * m. The rest (1-D tensors and
// matrices too small to pay) travel as float32.
//
//   Compress:   [error feedback: flat += error; error = flat]
//               Q: warm start reuses last step's Q (orthogonalized), else a
//               fresh random Q from a generator seeded identically on every
//               rank; P = M Q; the stage-1 buffer is [uncompressed | P].
//   (all-reduce sum of the stage-1 buffer)
//   ComputeQ:   uncompressed = sum / world_size back into the bucket;
//               P orthogonalized (Gram-Schmidt); Q = M^T P.
//   (all-reduce sum of Q)
//   Decompress: Q /= world_size; M = P Q^T into the bucket;
//               [error feedback: error = M_in - bucket].
//
// Replicas stay bit-identical: after each all-reduce every rank holds the
// same bits, and what follows (division, Gram-Schmidt in plain C++ on the
// host in a fixed order, P Q^T as r elementwise outer products added in a
// fixed order) does not depend on vector width or BLAS kernels. M Q and
// M^T P are computed before an all-reduce, so their rounding may differ by
// rank without harm.
//
// Departures from PyTorch, each to keep training alive where PyTorch's
// hook would not: a zero column stays zero in Gram-Schmidt (PyTorch divides
// by the zero norm and gets NaN); a warm-start Q that is not finite or has a
// zero column is drawn afresh (identically on every rank: Q is the same
// bits everywhere); non-finite error-feedback entries (a step whose
// gradients overflowed, which the loss scaler skips) restart at zero. The
// random Q is uniform in [-1, 1) from std::mt19937_64 rather than
// torch.randn, so that it is the same on every platform.
//
// Not thread-safe; the bucketer holds its mutex.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace trainctl::dist {

// ddp.powersgd, with PyTorch's PowerSGDState defaults.
struct PowerSgdOptions {
  int64_t rank = 1;                 // matrix_approximation_rank, >= 1
  int64_t start_iter = 1000;        // start_powerSGD_iter: plain all-reduce before
  double min_compression_rate = 2;  // compress when n*m > rate * (n+m)*r, >= 1
  bool use_error_feedback = true;   // use_error_feedback
  bool warm_start = true;           // warm_start: reuse Q across steps
  uint64_t seed = 0;                // random_seed (not in the job spec)
};

// PowerSGD's state between steps, as a checkpoint keeps it (docs/ddp.md):
// GradientBucketer::SavePowerSgdState fills it on every rank,
// RestorePowerSgdState puts it back. Tensors are on the CPU.
struct PowerSgdState {
  // Synced steps finalized (PyTorch's state.iter): decides whether the
  // start_iter warm-up is over.
  int64_t iter = 0;
  // The random-Q generator (std::mt19937_64's text form); the same on every
  // rank.
  std::string rng;
  // The buckets' plans (PowerSgdBucket::Layout, one line per PowerSGD
  // bucket): Q and the errors restore only into an equal layout.
  std::string layout;
  // The world size of the ranks that saved it: the errors restore only at
  // the same world size.
  int64_t world_size = 0;
  // q holds the last step's factors (warm start); q[b] is PowerSGD bucket
  // b's Q, the same bits on every rank. Empty before the first PowerSGD step.
  bool has_q = false;
  std::vector<at::Tensor> q;
  // errors[r][b]: rank r's error feedback for PowerSGD bucket b. Empty
  // without error feedback, before the first PowerSGD step, or where the
  // ranks' errors were not kept; otherwise world_size rows (a loaded state
  // may hold only its own rank's row filled, the others undefined).
  std::vector<std::vector<at::Tensor>> errors;
};

// PyTorch's _should_compress: (n + m) * r * min_compression_rate < n * m.
bool PowerSgdShouldCompress(int64_t n, int64_t m, int64_t r, double min_compression_rate);

// Gram-Schmidt on the columns of `matrix` (n x r, float32, contiguous, CPU
// or CUDA), in place: each column normalized, then projected out of the
// columns after it. Accumulates in double on the host in a fixed order, so
// equal inputs give equal bits on any machine. A zero column stays zero; a
// non-finite one stays non-finite. Returns false in either case.
bool OrthogonalizeColumns(at::Tensor& matrix);

// out (n x m) = p (n x r) q^T (q: m x r): out = p0 q0^T, then += pk qk^T for
// k = 1..r-1, each an elementwise product or sum, so the bits depend on
// nothing but the inputs. `scratch` (n x m) is used when r > 1.
void LowRankProduct(const at::Tensor& p, const at::Tensor& q, at::Tensor& out, at::Tensor& scratch);

// t /= world_size in place, the divisor a wrapped number (the hook's
// `.div_(world_size)`).
void DivideByWorldSize(at::Tensor& t, int world_size);

// Uniform values in [-1, 1) (multiples of 2^-23) from `rng`, copied into `t`.
void FillUniform(std::mt19937_64& rng, at::Tensor& t);

class PowerSgdBucket {
 public:
  // `flat` is the bucket's float32 buffer; `views[i]` the slice of parameter
  // i, shaped like it. Plans which views are compressed and allocates the
  // P, Q and error buffers.
  PowerSgdBucket(const at::Tensor& flat, const std::vector<at::Tensor>& views,
                 const PowerSgdOptions& options);

  // Stage 1, on the raw local gradients in `flat`; returns the buffer to
  // sum-all-reduce. `rng` draws a fresh Q when needed; it must be in the same
  // state on every rank (one per bucketer, used in bucket order).
  at::Tensor& Compress(at::Tensor& flat, std::mt19937_64& rng);
  // Stage 2, after the stage-1 sum; returns Q to sum-all-reduce.
  at::Tensor& ComputeQ(int world_size);
  // Stage 3, after the Q sum: the averaged approximation lands in `flat`.
  void Decompress(at::Tensor& flat, int world_size);

  size_t compressed_tensors() const { return matrices_.size(); }
  // Elements each rank sends per PowerSGD step (stage 1 + Q), and the
  // bucket's size, for the compression rate.
  int64_t wire_numel() const;
  int64_t bucket_numel() const { return bucket_numel_; }
  // The error-feedback buffer (undefined without error feedback): this
  // rank's, for checkpoints and tests.
  const at::Tensor& error() const { return error_; }
  // All Qs of the bucket (the same bits on every rank), and whether they
  // hold the previous step's factors (what warm start reuses).
  const at::Tensor& q() const { return q_; }
  bool has_q() const { return have_q_; }
  // The bucket's plan: its size and each compressed matrix as n x m @ r.
  // Equal layouts mean equal shapes of q() and error().
  std::string Layout() const;
  // Checkpoint restore (shapes as q() and error(); the caller checks
  // Layout()). RestoreError is a no-op without error feedback.
  void RestoreQ(const at::Tensor& q, bool has_q);
  void RestoreError(const at::Tensor& error);

 private:
  struct Matrix {
    at::Tensor m;  // n x m view of the bucket
    at::Tensor p;  // n x r view of stage1_
    at::Tensor q;  // m x r view of q_
    int64_t n = 0, cols = 0, r = 0;
    int64_t p_off = 0;  // p's offset in stage1_'s P part
    int64_t q_off = 0;  // q's offset in q_
  };
  // Gram-Schmidt on every P (of_p) or every Q, in one host round trip for
  // the bucket when the factors live on a GPU. False if any column was zero
  // or not finite.
  bool OrthogonalizeFactors(bool of_p);
  const PowerSgdOptions options_;
  int64_t bucket_numel_ = 0;
  std::vector<Matrix> matrices_;
  std::vector<at::Tensor> uncompressed_;  // views of the bucket, flattened
  int64_t uncompressed_numel_ = 0;
  at::Tensor stage1_;    // [uncompressed | P]
  at::Tensor q_;         // all Qs
  at::Tensor error_;     // bucket-sized; undefined without error feedback
  at::Tensor scratch_;   // for LowRankProduct at rank > 1
  bool have_q_ = false;  // a Q from the previous step to warm-start from
};

}  // namespace trainctl::dist
