#include "worker/dist/gloo_collectives.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "worker/dist/gloo_small_allreduce.h"
#include "worker/dist/gloo_store_adapter.h"
#include "worker/dist/shm_allreduce.h"
#include "worker/dist/work_status.h"

namespace trainctl::dist {
namespace {

std::chrono::milliseconds ToMillis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with the C++ type of `type`.
template <typename F>
void DispatchCommType(CommDataType type, F&& f) {
  switch (type) {
    case CommDataType::kFloat32:
      return f(TypeTag<float>{});
    case CommDataType::kFloat64:
      return f(TypeTag<double>{});
    case CommDataType::kFloat16:
      return f(TypeTag<c10::Half>{});
    case CommDataType::kBFloat16:
      return f(TypeTag<c10::BFloat16>{});
    case CommDataType::kInt32:
      return f(TypeTag<int32_t>{});
    case CommDataType::kInt64:
      return f(TypeTag<int64_t>{});
    case CommDataType::kUInt8:
      return f(TypeTag<uint8_t>{});
  }
}

// Element-wise c = a + b; Gloo may pass c == a.
template <typename T>
void SumInto(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<T*>(c);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(x[i] + y[i]);
}

enum class OpKind { kAllReduce, kBroadcast, kBarrier };

const char* OpName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllReduce:
      return "allreduce";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kBarrier:
      return "barrier";
  }
  return "?";
}

class GlooCore;

// Completion state of one collective. Finish() is first-wins: a Wait() that
// timed out finishes the work with DeadlineExceeded while Gloo may still hold
// the (kept-alive) buffer.
class GlooWork final : public CollectiveWork {
 public:
  GlooWork(std::weak_ptr<GlooCore> engine, std::string description, absl::Duration timeout)
      : engine_(std::move(engine)), description_(std::move(description)), timeout_(timeout) {}

  void Finish(absl::Status status) { result_.Finish(std::move(status)); }

  absl::Status Wait(absl::Duration timeout) override;
  // Gloo enforces the engine timeout on the operation itself and reports the
  // more precise error; the grace lets that error arrive first. Runs the work
  // on the calling thread first when the engine thread has not taken it yet
  // (GlooCore::Help).
  absl::Status Wait() override;

  bool IsCompleted() override { return result_.done(); }

  std::optional<WorkTimes> times() override {
    absl::MutexLock l(&times_mu_);
    return times_;
  }
  // Set by the engine's thread before it finishes the work.
  void SetTimes(WorkTimes t) {
    absl::MutexLock l(&times_mu_);
    times_ = t;
  }

  const std::string& description() const { return description_; }

 private:
  const std::weak_ptr<GlooCore> engine_;
  const std::string description_;
  const absl::Duration timeout_;
  WorkStatus result_;
  absl::Mutex times_mu_;
  std::optional<WorkTimes> times_ ABSL_GUARDED_BY(times_mu_);
};

struct Op {
  OpKind kind;
  CommBuffer buffer;  // holds keep_alive until the op left Gloo
  int root = 0;
  uint32_t tag = 0;
  std::shared_ptr<GlooWork> work;
};

// Everything the worker thread touches. Shared between the engine and its
// worker thread, so that an engine destroyed while Gloo still blocks inside a
// collective (Gloo cannot interrupt a pending receive) can let the thread
// finish on its own when Gloo's timeout fires.
class GlooCore final : public std::enable_shared_from_this<GlooCore> {
 public:
  GlooCore(const GlooOptions& options, std::shared_ptr<RendezvousStore> store,
           std::shared_ptr<gloo::Context> context, std::unique_ptr<SmallAllReducer> small,
           std::unique_ptr<ShmAllReduce> shm)
      : options_(options),
        store_(std::move(store)),
        context_(std::move(context)),
        small_(std::move(small)),
        shm_(std::move(shm)) {}

  void Start() {
    worker_ = std::thread([self = shared_from_this()] { self->Run(); });
  }

