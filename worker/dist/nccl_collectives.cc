#include "worker/dist/nccl_collectives.h"

#include <nccl.h>

#if TRAINCTL_NCCL_TORCH_CUDA
#include "worker/torch_compat.h"
#endif

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "worker/dist/work_status.h"

namespace trainctl::dist {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status CudaStatus(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(what, ": CUDA error ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

absl::Status NcclStatus(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  if (r == ncclSuccess) return absl::OkStatus();
  std::string text = absl::StrCat(what, ": NCCL error: ", ncclGetErrorString(r));
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') absl::StrAppend(&text, " (", last, ")");
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) return absl::InvalidArgumentError(text);
  return absl::UnavailableError(text);
}

absl::StatusOr<ncclDataType_t> NcclType(CommDataType type) {
  switch (type) {
    case CommDataType::kFloat32:
      return ncclFloat32;
    case CommDataType::kFloat64:
      return ncclFloat64;
    case CommDataType::kFloat16:
      return ncclFloat16;
    case CommDataType::kBFloat16:
      return ncclBfloat16;
    case CommDataType::kInt32:
      return ncclInt32;
    case CommDataType::kInt64:
      return ncclInt64;
    case CommDataType::kUInt8:
      return ncclUint8;
  }
  return absl::InvalidArgumentError("nccl: unknown data type");
}

// Makes `device` current for the scope; autograd hooks may run on threads
// whose current device is another one.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device) : device_(device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != device_) cudaSetDevice(device_);
  }
  ~CudaDeviceGuard() {
    if (prev_ >= 0 && prev_ != device_) cudaSetDevice(prev_);
  }

 private:
  const int device_;
  int prev_ = -1;
};

// Polls a non-blocking communicator until its pending call left
// ncclInProgress. Returns the final state, or ncclInProgress at the deadline.
ncclResult_t PollAsync(ncclComm_t comm, Clock::time_point deadline) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (Clock::now() >= deadline) return ncclInProgress;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// One collective on the communication stream: its completion event, and the
// memory it uses, held until the event fired or the communicator was torn down.
struct Inflight {
  cudaEvent_t done = nullptr;
  std::shared_ptr<void> keep_alive;
  ~Inflight() {
    if (done != nullptr) cudaEventDestroy(done);
  }
};

class NcclEngine;

class NcclWork final : public CollectiveWork {
 public:
  NcclWork(std::weak_ptr<NcclEngine> engine, std::shared_ptr<Inflight> inflight,
           std::string description, absl::Duration timeout)
      : engine_(std::move(engine)),
        inflight_(std::move(inflight)),
        description_(std::move(description)),
        timeout_(timeout) {}

  absl::Status Wait(absl::Duration timeout) override;
  absl::Status Wait() override { return Wait(timeout_); }
  bool IsCompleted() override {
    return result_.done() || cudaEventQuery(inflight_->done) == cudaSuccess;
  }

 private:
  const std::weak_ptr<NcclEngine> engine_;
  const std::shared_ptr<Inflight> inflight_;
  const std::string description_;
  const absl::Duration timeout_;
  WorkStatus result_;
};

class NcclEngine final : public NcclCollectives, public std::enable_shared_from_this<NcclEngine> {
 public:
  NcclEngine(const NcclOptions& options, ncclComm_t comm, cudaStream_t comm_stream,
             cudaEvent_t ready_event, void* scratch)
      : options_(options),
        comm_(comm),
        comm_stream_(comm_stream),
        ready_event_(ready_event),
        scratch_(scratch),
        compute_stream_(options.compute_stream) {}

