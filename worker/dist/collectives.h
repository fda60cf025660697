// Collectives: the one interface the training engine uses to talk to its peer
// ranks. Two engines implement it: Gloo over TCP for CPU memory
// (gloo_collectives.h) and NCCL for CUDA memory (nccl_collectives.h). The
// GradientBucketer (gradient_bucketer.h) and the rank process's start-up code
// (parameter broadcast, barriers) are the callers; tensor_collectives.h adapts
// LibTorch tensors to the raw buffers used here.
//
// Semantics follow torch.distributed: every rank calls the same collectives in
// the same order; AllReduceSum sums in place (the caller divides for the
// average); Broadcast copies the root's buffer into every rank's buffer.
// Collectives are asynchronous: they return a CollectiveWork to wait on, and an
// engine runs them in the order they were issued. A peer that died or stalled
// surfaces as an error from Wait() after at most the engine's timeout, never as
// a hang. After an error or Abort() the engine is broken: every later call
// fails (a job restarts with a fresh attempt and a fresh engine).
//
// Threading: an engine is thread-safe (calls from several threads are
// serialised in call order), but the order in which collectives are issued must
// be the same on every rank, so in practice one thread issues them.
// CollectiveWork::Wait may be called from any thread, any number of times.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainctl::dist {

// Element types the engines reduce. Sum of integer types wraps like C++.
enum class CommDataType {
  kFloat32,   // float
  kFloat64,   // double
  kFloat16,   // IEEE half (c10::Half)
  kBFloat16,  // bfloat16 (c10::BFloat16)
  kInt32,     // int32_t
  kInt64,     // int64_t
  kUInt8,     // uint8_t
};

// Bytes per element of `type`.
size_t CommDataTypeSize(CommDataType type);
const char* CommDataTypeName(CommDataType type);

// Where a CommBuffer's memory lives; an engine accepts exactly one kind.
enum class CommDevice {
  kCpu,   // host memory (Gloo)
  kCuda,  // device memory on the engine's GPU (NCCL)
};

// A contiguous buffer of `count` elements a collective reads and writes in
// place. `keep_alive` (optional) owns the memory: the engine holds it until the
// collective has finished touching `data`, even when Wait() returned early
// with an error, so memory handed over this way is never used after free.
struct CommBuffer {
  void* data = nullptr;
  size_t count = 0;
  CommDataType type = CommDataType::kFloat32;
  CommDevice device = CommDevice::kCpu;
  std::shared_ptr<void> keep_alive;

  size_t bytes() const { return count * CommDataTypeSize(type); }
};

// When a collective ran on its engine, on the steady clock (the comm
// timeline, docs/ddp.md): `started` when the engine's thread took it from
// its queue, `finished` when it left the transport.
struct WorkTimes {
  std::chrono::steady_clock::time_point started;
  std::chrono::steady_clock::time_point finished;
};

// Handle on one issued collective.
class CollectiveWork {
 public:
  virtual ~CollectiveWork() = default;

  // Blocks until the collective finished, failed, or `timeout` passed.
  // OK: the result is in the buffer (for NCCL: ordered before any work
  // enqueued afterwards on the engine's compute stream). DeadlineExceeded: it
  // did not finish in time; the engine aborts itself, since a collective that
  // a peer never joins would otherwise hold the communicator forever.
  // Unavailable: a peer went away (connection closed). Aborted: Abort() was
  // called. InvalidArgument: the buffer was rejected.
  virtual absl::Status Wait(absl::Duration timeout) = 0;
  // Waits with the engine's configured timeout.
  virtual absl::Status Wait() = 0;

  // True once Wait() would return without blocking.
  virtual bool IsCompleted() = 0;

  // When the collective ran, once it finished, for an engine asked to
  // record it (Collectives::RecordWorkTimes); nullopt otherwise, and always
  // for an engine that cannot tell (NCCL: its work runs on a stream).
  virtual std::optional<WorkTimes> times() { return std::nullopt; }
};

class Collectives {
 public:
  virtual ~Collectives() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual CommDevice device() const = 0;
  // Engine name for logs and metrics: "gloo" or "nccl".
  virtual std::string name() const = 0;
  // The timeout each collective gets by default (Wait() without argument).
  virtual absl::Duration timeout() const = 0;

  // In-place sum over all ranks. Never returns null: a rejected buffer or a
  // broken engine yields a work whose Wait() returns the error.
  virtual std::shared_ptr<CollectiveWork> AllReduceSum(CommBuffer buffer) = 0;

  // Copies `root`'s buffer into every rank's buffer (same count and type on
  // every rank).
  virtual std::shared_ptr<CollectiveWork> Broadcast(CommBuffer buffer, int root) = 0;

  // Blocks until every rank reached the barrier, or the timeout passed.
  virtual absl::Status Barrier() = 0;

  // Fails every pending and future collective with Aborted and tears the
  // communicator down as far as the library allows (ncclCommAbort for NCCL;
  // closing the peer connections for Gloo). Idempotent, thread-safe, and safe
  // to call while another thread waits.
  virtual void Abort() = 0;

  // From now on, the engine records when each collective started and
  // finished (CollectiveWork::times()); off by default, so an engine's
  // thread reads no clock for it. Engines that cannot tell ignore it.
  virtual void RecordWorkTimes() {}

  // `bytes` of memory that this engine all-reduces in place without copying
  // it in or out (Gloo with every rank on one host: a block of the
  // shared-memory segment every rank reads and writes). A collective: every
  // rank asks for the same size, in the same order. Null (OK) when the
  // engine has none or no room, on every rank alike; the caller then uses
  // its own memory. The memory stays valid while the pointer lives, even
  // past the engine.
  virtual absl::StatusOr<std::shared_ptr<void>> AllocateShared(size_t bytes) {
    (void)bytes;
    return std::shared_ptr<void>();
  }
};

// A CollectiveWork that is already finished with `status` (used for rejected
// buffers and broken engines).
std::shared_ptr<CollectiveWork> CompletedWork(absl::Status status);

}  // namespace trainctl::dist