  // Fails everything and stops the worker thread: joins it when idle,
  // detaches it when a collective is still inside Gloo (it then ends within
  // the timeout, holding this core alive until then).
  void Shutdown() {
    Fail(absl::AbortedError("gloo collectives destroyed"));
    bool busy;
    {
      absl::MutexLock l(&mu_);
      stopping_ = true;
      busy = in_flight_ != nullptr;
    }
    if (!worker_.joinable()) return;
    if (busy) {
      worker_.detach();
    } else {
      worker_.join();
    }
  }

  const GlooOptions& options() const { return options_; }
  bool uses_shm() const { return shm_ != nullptr; }
  void RecordWorkTimes() { record_times_.store(true, std::memory_order_relaxed); }

  absl::StatusOr<std::shared_ptr<void>> AllocateShared(size_t bytes) {
    if (shm_ == nullptr || bytes == 0) return std::shared_ptr<void>();
    const uint64_t n = shared_blocks_.fetch_add(1, std::memory_order_relaxed);
    return shm_->NewSharedBlock(bytes, *store_,
                                absl::StrCat(options_.key_prefix, "shm/block/", n, "/"));
  }

  std::shared_ptr<CollectiveWork> AllReduceSum(CommBuffer buffer) {
    return Enqueue(OpKind::kAllReduce, std::move(buffer), 0);
  }

  std::shared_ptr<CollectiveWork> Broadcast(CommBuffer buffer, int root) {
    if (root < 0 || root >= options_.world_size) {
      return CompletedWork(absl::InvalidArgumentError(
          absl::StrCat("broadcast root ", root, " outside [0, ", options_.world_size, ")")));
    }
    return Enqueue(OpKind::kBroadcast, std::move(buffer), root);
  }

  absl::Status Barrier() { return Enqueue(OpKind::kBarrier, CommBuffer{}, 0)->Wait(); }

  // Breaks the engine with `status`: queued ops and the one inside Gloo fail
  // with it (the latter's buffer stays owned by the op until Gloo lets go),
  // later ones too, and the peer connections are closed so that the peers
  // fail fast instead of waiting for their timeout.
  void Fail(absl::Status status) {
    std::deque<Op> dropped;
    std::shared_ptr<GlooWork> in_flight;
    bool close_pairs = false;
    {
      absl::MutexLock l(&mu_);
      if (broken_.ok()) broken_ = status;
      dropped.swap(queue_);
      in_flight = in_flight_;
      if (!pairs_closed_) close_pairs = pairs_closed_ = true;
    }
    for (auto& op : dropped) op.work->Finish(status);
    if (in_flight) in_flight->Finish(status);
    if (close_pairs) {
      ClosePairs();
      if (shm_) shm_->Break();  // Wakes this rank's engine thread and the peers'.
    }
  }

 private:
  absl::Status Validate(OpKind kind, const CommBuffer& b) const {
    if (kind == OpKind::kBarrier) return absl::OkStatus();
    if (b.device != CommDevice::kCpu) {
      return absl::InvalidArgumentError(
          "gloo collectives take CPU buffers only (got a CUDA buffer)");
    }
    if (b.data == nullptr && b.count > 0) {
      return absl::InvalidArgumentError("gloo collective on a null buffer");
    }
    return absl::OkStatus();
  }

  std::shared_ptr<CollectiveWork> Enqueue(OpKind kind, CommBuffer buffer, int root) {
    if (auto st = Validate(kind, buffer); !st.ok()) return CompletedWork(st);
    absl::MutexLock l(&mu_);
    if (!broken_.ok()) return CompletedWork(broken_);
    const uint64_t seq = next_seq_++;
    std::string desc = absl::StrCat("gloo ", OpName(kind), " #", seq);
    if (kind != OpKind::kBarrier) {
      absl::StrAppend(&desc, " (", buffer.count, " x ", CommDataTypeName(buffer.type), ")");
    }
    auto work = std::make_shared<GlooWork>(weak_from_this(), std::move(desc), options_.timeout);
    if (kind != OpKind::kBarrier && buffer.count == 0) {
      work->Finish(absl::OkStatus());
      return work;
    }
    Op op;
    op.kind = kind;
    op.buffer = std::move(buffer);
    op.root = root;
    // Every rank issues the same sequence, so the sequence number is a tag
    // all ranks agree on.
    op.tag = static_cast<uint32_t>(seq);
    op.work = work;
    queue_.push_back(std::move(op));
    return work;
  }

