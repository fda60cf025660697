// LibTorch glue for the Collectives interface: turns a dense contiguous tensor
// into a CommBuffer that keeps the tensor's storage alive while the engine
// uses it. Called by the GradientBucketer and by rank start-up code.
//
// Threading: stateless functions; thread-safe.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/dist/collectives.h"

namespace trainctl::dist {

// InvalidArgument when `tensor` is undefined, sparse, non-contiguous, of a
// type no engine reduces, or on a device other than CPU/CUDA.
absl::StatusOr<CommDataType> CommDataTypeOf(const at::Tensor& tensor);
absl::StatusOr<CommBuffer> CommBufferFromTensor(const at::Tensor& tensor);

// In-place sum of `tensor` over all ranks (asynchronous; wait on the work).
std::shared_ptr<CollectiveWork> AllReduceSum(Collectives& comm, const at::Tensor& tensor);
// Copies rank `root`'s `tensor` into every rank's `tensor` (asynchronous).
std::shared_ptr<CollectiveWork> Broadcast(Collectives& comm, const at::Tensor& tensor, int root);

// Broadcasts `tensors` (any layout, any mix of types) from `root` and waits:
// they are packed per type into flat buffers of at most `bucket_bytes`, one
// broadcast each, and copied back. Used to make every rank start from rank 0's
// parameters and to sync buffers (batch-norm statistics) each step, as
// torch.nn.parallel.DistributedDataParallel does.
absl::Status BroadcastCoalesced(Collectives& comm, const std::vector<at::Tensor>& tensors, int root,
                                size_t bucket_bytes = 250u << 20);

}  // namespace trainctl::dist
