// GradientBucketer: DistributedDataParallel's gradient synchronisation with
// PyTorch's semantics, for the rank process's training loop.
//
// - At construction, parameters and buffers are broadcast from rank 0 so that
//   every rank starts from the same model.
// - Parameters that require grad are grouped into buckets (bucket_assignment.h)
//   in reverse registration order, which approximates the order in which
//   backward produces their gradients; the first bucket is small (1 MiB, as
//   PyTorch's _DEFAULT_FIRST_BUCKET_BYTES), the rest up to bucket_cap_mb.
// - A post-hook on every parameter's gradient accumulator fires while backward
//   is still running: it copies the gradient, divided by world size, into its
//   bucket's flat buffer; once a bucket is complete, it and every complete
//   bucket after it in order is launched as one asynchronous all-reduce
//   (buckets launch in the same order on every rank).
// - With a compressing comm_hook (comm_hook.h) the bucket takes the raw
//   gradients, and the launch casts it to 16 bits and divides there; the
//   16-bit sum is cast back into the bucket when it is waited for.
// - FinalizeBackward() waits for the buckets and writes the averaged gradients
//   back into param.grad(). The loop calls it between backward() and
//   optimizer.step(). PyTorch instead queues an autograd-engine callback; an
//   explicit call keeps errors as values (a Status rather than an exception
//   thrown out of backward()), and makes the exposed communication time (the
//   wait after backward) a number the loop can report.
// - NoSync() (no_sync()) skips communication for gradient-accumulation
//   micro-steps; gradients accumulate locally in param.grad() and the next
//   synced backward reduces the accumulated sum.
// - With broadcast_buffers, PrepareForward() broadcasts buffers (batch-norm
//   statistics) from rank 0 before each forward that follows a synced step.
// - Unused parameters: with find_unused_parameters they count as ready with a
//   zero gradient (found at PrepareForBackward() by walking the autograd graph,
//   or at FinalizeBackward() at the latest), and a parameter no rank used keeps
//   its gradient untouched. Without it, a parameter that got no gradient makes
//   FinalizeBackward() fail with FailedPrecondition naming it, instead of the
//   ranks hanging in mismatched all-reduces.
//
// Training loop:
//   TRAINCTL_ASSIGN_OR_RETURN(auto ddp, GradientBucketer::Create(model, comm, {}));
//   for (...) {
//     TRAINCTL_RETURN_IF_ERROR(ddp->PrepareForward());
//     auto loss = loss_fn(model->forward(x), y);
//     loss.backward();
//     TRAINCTL_RETURN_IF_ERROR(ddp->FinalizeBackward());
//     optimizer.step();
//   }
//
// Devices: parameters must live where the collectives work (CPU for Gloo,
// the engine's GPU for NCCL). With NCCL, the bucket copies run on LibTorch's
// current stream, so that stream must be the engine's compute stream
// (NcclCollectives::UseCurrentTorchStream()).
//
// Threading: not thread-safe for calls; one training-loop thread calls
// Prepare*/FinalizeBackward/NoSync. The autograd hooks may run on autograd's
// worker threads during backward; they take the internal mutex. The module's
// parameter tensors must stay the same objects for the bucketer's lifetime
// (it holds them and their gradient accumulators); the destructor removes the
// hooks.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/dist/collectives.h"
#include "worker/dist/comm_hook.h"
#include "worker/dist/powersgd.h"

namespace torch {
namespace nn {
class Module;
}  // namespace nn
namespace autograd {
struct Node;
}  // namespace autograd
}  // namespace torch