  ~NcclEngine() override {
    CudaDeviceGuard guard(options_.device);
    absl::MutexLock l(&mu_);
    PrunePendingLocked();
    if (!aborted_) {
      // A healthy, idle communicator is finalized (non-blocking: poll until
      // done) and destroyed; pending collectives could wait forever on a dead
      // peer, so then, or when finalizing stalls, it is aborted.
      bool finalized = false;
      if (pending_.empty() && broken_.ok()) {
        const ncclResult_t r = ncclCommFinalize(comm_);
        finalized = (r == ncclSuccess || r == ncclInProgress) &&
                    PollAsync(comm_, Clock::now() + absl::ToChronoNanoseconds(std::min(
                                                        options_.timeout, absl::Seconds(30)))) ==
                        ncclSuccess;
      }
      if (finalized) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    pending_.clear();
    cudaStreamDestroy(comm_stream_);
    cudaEventDestroy(ready_event_);
    cudaFree(scratch_);
  }

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  CommDevice device() const override { return CommDevice::kCuda; }
  std::string name() const override { return "nccl"; }
  absl::Duration timeout() const override { return options_.timeout; }
  int device_index() const override { return options_.device; }
  cudaStream_t comm_stream() const override { return comm_stream_; }

  void set_compute_stream(cudaStream_t stream) override {
    absl::MutexLock l(&mu_);
    compute_stream_ = stream;
  }
  cudaStream_t compute_stream() const override {
    absl::MutexLock l(&mu_);
    return compute_stream_;
  }

#if TRAINCTL_NCCL_TORCH_CUDA
  void UseCurrentTorchStream() override {
    set_compute_stream(torch_compat::CurrentCudaStream(options_.device));
  }
#endif

  std::shared_ptr<CollectiveWork> AllReduceSum(CommBuffer buffer) override {
    return Enqueue("allreduce", std::move(buffer), -1);
  }

  std::shared_ptr<CollectiveWork> Broadcast(CommBuffer buffer, int root) override {
    if (root < 0 || root >= options_.world_size) {
      return CompletedWork(absl::InvalidArgumentError(
          absl::StrCat("broadcast root ", root, " outside [0, ", options_.world_size, ")")));
    }
    return Enqueue("broadcast", std::move(buffer), root);
  }

  absl::Status Barrier() override {
    // A one-element all-reduce; Wait() blocks the host until every rank
    // contributed.
    CommBuffer b;
    b.data = scratch_;
    b.count = 1;
    b.type = CommDataType::kFloat32;
    b.device = CommDevice::kCuda;
    return Enqueue("barrier", std::move(b), -1)->Wait();
  }

  void Abort() override {
    absl::MutexLock l(&mu_);
    FailLocked(absl::AbortedError("nccl collectives aborted"));
  }

  // Polls `f` until done, an async NCCL error, Abort(), or the deadline.
  absl::Status WaitFor(const Inflight& f, const std::string& description, absl::Duration timeout) {
    const auto deadline = Clock::now() + absl::ToChronoNanoseconds(timeout);
    CudaDeviceGuard guard(options_.device);
    for (;;) {
      const cudaError_t e = cudaEventQuery(f.done);
      absl::ReleasableMutexLock l(&mu_);
      if (!broken_.ok()) return broken_;
      if (e == cudaSuccess) {
        // Later compute on the compute stream sees the result.
        return CudaStatus(cudaStreamWaitEvent(compute_stream_, f.done, 0),
                          "ordering the compute stream after " + description);
      }
      if (e != cudaErrorNotReady) {
        auto st = CudaStatus(e, description);
        FailLocked(st);
        return st;
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        auto st = NcclStatus(async, comm_, description + " failed (a peer may be gone)");
        FailLocked(st);
        return st;
      }
      if (Clock::now() >= deadline) {
        auto st = absl::DeadlineExceededError(
            absl::StrCat(description, " did not finish within ", absl::FormatDuration(timeout),
                         "; a peer rank is dead or stalled (communicator aborted)"));
        FailLocked(st);
        return st;
      }
      l.Release();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

 private:
  absl::Status Validate(const CommBuffer& b) const {
    if (b.device != CommDevice::kCuda) {
      return absl::InvalidArgumentError(
          "nccl collectives take CUDA buffers only (got a CPU buffer)");
    }
    if (b.count == 0) return absl::OkStatus();
    if (b.data == nullptr) return absl::InvalidArgumentError("nccl collective on a null buffer");
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, b.data) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error state
      return absl::InvalidArgumentError("nccl: buffer is not CUDA memory");
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
      return absl::InvalidArgumentError("nccl: buffer is not device memory");
    }
    if (attr.device != options_.device) {
      return absl::InvalidArgumentError(absl::StrCat("nccl: buffer is on device ", attr.device,
                                                     ", the communicator on ", options_.device));
    }
    return absl::OkStatus();
  }

  std::shared_ptr<CollectiveWork> Enqueue(const char* op, CommBuffer buffer, int root) {
    if (auto st = Validate(buffer); !st.ok()) return CompletedWork(st);
    auto type = NcclType(buffer.type);
    if (!type.ok()) return CompletedWork(type.status());
    CudaDeviceGuard guard(options_.device);
    absl::MutexLock l(&mu_);
    if (!broken_.ok()) return CompletedWork(broken_);
    if (buffer.count == 0) return CompletedWork(absl::OkStatus());
    PrunePendingLocked();
    const std::string desc = absl::StrCat("nccl ", op, " #", next_seq_++, " (", buffer.count, " x ",
                                          CommDataTypeName(buffer.type), ")");
    auto inflight = std::make_shared<Inflight>();
    absl::Status st = CudaStatus(cudaEventCreateWithFlags(&inflight->done, cudaEventDisableTiming),
                                 desc + ": creating its event");
    // The collective must see everything enqueued on the compute stream so far.
    if (st.ok()) {
      st = CudaStatus(cudaEventRecord(ready_event_, compute_stream_), desc + ": recording compute");
    }
    if (st.ok()) {
      st = CudaStatus(cudaStreamWaitEvent(comm_stream_, ready_event_, 0), desc + ": stream order");
    }
    if (st.ok()) {
      const ncclResult_t r = root < 0 ? ncclAllReduce(buffer.data, buffer.data, buffer.count, *type,
                                                      ncclSum, comm_, comm_stream_)
                                      : ncclBroadcast(buffer.data, buffer.data, buffer.count, *type,
                                                      root, comm_, comm_stream_);
      ncclResult_t state = r;
      if (r == ncclInProgress) {
        state = PollAsync(comm_, Clock::now() + absl::ToChronoNanoseconds(options_.timeout));
      }
      if (state == ncclInProgress) {
        st = absl::DeadlineExceededError(desc + ": enqueue did not complete within the timeout");
      } else {
        st = NcclStatus(state, comm_, desc);
      }
    }
    if (st.ok()) st = CudaStatus(cudaEventRecord(inflight->done, comm_stream_), desc + ": record");
    if (!st.ok()) {
      FailLocked(st);
      return CompletedWork(st);
    }
    inflight->keep_alive = std::move(buffer.keep_alive);
    pending_.push_back(inflight);
    return std::make_shared<NcclWork>(weak_from_this(), std::move(inflight), desc,
                                      options_.timeout);
  }

  // Releases the memory of collectives that finished.
  void PrunePendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!pending_.empty() && cudaEventQuery(pending_.front()->done) == cudaSuccess) {
      pending_.pop_front();
    }
  }

  void FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (broken_.ok()) broken_ = std::move(status);
    if (!aborted_) {
      aborted_ = true;
      CudaDeviceGuard guard(options_.device);
      ncclCommAbort(comm_);
    }
  }

  const NcclOptions options_;
  const ncclComm_t comm_;  // unusable once aborted_
  const cudaStream_t comm_stream_;
  const cudaEvent_t ready_event_;  // re-recorded on the compute stream per collective, under mu_
  void* const scratch_;            // one float of device memory for Barrier()

  mutable absl::Mutex mu_;
  cudaStream_t compute_stream_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);   // first error; every later call fails with it
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;  // ncclCommAbort was called
  std::deque<std::shared_ptr<Inflight>> pending_ ABSL_GUARDED_BY(mu_);  // issue order
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
};

