// NCCL engine of the Collectives interface (collectives.h): CUDA buffers on
// one GPU per rank. Compiled only where the CUDA toolkit and NCCL were found
// (TRAINCTL_HAVE_NCCL); callers guard their use with `#if TRAINCTL_HAVE_NCCL`.
//
// Bootstrap: rank 0's side calls GenerateNcclUniqueId() (NCCL's bootstrap
// root lives in the calling process, so rank 0's process or its daemon on the
// same host calls it), the coordinator hands the 128 bytes to every rank, and
// each rank calls CreateNcclCollectives, which runs ncclCommInitRankConfig
// non-blocking so that a peer that never shows up ends in DeadlineExceeded
// (and ncclCommAbort) instead of a hang.
//
// Streams: collectives run on a dedicated high-priority communication stream.
// Each one first waits (cudaStreamWaitEvent) for an event recorded on the
// compute stream at issue time, so it sees every kernel the caller enqueued
// before; CollectiveWork::Wait() blocks the host until the collective is done
// and then makes the compute stream wait for it, so later compute sees the
// result. The compute stream is set with set_compute_stream(); with
// LibTorch-CUDA (TRAINCTL_NCCL_TORCH_CUDA) UseCurrentTorchStream() takes
// LibTorch's current stream, which is what the GradientBucketer's copies run
// on. Debian's LibTorch is CPU-only, so the engine itself works on raw device
// pointers (CommBuffer) and needs no LibTorch.
//
// Failure: Wait() polls ncclCommGetAsyncError while it waits; an async error,
// a timeout or Abort() calls ncclCommAbort, after which every collective fails.
//
// Threading: thread-safe; enqueueing is serialised, so the NCCL call order is
// the issue order. Wait() may be called from any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/nccl_id.h"
#include "worker/dist/collectives.h"

namespace trainctl::dist {

// The id's size and its generator live in common/nccl_id.h (the daemon and
// the coordinator use them without linking NCCL).
using ::trainctl::kNcclUniqueIdBytes;

struct NcclOptions {
  int rank = 0;
  int world_size = 1;
  int device = 0;         // CUDA device ordinal this rank uses (its local rank)
  std::string unique_id;  // exactly kNcclUniqueIdBytes bytes
  // Bounds communicator init and every collective's Wait().
  absl::Duration timeout = absl::Minutes(5);
  // Stream the caller's compute runs on; nullptr = the legacy default stream.
  cudaStream_t compute_stream = nullptr;
};

class NcclCollectives : public Collectives {
 public:
  // Stream future collectives order against (issue on it, wait onto it).
  virtual void set_compute_stream(cudaStream_t stream) = 0;
  virtual cudaStream_t compute_stream() const = 0;
  // The dedicated stream NCCL kernels run on.
  virtual cudaStream_t comm_stream() const = 0;
  virtual int device_index() const = 0;

#if TRAINCTL_NCCL_TORCH_CUDA
  // Makes LibTorch's current CUDA stream on this device the compute stream.
  virtual void UseCurrentTorchStream() = 0;
#endif
};

// Creates the communicator (blocks until every rank joined, or the timeout).
// InvalidArgument for bad options (wrong id length, rank out of range, device
// missing); DeadlineExceeded when peers never joined; Unavailable for NCCL or
// CUDA errors.
absl::StatusOr<std::shared_ptr<NcclCollectives>> CreateNcclCollectives(const NcclOptions& options);

}  // namespace trainctl::dist