namespace trainctl::dist {

struct GradientBucketerOptions {
  // Size cap of every bucket after the first (DDP's bucket_cap_mb).
  double bucket_cap_mb = 25.0;
  // Size cap of the first bucket to launch (dist._DEFAULT_FIRST_BUCKET_BYTES).
  size_t first_bucket_bytes = 1u << 20;
  bool find_unused_parameters = false;
  bool broadcast_buffers = true;
  // DDP communication hook (ddp.comm_hook): none, fp16_compress, bf16_compress,
  // powersgd.
  CommHook comm_hook = CommHook::kNone;
  // ddp.powersgd, read with comm_hook powersgd.
  PowerSgdOptions powersgd;
  // The comm timeline (TRAINCTL_COMM_TIMELINE, docs/ddp.md): every synced
  // step records when each bucket was ready, issued, ran on the engine and
  // was waited for (StepCommStats::timeline), and the engine is asked to
  // stamp its collectives (Collectives::RecordWorkTimes). Off: no clock is
  // read for it.
  bool record_timeline = false;
  // DDP's gradient_as_bucket_view (ddp.gradient_as_bucket_view): from the
  // first synced step on, every contiguous parameter's param.grad() is its
  // slice of the bucket, so backward accumulates straight into the bucket,
  // the hook divides in place (a comm hook compresses the bucket as it is),
  // and FinalizeBackward copies nothing back: a pass over the gradients'
  // memory less on each side of the all-reduce, for the same bytes. The
  // caller must zero the gradients in place (LibTorch 1.x's zero_grad(),
  // 2.x's zero_grad(false): torch_compat::ZeroGradInPlace) for the slices
  // to stay; setting them to None, or replacing param.grad() with another
  // tensor, just costs one copy at the next synced step. Off here as in
  // PyTorch; the job spec turns it on by default.
  bool gradient_as_bucket_view = false;
  // No overlap: the hooks only fill the buckets and FinalizeBackward
  // launches them all, in the same order. For measuring what overlapping
  // the all-reduce with backward costs or saves where both compete for the
  // same cores (issue #49); off by default.
  bool launch_after_backward = false;
};

// One launched bucket all-reduce.
struct BucketLaunchRecord {
  size_t bucket = 0;  // index into buckets(), which is also launch order
  std::chrono::steady_clock::time_point time;
  // True when launched from an autograd hook, i.e. while backward was running.
  bool from_hook = false;
  // Parameter gradients that had arrived (or were marked unused) by then.
  size_t grads_ready = 0;
};

// One bucket's part of a synced step, with
// GradientBucketerOptions::record_timeline. A default (zero) time_point is a
// moment that did not happen this step (a failed step's later buckets).
struct BucketTimeline {
  // Its last gradient was copied into it (or marked unused): complete.
  std::chrono::steady_clock::time_point ready;
  // Its launch began (a comm hook's compression, then the all-reduce
  // queued on the engine): never after the engine started it.
  std::chrono::steady_clock::time_point issued;
  // When the all-reduce ran on the engine's thread; nullopt when the engine
  // does not record it (CollectiveWork::times).
  std::optional<WorkTimes> ran;
  // FinalizeBackward's Wait() for it returned.
  std::chrono::steady_clock::time_point waited;
};

// What one step's synchronisation did, for metrics and tests.
struct StepCommStats {
  int64_t step = 0;       // synced backward passes finalized so far, this one included
  bool synced = false;    // false for a no_sync micro-step (nothing communicated)
  bool powersgd = false;  // the buckets went through PowerSGD (past start_iter)
  size_t num_params = 0;
  size_t grads_from_hooks = 0;               // gradients that arrived through the hooks
  size_t unused_params = 0;                  // marked ready with a zero gradient (find_unused)
  std::vector<BucketLaunchRecord> launches;  // in launch order
  // When FinalizeBackward() was entered, i.e. just after backward returned.
  std::chrono::steady_clock::time_point backward_end;
  // Time FinalizeBackward() spent waiting for communication: what overlap
  // did not hide.
  absl::Duration exposed_comm = absl::ZeroDuration();
  // Time PrepareForward() spent broadcasting buffers before this step.
  absl::Duration buffer_broadcast = absl::ZeroDuration();
  // With record_timeline, synced steps only: per bucket (index into
  // buckets()), and FinalizeBackward's wait for the buckets (it begins after
  // the missing-gradient check and ends before the gradients are copied
  // back). Empty / zero otherwise.
  std::vector<BucketTimeline> timeline;
  std::chrono::steady_clock::time_point wait_start;
  std::chrono::steady_clock::time_point wait_end;

  // How long before the end of backward bucket `i` of `launches` was
  // launched (negative: launched after backward returned).
  absl::Duration LaunchLeadTime(size_t i) const {
    return absl::FromChrono(backward_end - launches[i].time);
  }
};

struct BucketInfo {
  std::vector<size_t> params;  // indices into parameter_names(), in bucket order
  size_t bytes = 0;
  size_t size_limit = 0;
  // Kept in memory the engine all-reduces without copying it in or out
  // (Collectives::AllocateShared: Gloo with every rank on one host).
  bool shared = false;
};

class GradientBucketer {
 public:
  // Takes every parameter of `module` that requires grad (registration order,
  // shared parameters once) and every buffer; broadcasts them from rank 0.
  static absl::StatusOr<std::unique_ptr<GradientBucketer>> Create(
      torch::nn::Module& module, std::shared_ptr<Collectives> comm,
      const GradientBucketerOptions& options = {});