 public:
  // A thread about to wait for `work` runs the queued ops up to and including
  // it itself, in issue order, while no other thread runs one; it returns when
  // `work` has run, is not queued (done, or taken by the engine thread), or
  // another thread runs an op. A tiny model's step issues its one all-reduce
  // and waits for it at once: handing it to the engine thread and being
  // handed the result back cost two thread wake-ups (~80 us in all on a 2-core
  // VM, bench/ddp/allreduce_latency's engine_shm mode), more than the
  // all-reduce itself. One op runs at a time whoever runs it (in_flight_), so
  // every rank still runs its collectives in issue order. Only shared-memory
  // ops are run so: Abort() releases a thread inside one at once, while a
  // thread inside a Gloo TCP receive stays until Gloo's timeout (the waiter
  // must return when the engine is aborted, as it does from a Wait).
  void Help(const GlooWork* work) {
    for (;;) {
      Op op;
      {
        absl::MutexLock l(&mu_);
        if (stopping_ || in_flight_ != nullptr || queue_.empty() || !TakesShmPath(queue_.front())) {
          return;
        }
        const auto mine = std::find_if(queue_.begin(), queue_.end(),
                                       [work](const Op& o) { return o.work.get() == work; });
        if (mine == queue_.end()) return;
        op = std::move(queue_.front());
        queue_.pop_front();
        in_flight_ = op.work;
      }
      const bool done = op.work.get() == work;
      RunInFlight(op);
      if (done) return;
    }
  }

 private:
  void Run() {
    for (;;) {
      Op op;
      {
        absl::MutexLock l(&mu_);
        mu_.Await(absl::Condition(
            +[](GlooCore* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) {
              return e->stopping_ || (!e->queue_.empty() && e->in_flight_ == nullptr);
            },
            this));
        if (queue_.empty() || in_flight_ != nullptr) return;  // stopping
        op = std::move(queue_.front());
        queue_.pop_front();
        in_flight_ = op.work;
      }
      RunInFlight(op);
    }
  }

  // Runs `op`, which this thread made in_flight_, and finishes its work
  // (with when it ran, after RecordWorkTimes()).
  void RunInFlight(Op& op) {
    const bool timed = record_times_.load(std::memory_order_relaxed);
    WorkTimes times;
    if (timed) times.started = std::chrono::steady_clock::now();
    absl::Status status = Execute(op);
    if (timed) {
      times.finished = std::chrono::steady_clock::now();
      op.work->SetTimes(times);
    }
    {
      absl::MutexLock l(&mu_);
      in_flight_ = nullptr;
    }
    if (!status.ok()) Fail(status);
    op.work->Finish(status);
    // The caller releases op (and with it the buffer's keep_alive) after
    // this, when Gloo has let go of the memory.
  }

  bool TakesSmallPath(const Op& op) const {
    return small_ != nullptr && op.kind == OpKind::kAllReduce && small_->Takes(op.buffer);
  }

  // Whether `op` goes through shared memory, where Fail() can release the
  // thread running it at once (ShmAllReduce::Break); Gloo's TCP receives
  // let go only at their timeout.
  bool TakesShmPath(const Op& op) const {
    return shm_ != nullptr && op.kind == OpKind::kAllReduce &&
           ShmAllReduce::Supports(op.buffer.type);
  }