absl::Status NcclWork::Wait(absl::Duration timeout) {
  if (result_.done()) return result_.status();
  absl::Status st;
  if (auto engine = engine_.lock()) {
    st = engine->WaitFor(*inflight_, description_, timeout);
  } else {
    st = absl::AbortedError(description_ + ": the nccl collectives were destroyed");
  }
  // Errors are final; success is cached too (the event cannot un-fire).
  result_.Finish(st);
  return result_.status();
}

}  // namespace

static_assert(sizeof(ncclUniqueId::internal) == kNcclUniqueIdBytes, "ncclUniqueId size changed");

absl::StatusOr<std::shared_ptr<NcclCollectives>> CreateNcclCollectives(const NcclOptions& options) {
  if (options.unique_id.size() != kNcclUniqueIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: unique_id must be ", kNcclUniqueIdBytes,
                                                   " bytes, got ", options.unique_id.size()));
  }
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: rank ", options.rank, " outside [0, ", options.world_size, ")"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("nccl: timeout must be positive");
  }
  int count = 0;
  if (auto st = CudaStatus(cudaGetDeviceCount(&count), "nccl: counting CUDA devices"); !st.ok()) {
    return st;
  }
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: CUDA device ", options.device,
                                                   " does not exist (", count, " visible)"));
  }
  CudaDeviceGuard guard(options.device);

  ncclUniqueId id;
  std::memcpy(id.internal, options.unique_id.data(), kNcclUniqueIdBytes);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init and collectives return at once; we poll with a deadline
  ncclComm_t comm = nullptr;
  const std::string what = absl::StrCat("nccl: init of rank ", options.rank, "/",
                                        options.world_size, " on device ", options.device);
  ncclResult_t r = ncclCommInitRankConfig(&comm, options.world_size, id, options.rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    return NcclStatus(r, nullptr, what);
  }
  r = PollAsync(comm, Clock::now() + absl::ToChronoNanoseconds(options.timeout));
  if (r != ncclSuccess) {
    absl::Status st = r == ncclInProgress
                          ? absl::DeadlineExceededError(absl::StrCat(
                                what, " did not complete within ",
                                absl::FormatDuration(options.timeout), "; not every rank joined"))
                          : NcclStatus(r, comm, what);
    ncclCommAbort(comm);
    return st;
  }

  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;
  void* scratch = nullptr;
  int lowest = 0, greatest = 0;
  absl::Status st = CudaStatus(cudaDeviceGetStreamPriorityRange(&lowest, &greatest), what);
  if (st.ok()) {
    st = CudaStatus(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest),
                    what + ": creating the communication stream");
  }
  if (st.ok()) st = CudaStatus(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), what);
  if (st.ok()) st = CudaStatus(cudaMalloc(&scratch, sizeof(float)), what);
  if (!st.ok()) {
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (ready != nullptr) cudaEventDestroy(ready);
    ncclCommAbort(comm);
    return st;
  }
  return std::shared_ptr<NcclCollectives>(
      std::make_shared<NcclEngine>(options, comm, stream, ready, scratch));
}

}  // namespace trainctl::dist