  // Same, for parameters and buffers gathered elsewhere (a TorchScript
  // module). `named_params` in registration order; all must be leaf tensors.
  static absl::StatusOr<std::unique_ptr<GradientBucketer>> Create(
      std::vector<std::pair<std::string, at::Tensor>> named_params, std::vector<at::Tensor> buffers,
      std::shared_ptr<Collectives> comm, const GradientBucketerOptions& options = {});

  ~GradientBucketer();
  GradientBucketer(const GradientBucketer&) = delete;
  GradientBucketer& operator=(const GradientBucketer&) = delete;

  // Before each forward: broadcasts buffers from rank 0 (broadcast_buffers,
  // and only after a synced step, as DDP). FailedPrecondition when the
  // previous synced backward was never finalized.
  absl::Status PrepareForward();

  // Optional, between forward and backward: with find_unused_parameters, marks
  // the parameters `outputs` do not depend on as ready now, so buckets holding
  // them can launch during backward. No-op otherwise or under NoSync().
  absl::Status PrepareForBackward(const std::vector<at::Tensor>& outputs);

  // After backward, before optimizer.step(): launches what the hooks did not,
  // waits for every bucket, and writes the averaged gradients to
  // param.grad(). Under NoSync() it only closes the micro-step. Errors:
  // FailedPrecondition (a parameter got no gradient without
  // find_unused_parameters, or got two in one backward), or the collective's
  // error (DeadlineExceeded, Unavailable, Aborted) when a peer failed; the
  // step's gradients are then not averaged and the attempt should end.
  absl::Status FinalizeBackward();