  absl::Status Execute(const Op& op) {
    const auto timeout = ToMillis(options_.timeout);
    if (TakesShmPath(op)) {
      absl::Status st = shm_->AllReduceSum(op.buffer.data, op.buffer.count, op.buffer.type,
                                           MonotonicNow() + options_.timeout);
      if (st.ok()) return st;
      return absl::Status(st.code(), absl::StrCat(op.work->description(), " on rank ",
                                                  options_.rank, " failed: ", st.message()));
    }
    try {
      if (TakesSmallPath(op)) {
        small_->AllReduceSum(op.buffer);
        return absl::OkStatus();
      }
      switch (op.kind) {
        case OpKind::kAllReduce:
          DispatchCommType(op.buffer.type, [&](auto tag) {
            using T = typename decltype(tag)::type;
            gloo::AllreduceOptions opts(context_);
            // The ring, named rather than left to Gloo's default: a
            // reduce-scatter in which one rank finishes each chunk's sum,
            // then an all-gather that copies those bytes to every rank, so
            // every rank ends with the same bytes (in ring order per chunk,
            // not rank order; docs/ddp.md).
            opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
            opts.setOutput<T>(static_cast<T*>(op.buffer.data), op.buffer.count);
            opts.setReduceFunction(&SumInto<T>);
            opts.setTag(op.tag);
            opts.setTimeout(timeout);
            gloo::allreduce(opts);
          });
          break;
        case OpKind::kBroadcast:
          DispatchCommType(op.buffer.type, [&](auto tag) {
            using T = typename decltype(tag)::type;
            gloo::BroadcastOptions opts(context_);
            opts.setOutput<T>(static_cast<T*>(op.buffer.data), op.buffer.count);
            opts.setRoot(op.root);
            opts.setTag(op.tag);
            opts.setTimeout(timeout);
            gloo::broadcast(opts);
          });
          break;
        case OpKind::kBarrier: {
          gloo::BarrierOptions opts(context_);
          opts.setTag(op.tag);
          opts.setTimeout(timeout);
          gloo::barrier(opts);
          break;
        }
      }
    } catch (const std::exception& e) {
      return StatusFromCommException(
          e, absl::StrCat(op.work->description(), " on rank ", options_.rank, " failed"));
    }
    return absl::OkStatus();
  }

  void ClosePairs() {
    for (int i = 0; i < options_.world_size; ++i) {
      if (i == options_.rank) continue;
      try {
        auto& pair = context_->getPair(i);
        if (pair) pair->close();
      } catch (const std::exception&) {
        // Already broken; nothing more to tear down.
      }
    }
  }

  const GlooOptions options_;
  // Keeps rank 0's store server up for the engine's lifetime (late peers may
  // still be reading addresses from it).
  const std::shared_ptr<RendezvousStore> store_;
  const std::shared_ptr<gloo::Context> context_;
  // The small-message path over its own mesh (sync pairs); null when off.
  // Only the thread running an op (in_flight_) touches it.
  const std::unique_ptr<SmallAllReducer> small_;
  // Shared-memory all-reduce when every rank is on this host; null otherwise.
  const std::unique_ptr<ShmAllReduce> shm_;
  std::atomic<uint64_t> shared_blocks_{0};  // AllocateShared calls, for their store keys
  std::thread worker_;
  // RecordWorkTimes(): the worker thread stamps each op's start and end.
  std::atomic<bool> record_times_{false};

  absl::Mutex mu_;
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  // First error; once set, every collective fails with it.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<GlooWork> in_flight_ ABSL_GUARDED_BY(mu_);  // the op inside Gloo
  bool pairs_closed_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
};

class GlooCollectives final : public Collectives {
 public:
  explicit GlooCollectives(std::shared_ptr<GlooCore> core) : core_(std::move(core)) {}
  ~GlooCollectives() override { core_->Shutdown(); }

  int rank() const override { return core_->options().rank; }
  int world_size() const override { return core_->options().world_size; }
  CommDevice device() const override { return CommDevice::kCpu; }
  // "gloo+shm" when all-reduces go through shared memory.
  std::string name() const override { return core_->uses_shm() ? "gloo+shm" : "gloo"; }
  absl::Duration timeout() const override { return core_->options().timeout; }
  std::shared_ptr<CollectiveWork> AllReduceSum(CommBuffer buffer) override {
    return core_->AllReduceSum(std::move(buffer));
  }
  std::shared_ptr<CollectiveWork> Broadcast(CommBuffer buffer, int root) override {
    return core_->Broadcast(std::move(buffer), root);
  }
  absl::Status Barrier() override { return core_->Barrier(); }
  void Abort() override { core_->Fail(absl::AbortedError("gloo collectives aborted")); }
  void RecordWorkTimes() override { core_->RecordWorkTimes(); }
  absl::StatusOr<std::shared_ptr<void>> AllocateShared(size_t bytes) override {
    return core_->AllocateShared(bytes);
  }

