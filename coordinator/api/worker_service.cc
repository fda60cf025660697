// WorkerService: one bidi Session stream per worker daemon and ListWorkers.
//
// A Session is two halves: SessionReactor (here) is gRPC's plumbing (the
// read loop, the outgoing queue, finishing) and WorkerSession
// (worker_session.h) the protocol (registration, heartbeats, sequenced
// reports handed to the managers).
//
// Threading: a SessionReactor reads on gRPC threads and posts every message
// to the loop, where its WorkerSession lives; its outgoing queue is guarded
// by its mutex, since the loop sends and gRPC completes writes.
#include <atomic>
#include <deque>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "coordinator/api/service_support.h"
#include "coordinator/api/services.h"
#include "coordinator/api/telemetry_batcher.h"
#include "coordinator/api/worker_session.h"

namespace trainctl::coordinator {

namespace {

// A Session refused before it began (bad token or role).
class RefusedSession final
    : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
 public:
  explicit RefusedSession(const absl::Status& why) { Finish(ToGrpcStatus(why)); }
  void OnDone() override { delete this; }
};

// One worker daemon's Session stream: gRPC's side of it (one read in
// flight, the outgoing queue, finishing). Every message read goes to the
// loop, where its WorkerSession (the protocol) handles it.
class SessionReactor final
    : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>,
      public SessionTransport {
 public:
  SessionReactor(ServiceContext ctx, std::string peer, WorkerCaller caller)
      : loop_(ctx.loop), session_(ctx, this, std::move(peer), std::move(caller)) {
    // Posted before any read completes, so it runs before every Handle and
    // before OnDone's closure (which untracks).
    loop_->Post([this] {
      AssertOnLoop(loop_, "a worker session");
      session_.Open();
    });
    reads_.Mark();
    StartRead(&in_);
  }

  // SessionTransport (called on the loop).
  bool Send(const v1::CoordinatorMessage& msg) override {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    out_.push_back(msg);
    MaybeWriteLocked();
    return true;
  }
  void Close(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    CloseLocked(ToGrpcStatus(status));
  }
  bool Unhandled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) override {
    return read_.load(std::memory_order_relaxed) > handled_;
  }

  void OnReadDone(bool ok) override {
    reads_.Mark();
    if (!ok) {
      // The worker closed its side, the stream broke, or a message did not
      // parse. Messages read before the end may still wait for the loop:
      // their verdict comes first (WorkerSession::ReadsEnded).
      loop_->Post([this] {
        AssertOnLoop(loop_, "a worker session");
        session_.ReadsEnded();
      });
      return;
    }
    v1::WorkerMessage msg = std::move(in_);
    in_.Clear();
    read_.fetch_add(1, std::memory_order_relaxed);
    loop_->Post([this, msg = std::move(msg)] {
      AssertOnLoop(loop_, "a worker session");
      ++handled_;
      session_.Handle(msg);
    });
    reads_.Mark();
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      // The stream is broken: nothing queued can go out. Finish even when a
      // Close came first (the read side ended while this write was in
      // flight), or OnDone never runs and the reactor and server shutdown
      // wait forever.
      out_.clear();
      if (!closed_) {
        closed_ = true;
        final_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed");
      }
      if (!finished_) {
        finished_ = true;
        Finish(final_);
      }
      return;
    }
    MaybeWriteLocked();
  }

  void OnCancel() override {
    loop_->Post([this] {
      AssertOnLoop(loop_, "a worker session");
      session_.Cancelled();
    });
  }

  void OnDone() override {
    // gRPC calls OnDone after every other reaction returned, but tells that
    // to the thread it runs OnDone on through its own (uninstrumented)
    // queues; taking mu_ here makes the order explicit: the last reaction
    // released mu_ before this, so the delete below follows it (ThreadSanitizer).
    { absl::MutexLock lock(&mu_); }
    loop_->Post([this] {
      AssertOnLoop(loop_, "a worker session");
      session_.Done();
      delete this;
    });
  }

 private:
  void MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_ || out_.empty()) {
      if (!writing_ && closed_ && !finished_ && out_.empty()) {
        finished_ = true;
        Finish(final_);
      }
      return;
    }
    current_ = std::move(out_.front());
    out_.pop_front();
    writing_ = true;
    StartWrite(&current_);
  }

  void CloseLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (closed_) return;
    closed_ = true;
    final_ = std::move(status);
    MaybeWriteLocked();
  }

  EventLoop* const loop_;
  v1::WorkerMessage in_;  // gRPC thread (one read in flight).
  ReadOrder reads_;
  // Messages read off the stream (gRPC thread) and handed to the session
  // (loop only): more read than handled means some wait for the loop.
  std::atomic<int64_t> read_{0};
  int64_t handled_ ABSL_GUARDED_BY(kLoop) = 0;

  absl::Mutex mu_;
  std::deque<v1::CoordinatorMessage> out_ ABSL_GUARDED_BY(mu_);
  v1::CoordinatorMessage current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_ ABSL_GUARDED_BY(mu_);

  // The protocol; loop only (constructed here, then touched only by the
  // closures above).
  WorkerSession session_;
};

}  // namespace

// --- WorkerService ------------------------------------------------------------------

WorkerServiceImpl::WorkerServiceImpl(ServiceContext ctx)
    : batcher_(std::make_unique<TelemetryBatcher>(ctx)), ctx_(ctx) {
  ctx_.batcher = batcher_.get();
}

WorkerServiceImpl::~WorkerServiceImpl() = default;

grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* WorkerServiceImpl::Session(
    grpc::CallbackServerContext* ctx) {
  absl::StatusOr<WorkerCaller> caller = WorkerCallerOf(ctx_, ctx, "Session");
  if (!caller.ok()) return new RefusedSession(caller.status());
  return new SessionReactor(ctx_, ctx->peer(), *std::move(caller));
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ListWorkers(grpc::CallbackServerContext* ctx,
                                                         const v1::ListWorkersRequest* req,
                                                         v1::ListWorkersResponse* resp) {
  return UnaryOnLoop(ctx_, ctx, "ListWorkers",
                     [this, req, resp](const Principal&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
                       for (v1::Worker& w : ctx_.registry->List(req->include_gone())) {
                         for (int s : ctx_.queries->BusySlots(w.id())) w.add_busy_slots(s);
                         *resp->add_workers() = std::move(w);
                       }
                       FillStoreHealth(ctx_.store, resp->mutable_store());
                       return absl::OkStatus();
                     });
}

}  // namespace trainctl::coordinator