  // DDP's no_sync(): while the guard lives, backward passes accumulate
  // gradients locally and communicate nothing.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(GradientBucketer* b) : b_(b), prev_(b->require_backward_grad_sync()) {
      b_->set_require_backward_grad_sync(false);
    }
    ~NoSyncGuard() { b_->set_require_backward_grad_sync(prev_); }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    GradientBucketer* const b_;
    const bool prev_;
  };
  NoSyncGuard NoSync() { return NoSyncGuard(this); }
  void set_require_backward_grad_sync(bool sync);
  bool require_backward_grad_sync() const;

  const std::vector<std::string>& parameter_names() const { return names_; }
  const std::vector<BucketInfo>& buckets() const { return bucket_infos_; }
  // Stats of the last finalized step (synced or not).
  StepCommStats last_step_stats() const;
  // Under comm_hook powersgd: how many gradient tensors are compressed, and
  // the values each rank sends per PowerSGD step against the float32
  // buckets' size. All zero under another hook.
  struct PowerSgdPlan {
    size_t compressed_tensors = 0;
    size_t tensors = 0;
    int64_t wire_numel = 0;
    int64_t bucket_numel = 0;
  };
  PowerSgdPlan powersgd_plan() const;
  Collectives& collectives() { return *comm_; }

  // Checkpoints under comm_hook powersgd (docs/ddp.md). A collective: every
  // rank calls it at the same point between steps. Once PowerSGD has run,
  // each rank's error feedback goes to every rank (one broadcast per rank,
  // in rank order: a writer may be any rank, one per host); `keep_errors`
  // says whether this rank keeps them (a checkpoint writer) or only takes
  // part. The step count, the generator and Q are the same on every rank
  // and need no communication. FailedPrecondition under another hook or
  // inside a step; a collective's error as FinalizeBackward's.
  absl::StatusOr<PowerSgdState> SavePowerSgdState(bool keep_errors);
  // Puts a saved state back, before the first step: the step count and the
  // generator always; Q only into an equal bucket layout; this rank's error
  // feedback only into an equal layout at the same world size. What does
  // not fit starts afresh (zero error, a fresh Q). Returns one line for the
  // log saying what was restored and, where something was not, why.
  std::string RestorePowerSgdState(const PowerSgdState& state);

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    at::Tensor flat;             // one contiguous buffer, reused every step
    // The 16-bit copy of flat that a compressing comm hook all-reduces;
    // undefined for CommHook::kNone.
    at::Tensor compressed;
    // PowerSGD's state for a float32 bucket under CommHook::kPowerSgd; null
    // otherwise. q_work: its Q all-reduce, this step.
    std::unique_ptr<PowerSgdBucket> powersgd;
    std::shared_ptr<CollectiveWork> q_work;
    // views[i] is params[i]'s slice of flat, shaped like it. With
    // gradient_as_bucket_view it aliases flat's storage without being an
    // autograd view (set_), so that zero_grad()'s detach_() accepts it as a
    // gradient.
    std::vector<at::Tensor> views;
    size_t pending = 0;                    // gradients still missing this step
    std::shared_ptr<CollectiveWork> work;  // set once launched this step
  };
  struct ParamLocation {
    size_t bucket = 0;
    size_t slot = 0;  // index into the bucket's params/views
  };

  GradientBucketer(std::vector<std::string> names, std::vector<at::Tensor> params,
                   std::vector<at::Tensor> buffers, std::shared_ptr<Collectives> comm,
                   const GradientBucketerOptions& options);
  absl::Status Init();

  // Called by the accumulator post-hook of params_[index].
  void OnGradReady(size_t index);
  void StartStepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies (grad / world_size) into the bucket slot (grad itself under a
  // compressing comm hook, which divides later), or zeros when `unused`.
  void MarkReadyLocked(size_t index, bool unused, bool from_hook)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // gradient_as_bucket_view: makes `view` (the bucket slot that now holds
  // params_[index]'s gradient) its param.grad().
  void UseBucketSlotAsGradLocked(size_t index, const at::Tensor& view)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Launches every complete bucket from next_bucket_ on, stopping at the first
  // incomplete one, so that launch order is bucket order on every rank.
  void LaunchReadyBucketsLocked(bool from_hook) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ResetStepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FinalizeBackward's parts. Parameters without a gradient this step: with
  // find_unused_parameters their buckets launch now, else an error.
  absl::Status HandleMissingGradsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when this step's buckets go through PowerSGD.
  bool PowerSgdStepLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for every bucket; under a compressing hook, casts each 16-bit
  // result back into its float32 bucket; under PowerSGD, runs its Q round.
  absl::Status WaitBucketsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // find_unused_parameters: which parameters any rank used (int32 on the
  // CPU, all-reduced).
  absl::StatusOr<at::Tensor> GloballyUsedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies the averaged bucket views into the gradients (skipping
  // parameters no rank used, when `globally_used` is defined).
  void CopyBucketGradsLocked(const at::Tensor& globally_used) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string DescribeParams(const std::vector<size_t>& indices) const;
  // PowerSgdBucket::Layout of every PowerSGD bucket, one per line.
  std::string PowerSgdLayoutLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const GradientBucketerOptions options_;
  const std::shared_ptr<Collectives> comm_;
  const std::vector<std::string> names_;
  const std::vector<at::Tensor> params_;  // requires_grad leaves, registration order
  const std::vector<at::Tensor> buffers_;
  std::vector<BucketInfo> bucket_infos_;  // fixed after Init
  std::vector<ParamLocation> locations_;  // per param, fixed after Init
  // The accumulators must be kept alive: a tensor holds its accumulator only
  // weakly, and a hook on a dropped accumulator is lost.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;

  mutable absl::Mutex mu_;
  bool require_sync_ ABSL_GUARDED_BY(mu_) = true;
  // DDP's require_forward_param_sync: buffers are broadcast before a forward
  // only when the previous backward was synced.
  bool require_forward_param_sync_ ABSL_GUARDED_BY(mu_) = true;
  // A synced backward has started (first hook fired or PrepareForBackward)
  // and FinalizeBackward has not yet run.
  bool step_started_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  std::vector<uint8_t> ready_ ABSL_GUARDED_BY(mu_);         // per param, this step
  std::vector<uint8_t> locally_used_ ABSL_GUARDED_BY(mu_);  // per param, this step
  size_t next_bucket_ ABSL_GUARDED_BY(mu_) = 0;             // first bucket not yet launched
  size_t grads_ready_ ABSL_GUARDED_BY(mu_) = 0;
  // First error seen by a hook this step; FinalizeBackward returns it.
  absl::Status step_error_ ABSL_GUARDED_BY(mu_);
  StepCommStats current_ ABSL_GUARDED_BY(mu_);
  StepCommStats last_ ABSL_GUARDED_BY(mu_);
  int64_t synced_steps_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration pending_buffer_broadcast_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  // PowerSGD's random Q: seeded alike on every rank, drawn in bucket order.
  std::mt19937_64 powersgd_rng_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainctl::dist