 private:
  const std::shared_ptr<GlooCore> core_;
};

absl::Status GlooWork::Wait() {
  if (!result_.done()) {
    if (auto engine = engine_.lock()) engine->Help(this);
  }
  return Wait(timeout_ + absl::Seconds(2));
}

absl::Status GlooWork::Wait(absl::Duration timeout) {
  if (std::optional<absl::Status> done = result_.Await(timeout)) return *done;
  auto status = absl::DeadlineExceededError(absl::StrCat(description_, " did not finish within ",
                                                         absl::FormatDuration(timeout),
                                                         "; a peer rank is dead or stalled"));
  Finish(status);
  if (auto engine = engine_.lock()) engine->Fail(status);
  return result_.status();
}

}  // namespace

absl::StatusOr<std::shared_ptr<gloo::Context>> ConnectGlooContext(const GlooOptions& options,
                                                                  RendezvousStore& store,
                                                                  bool sync_pairs, bool busy_poll) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: world_size must be >= 1, got ", options.world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: rank ", options.rank, " outside [0, ", options.world_size, ")"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("gloo: timeout must be positive");
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.bind_host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
    ctx->setTimeout(ToMillis(options.timeout));
    GlooStoreAdapter adapter(store, options.key_prefix, options.timeout);
    ctx->connectFullMesh(adapter, device);
    if (sync_pairs) {
      for (int i = 0; i < options.world_size; ++i) {
        if (i != options.rank) ctx->getPair(i)->setSync(true, busy_poll);
      }
    }
    return std::shared_ptr<gloo::Context>(std::move(ctx));
  } catch (const std::exception& e) {
    return StatusFromCommException(
        e, absl::StrCat("gloo rendezvous of rank ", options.rank, "/", options.world_size,
                        " through store ", store.address()));
  }
}

absl::StatusOr<std::shared_ptr<Collectives>> CreateGlooCollectives(
    const GlooOptions& options, std::shared_ptr<RendezvousStore> store) {
  if (store == nullptr) return absl::InvalidArgumentError("gloo: no rendezvous store");
  TRAINCTL_ASSIGN_OR_RETURN(std::shared_ptr<gloo::Context> context,
                            ConnectGlooContext(options, *store));
  std::unique_ptr<ShmAllReduce> shm;
  if (options.all_ranks_local && options.world_size > 1) {
    absl::StatusOr<std::unique_ptr<ShmAllReduce>> s =
        ShmAllReduce::Create(options.rank, options.world_size, options.shm_slot_bytes, *store,
                             options.key_prefix + "shm/");
    // Unavailable: no usable shared memory on some rank; every rank then
    // agrees to use Gloo alone. Anything else is a store failure.
    if (s.ok()) {
      shm = std::move(*s);
    } else if (s.status().code() != absl::StatusCode::kUnavailable) {
      return s.status();
    }
  }
  // The small-message mesh serves only when shared memory does not (every
  // rank took the same decision above, so every rank connects it or none).
  std::unique_ptr<SmallAllReducer> small;
  if (shm == nullptr && options.small_allreduce_max_bytes > 0 && options.world_size > 1 &&
      options.world_size <= 8) {
    GlooOptions small_options = options;
    small_options.key_prefix += "small/";
    std::shared_ptr<gloo::Context> sync_context;
    TRAINCTL_ASSIGN_OR_RETURN(sync_context,
                              ConnectGlooContext(small_options, *store, /*sync_pairs=*/true));
    small = std::make_unique<SmallAllReducer>(std::move(sync_context), options.world_size,
                                              options.small_allreduce_max_bytes);
  }
  auto core = std::make_shared<GlooCore>(options, std::move(store), std::move(context),
                                         std::move(small), std::move(shm));
  core->Start();
  return std::shared_ptr<Collectives>(std::make_shared<GlooCollectives>(std::move(core)));
}

}  // namespace trainctl::dist
