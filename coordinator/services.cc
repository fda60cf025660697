#include "coordinator/services.h"

#include <algorithm>
#include <grpc/grpc_security_constants.h>

#include <zlib.h>

#include <deque>
#include <iostream>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "absl/synchronization/mutex.h"

namespace trainctl::coordinator {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

namespace {

constexpr auto kAdmin = v1::ROLE_ADMIN;
constexpr auto kSubmitter = v1::ROLE_SUBMITTER;
constexpr auto kViewer = v1::ROLE_VIEWER;
constexpr auto kWorker = v1::ROLE_WORKER;

// The caller of `call`, when its token is valid and has one of `roles`;
// else Unauthenticated / PermissionDenied to finish the call with.
absl::StatusOr<Principal> Caller(const ServiceContext& c, grpc::CallbackServerContext* ctx,
                                 absl::string_view call, std::initializer_list<v1::Role> roles) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  absl::string_view header;
  if (it != md.end()) header = absl::string_view(it->second.data(), it->second.size());
  absl::StatusOr<Principal> who = c.auth->Authenticate(header);
  if (!who.ok()) {
    return absl::Status(who.status().code(), absl::StrCat(call, ": ", who.status().message()));
  }
  absl::Status allowed = TokenAuthority::Authorize(*who, call, roles);
  if (!allowed.ok()) return allowed;
  return who;
}

// A submitter acts only on its own jobs; admins on every job.
absl::Status MayActOnJob(const Principal& who, absl::string_view call, const v1::Job& job) {
  if (who.role == v1::ROLE_ADMIN || job.owner_token_id() == who.token_id) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      call, ": job '", job.id(), "' belongs to '", job.owner().empty() ? "nobody" : job.owner(),
      "'; a submitter acts only on its own jobs (role admin acts on every job)"));
}

// The IP address of a gRPC peer ("ipv4:10.0.0.5:4242", "ipv6:[::1]:4242",
// "ipv6:%5B::1%5D:4242"); "" for anything else.
std::string PeerIp(absl::string_view peer) {
  std::string p(peer);
  for (auto [from, to] : {std::pair<const char*, const char*>{"%5B", "["}, {"%5D", "]"}}) {
    for (size_t at; (at = p.find(from)) != std::string::npos;) p.replace(at, 3, to);
  }
  absl::string_view v = p;
  if (absl::ConsumePrefix(&v, "ipv4:")) return std::string(v.substr(0, v.rfind(':')));
  if (absl::ConsumePrefix(&v, "ipv6:") && absl::ConsumePrefix(&v, "[")) {
    absl::string_view ip = v.substr(0, v.find(']'));
    absl::ConsumePrefix(&ip, "::ffff:");  // an IPv4 client on a dual-stack socket
    return std::string(ip);
  }
  return "";
}

// The host of "host:port", "[v6]:port" or a bare host.
std::string HostOf(absl::string_view address) {
  if (absl::ConsumePrefix(&address, "[")) return std::string(address.substr(0, address.find(']')));
  size_t colon = address.rfind(':');
  if (colon != absl::string_view::npos && address.find(':') == colon) address = address.substr(0, colon);
  return std::string(address);
}

// OK when every host a rendezvous report names (the store's address, and
// MASTER_ADDR) is one of `own`; else PermissionDenied naming the host. A
// worker that could name any host could send the other ranks of a job to a
// machine of its choosing.
absl::Status CheckRendezvousHosts(const v1::RendezvousInfo& info, const std::vector<std::string>& own) {
  std::vector<std::pair<const char*, std::string>> named;
  if (info.kind_case() == v1::RendezvousInfo::kGlooStoreAddress) {
    named.emplace_back("gloo_store_address", HostOf(info.gloo_store_address()));
  }
  if (!info.master_addr().empty()) named.emplace_back("master_addr", HostOf(info.master_addr()));
  for (const auto& entry : named) {
    // (Not a structured binding: C++17 lambdas cannot capture one.)
    const char* field = entry.first;
    const std::string& host = entry.second;
    bool mine = std::any_of(own.begin(), own.end(), [&](const std::string& o) {
      return absl::EqualsIgnoreCase(o, host);
    });
    if (!mine) {
      return absl::PermissionDeniedError(absl::StrCat(
          "rendezvous.info.", field, ": host '", host, "' is not this worker's address (",
          absl::StrJoin(own, ", "), "); a worker reports only its own address"));
    }
  }
  return absl::OkStatus();
}

// A Session refused before it began (bad token or role).
class RefusedSession final
    : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
 public:
  explicit RefusedSession(const absl::Status& why) { Finish(ToGrpcStatus(why)); }
  void OnDone() override { delete this; }
};

// A server-streaming reactor with a bounded queue: Push() never blocks; when
// the queue is full the oldest item is dropped and counted.
template <typename T>
class QueuedWriter : public grpc::ServerWriteReactor<T> {
 public:
  explicit QueuedWriter(size_t max_queued) : max_queued_(max_queued) {}

  // Queues an item; returns the number dropped so far.
  void Push(T item) {
    absl::MutexLock lock(&mu_);
    if (done_writing_) return;
    if (queue_.size() >= max_queued_) {
      queue_.pop_front();
      ++skipped_;
      OnSkipped(skipped_);
    }
    queue_.push_back(std::move(item));
    MaybeWriteLocked();
  }

  // Sends what is queued, then finishes with `status`.
  void FinishAfterQueue(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    if (done_writing_) return;
    done_writing_ = true;
    final_status_ = std::move(status);
    MaybeWriteLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      done_writing_ = true;
      queue_.clear();
      if (!finished_) {
        finished_ = true;
        this->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed"));
      }
      return;
    }
    MaybeWriteLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    done_writing_ = true;
    queue_.clear();
    if (!finished_ && !writing_) {
      finished_ = true;
      this->Finish(grpc::Status::CANCELLED);
    }
  }

 protected:
  // Called (under the lock) when items were dropped; may annotate the next one.
  virtual void OnSkipped(int64_t total) {}
  T* Back() {
    mu_.AssertHeld();  // only from OnSkipped, under the lock
    return queue_.empty() ? nullptr : &queue_.back();
  }

 private:
  void MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      this->StartWrite(&current_);
      return;
    }
    if (done_writing_) {
      finished_ = true;
      this->Finish(final_status_);
    }
  }

  const size_t max_queued_;
  absl::Mutex mu_;
  std::deque<T> queue_ ABSL_GUARDED_BY(mu_);
  T current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);

 protected:
  int64_t skipped_ ABSL_GUARDED_BY(mu_) = 0;
};

class WatchReactor final : public QueuedWriter<v1::JobUpdate>, public JobSubscriber {
 public:
  WatchReactor(ServiceContext ctx, std::string job_id)
      : QueuedWriter(ctx.max_queued_updates), ctx_(ctx), job_id_(std::move(job_id)) {}

  void Offer(const v1::JobUpdate& u) override {
    v1::JobUpdate copy = u;
    Push(std::move(copy));
  }
  void JobEnded() override {
    subscribed_ = false;
    FinishAfterQueue(grpc::Status::OK);
  }
  void set_subscribed() { subscribed_ = true; }

  void OnDone() override {
    // Unsubscribe on the loop (where Offer is called), then free.
    ctx_.loop->Post([this] {
      if (subscribed_) ctx_.hub->Unsubscribe(job_id_, this);
      delete this;
    });
  }

 protected:
  void OnSkipped(int64_t total) override {
    if (v1::JobUpdate* last = Back()) last->set_skipped(total);
  }

 private:
  ServiceContext ctx_;
  std::string job_id_;
  bool subscribed_ = false;  // Loop only.
};

class LogsReactor final : public QueuedWriter<v1::LogChunk>, public LogSubscriber {
 public:
  LogsReactor(ServiceContext ctx, v1::GetLogsRequest req)
      : QueuedWriter(ctx.max_queued_updates), ctx_(ctx), req_(std::move(req)) {}

  void Offer(const v1::LogChunk& c) override {
    // Following the latest attempt (attempt 0 asked): move on to a restart's
    // new attempt; lines of older attempts that arrive late stay out.
    if (req_.attempt() == 0 && c.attempt() > attempt_) attempt_ = c.attempt();
    if (c.attempt() != attempt_) return;
    if (req_.has_rank() && c.rank() != req_.rank()) return;
    Push(c);
  }
  void JobEnded() override {
    subscribed_ = false;
    FinishAfterQueue(grpc::Status::OK);
  }
  void Start(int32_t attempt, bool subscribe) {
    attempt_ = attempt;
    subscribed_ = subscribe;
  }
  void OnDone() override {
    ctx_.loop->Post([this] {
      if (subscribed_) ctx_.hub->UnsubscribeLogs(req_.job_id(), this);
      delete this;
    });
  }

 private:
  ServiceContext ctx_;
  v1::GetLogsRequest req_;
  int32_t attempt_ = 0;
  bool subscribed_ = false;
};

// What a session must hear once its queued telemetry is applied or not.
class TelemetrySession {
 public:
  virtual ~TelemetrySession() = default;
  // Committed: acknowledge the worker's applied seq.
  virtual void TelemetryApplied() = 0;
  // Not applied (a store failure): end the session so the worker resends.
  virtual void TelemetryNotApplied(int64_t seq, const absl::Status& why) = 0;
};

}  // namespace

// Group commit of sequenced metric and log messages. Applying each in its
// own transaction costs one fsync per message on the loop thread, and at a
// thousand ranks the loop spends its time waiting on the disk (heartbeats
// answered seconds late). Instead a session queues them here; one drain
// closure applies every queued message, of every worker, in one store group
// (TelemetryLedger::ApplyBatch) and acknowledges each session after the one
// commit. Acknowledgement still follows durability. Whatever else a session
// handles (any other report, registration, its end) drains first, so each
// worker's messages are applied in the order it sent them.
//
// Loop only.
class TelemetryBatcher {
 public:
  explicit TelemetryBatcher(ServiceContext ctx) : ctx_(ctx) {}

  void Queue(TelemetrySession* session, const std::string& worker_id, v1::WorkerMessage msg) {
    queue_.push_back({session, worker_id, std::move(msg)});
    if (!drain_posted_) {
      drain_posted_ = true;
      ctx_.loop->Post([this] { Drain(); });
    }
  }

  void Drain() {
    drain_posted_ = false;
    if (queue_.empty()) return;
    std::vector<Queued> queued = std::move(queue_);
    queue_.clear();
    std::vector<TelemetryLedger::Item> items;
    items.reserve(queued.size());
    for (const Queued& q : queued) {
      items.push_back({q.worker_id, q.msg.seq(), [this, &q]() -> absl::Status {
                         absl::Status s = q.msg.has_metrics()
                                              ? ctx_.jobs->OnMetrics(q.worker_id, q.msg.metrics())
                                              : ctx_.jobs->OnLogs(q.worker_id, q.msg.logs());
                         if (!s.ok() && s.code() != absl::StatusCode::kAborted) {
                           std::cerr << "coordinator: worker " << q.worker_id << ": " << s << "\n";
                         }
                         return s;
                       }});
    }
    TelemetryLedger::Result r = ctx_.telemetry->ApplyBatch(items);
    // One answer per session, after the commit.
    std::vector<TelemetrySession*> sessions;
    for (const Queued& q : queued) {
      if (std::find(sessions.begin(), sessions.end(), q.session) != sessions.end()) continue;
      sessions.push_back(q.session);
      if (r.outcome == TelemetryLedger::Outcome::kRetry) {
        q.session->TelemetryNotApplied(q.msg.seq(), r.status);
      } else {
        q.session->TelemetryApplied();
      }
    }
  }

 private:
  struct Queued {
    TelemetrySession* session;
    std::string worker_id;
    v1::WorkerMessage msg;
  };
  ServiceContext ctx_;
  std::vector<Queued> queue_;
  bool drain_posted_ = false;
};

namespace {

// One worker daemon's Session stream.
class SessionReactor final : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>,
                             public WorkerChannel,
                             public TelemetrySession {
 public:
  // `cert_id`: the CN of the worker's verified client certificate ("" when
  // it presented none); such a worker may register only under that id.
  // `cert_sans`: that certificate's subject alternative names.
  SessionReactor(ServiceContext ctx, std::string peer, Principal who, std::string cert_id,
                 std::vector<std::string> cert_sans)
      : ctx_(ctx),
        peer_(std::move(peer)),
        who_(std::move(who)),
        cert_id_(std::move(cert_id)),
        cert_sans_(std::move(cert_sans)) {
    StartRead(&in_);
  }

  // WorkerChannel (called on the loop).
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

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The worker closed its side or the stream broke.
      ctx_.loop->Post([this] { Ended(/*left=*/false); });
      absl::MutexLock lock(&mu_);
      CloseLocked(grpc::Status::OK);
      return;
    }
    v1::WorkerMessage msg = std::move(in_);
    in_.Clear();
    ctx_.loop->Post([this, msg = std::move(msg)] { Handle(msg); });
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
    ctx_.loop->Post([this] { Ended(false); });
  }

  void OnDone() override {
    ctx_.loop->Post([this] {
      Ended(false);
      // Nothing queued may outlive the session it answers to.
      if (ctx_.batcher != nullptr) ctx_.batcher->Drain();
      delete this;
    });
  }

  // TelemetrySession (loop).
  void TelemetryApplied() override { AckTelemetry(); }
  void TelemetryNotApplied(int64_t seq, const absl::Status& why) override {
    if (!telemetry_failed_) TelemetryFailed(seq, why);
  }

 private:
  // Sequenced metrics and logs go through the group commit.
  bool Batched(const v1::WorkerMessage& msg) const {
    return ctx_.batcher != nullptr && ctx_.telemetry != nullptr && msg.seq() > 0 &&
           (msg.has_metrics() || msg.has_logs());
  }

  // Loop only.
  void Handle(const v1::WorkerMessage& msg) {
    // Everything but a heartbeat and a queued report waits for what is
    // queued: a worker's messages are applied in the order it sent them, and
    // a RegisterAck's applied seq covers what was queued.
    if (ctx_.batcher != nullptr && !msg.has_heartbeat() && !Batched(msg)) ctx_.batcher->Drain();
    if (msg.has_register_()) {
      if (!worker_id_.empty()) {
        Close(absl::FailedPreconditionError("register: already registered on this session"));
        return;
      }
      // A worker with a certificate is the id its certificate names (the
      // cluster CA signed it for that id) and nothing else.
      if (!cert_id_.empty()) {
        const std::string& wanted = msg.register_().worker_id();
        if (!wanted.empty() && wanted != cert_id_) {
          absl::Status s = absl::PermissionDeniedError(absl::StrCat(
              "register: this worker's certificate is for '", cert_id_, "'; it may not register as '",
              wanted, "'"));
          std::cerr << "coordinator: refused registration from " << peer_ << ": " << s << "\n";
          Close(s);
          return;
        }
        v1::Register reg = msg.register_();
        reg.set_worker_id(cert_id_);
        Register(reg);
        return;
      }
      // Without one, a worker id belongs to the token that first registered
      // it: another token cannot take it over (not even after a restart).
      if (!msg.register_().worker_id().empty()) {
        absl::Status mine = ctx_.auth->CheckWorker(msg.register_().worker_id(), who_);
        if (!mine.ok()) {
          std::cerr << "coordinator: refused registration from " << peer_ << ": " << mine << "\n";
          Close(mine);
          return;
        }
      }
      Register(msg.register_());
      return;
    }
    if (worker_id_.empty()) {
      Close(absl::FailedPreconditionError("the first message of a session must be register"));
      return;
    }
    HandleRegistered(msg);
  }

  // Registers (identity already checked), binds a token worker's id, acks.
  void Register(const v1::Register& reg) {
    absl::StatusOr<std::string> id = ctx_.registry->Register(reg, this);
    if (!id.ok()) {
      Close(id.status());
      return;
    }
    if (cert_id_.empty()) {
      if (absl::Status bound = ctx_.auth->BindWorker(*id, who_); !bound.ok()) {
        Close(bound);
        return;
      }
    }
    worker_id_ = *id;
    // The hosts this worker may name in rendezvous reports: the address it
    // connects from, and what vouches for it: its certificate's names (a
    // certificate worker), or the address it registered (a token worker,
    // which nothing else checks).
    own_hosts_.clear();
    if (std::string ip = PeerIp(peer_); !ip.empty()) own_hosts_.push_back(ip);
    if (!cert_id_.empty()) {
      own_hosts_.insert(own_hosts_.end(), cert_sans_.begin(), cert_sans_.end());
    } else {
      own_hosts_.push_back(reg.address().empty() ? reg.hostname() : reg.address());
    }
    v1::CoordinatorMessage ack;
    ack.mutable_register_ack()->set_worker_id(worker_id_);
    ack.mutable_register_ack()->set_heartbeat_interval_ms(
        static_cast<int32_t>(absl::ToInt64Milliseconds(ctx_.registry->options().heartbeat_interval)));
    ack.mutable_register_ack()->set_lease_timeout_ms(
        static_cast<int32_t>(absl::ToInt64Milliseconds(ctx_.registry->options().lease_timeout)));
    if (ctx_.telemetry != nullptr) {
      ack.mutable_register_ack()->set_telemetry_acked_seq(ctx_.telemetry->Applied(worker_id_));
    }
    Send(ack);
    ctx_.jobs->OnWorkerRegistered(worker_id_, reg);
  }

  void HandleRegistered(const v1::WorkerMessage& msg) {
    if (!ctx_.registry->OwnsSession(worker_id_, this)) {
      Close(absl::FailedPreconditionError("session replaced or expired; reconnect and register"));
      return;
    }
    if (Batched(msg)) {
      // After a failed apply the session is closing (see below).
      if (!telemetry_failed_) ctx_.batcher->Queue(this, worker_id_, msg);
      return;
    }
    // Sequenced telemetry is applied at most once, in one store transaction
    // with its seq, and acknowledged after that commit (TelemetryLedger).
    const bool sequenced = msg.seq() > 0 && ctx_.telemetry != nullptr &&
                           msg.msg_case() != v1::WorkerMessage::kHeartbeat &&
                           msg.msg_case() != v1::WorkerMessage::kGoodbye;
    if (sequenced) {
      // After a failed apply the session is closing: what follows is resent
      // on the next session, in order, after the one that failed.
      if (telemetry_failed_) return;
      TelemetryLedger::Result begun = ctx_.telemetry->Begin(worker_id_, msg.seq());
      if (begun.outcome == TelemetryLedger::Outcome::kDuplicate) {
        AckTelemetry();
        return;
      }
      if (begun.outcome == TelemetryLedger::Outcome::kRetry) {
        TelemetryFailed(msg.seq(), begun.status);
        return;
      }
    }
    absl::Status s;
    // However Handle leaves from here (a case that returns early too), a
    // sequenced message's group is committed with its seq and acknowledged.
    absl::Cleanup finish_telemetry = [&] {
      if (sequenced) FinishTelemetry(msg.seq(), s);
    };
    switch (msg.msg_case()) {
      case v1::WorkerMessage::kHeartbeat: {
        s = ctx_.registry->Heartbeat(worker_id_, this);
        if (!s.ok()) {
          Close(s);
          return;
        }
        v1::CoordinatorMessage ack;
        ack.mutable_heartbeat_ack()->set_seq(msg.heartbeat().seq());
        Send(ack);
        return;
      }
      case v1::WorkerMessage::kRankStatus:
        s = ctx_.jobs->OnRankStatus(worker_id_, msg.rank_status());
        break;
      case v1::WorkerMessage::kRendezvous:
        s = CheckRendezvousHosts(msg.rendezvous().info(), own_hosts_);
        if (!s.ok()) {
          LogEvent(LogLevel::kWarn, "coordinator", "rendezvous_refused",
                   {{"worker_id", worker_id_}, {"peer", peer_}, {"job_id", msg.rendezvous().job_id()},
                    {"reason", std::string(s.message())}});
          break;
        }
        s = ctx_.jobs->OnRendezvous(worker_id_, msg.rendezvous());
        break;
      case v1::WorkerMessage::kMetrics:
        s = ctx_.jobs->OnMetrics(worker_id_, msg.metrics());
        break;
      case v1::WorkerMessage::kLogs:
        s = ctx_.jobs->OnLogs(worker_id_, msg.logs());
        break;
      case v1::WorkerMessage::kProgress:
        s = ctx_.jobs->OnProgress(worker_id_, msg.progress());
        break;
      case v1::WorkerMessage::kCheckpoint:
        s = ctx_.jobs->OnCheckpoint(worker_id_, msg.checkpoint());
        break;
      case v1::WorkerMessage::kFinalModel:
        s = ctx_.jobs->OnFinalModel(worker_id_, msg.final_model());
        break;
      case v1::WorkerMessage::kFileChunk:
        if (ctx_.fetches != nullptr) ctx_.fetches->OnChunk(worker_id_, msg.file_chunk());
        return;
      case v1::WorkerMessage::kPreflight:
        s = ctx_.jobs->OnPreflightReport(worker_id_, msg.preflight());
        break;
      case v1::WorkerMessage::kGoodbye:
        Ended(/*left=*/true);
        Close(absl::OkStatus());
        return;
      default:
        s = absl::InvalidArgumentError("message: empty or unknown kind");
    }
    // A bad or stale report is refused without ending the session: the worker
    // may be a step behind (a stale attempt) and everything else it says is
    // still needed.
    if (!s.ok() && s.code() != absl::StatusCode::kAborted) {
      std::cerr << "coordinator: worker " << worker_id_ << " (" << peer_ << "): " << s << "\n";
    }
  }

  // Ends the group Begin opened for message `seq` (handled with `handled`).
  void FinishTelemetry(int64_t seq, const absl::Status& handled) {
    TelemetryLedger::Result done = ctx_.telemetry->Finish(worker_id_, seq, handled);
    if (done.outcome == TelemetryLedger::Outcome::kRetry) {
      TelemetryFailed(seq, done.status);
      return;
    }
    AckTelemetry();
  }

  // Tells the worker how far its telemetry is applied and committed.
  void AckTelemetry() {
    v1::CoordinatorMessage ack;
    ack.mutable_telemetry_ack()->set_seq(ctx_.telemetry->Applied(worker_id_));
    Send(ack);
  }

  // A store failure kept message `seq` from being applied: end the session
  // so the worker reconnects and resends from its last acknowledged seq.
  void TelemetryFailed(int64_t seq, const absl::Status& why) {
    telemetry_failed_ = true;
    std::cerr << "coordinator: worker " << worker_id_ << " (" << peer_ << "): telemetry seq " << seq
              << " not applied: " << why << "\n";
    Close(absl::UnavailableError(absl::StrCat("telemetry seq ", seq, " not applied (", why.message(),
                                              "); reconnect and resend")));
  }

  void Ended(bool left) {
    // What the worker sent before it left is applied before it is gone.
    if (ctx_.batcher != nullptr) ctx_.batcher->Drain();
    if (ended_ || worker_id_.empty()) {
      ended_ = true;
      return;
    }
    ended_ = true;
    ctx_.registry->SessionEnded(worker_id_, this, left);
    if (ctx_.fetches != nullptr) ctx_.fetches->WorkerGone(worker_id_);
  }

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

  ServiceContext ctx_;
  const std::string peer_;
  const Principal who_;
  const std::string cert_id_;
  const std::vector<std::string> cert_sans_;
  // Hosts its rendezvous reports may name (set at registration; loop only).
  std::vector<std::string> own_hosts_;
  v1::WorkerMessage in_;  // gRPC thread (one read in flight).

  absl::Mutex mu_;
  std::deque<v1::CoordinatorMessage> out_ ABSL_GUARDED_BY(mu_);
  v1::CoordinatorMessage current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_ ABSL_GUARDED_BY(mu_);

  // Loop only.
  std::string worker_id_;
  bool ended_ = false;
  // A sequenced message failed to apply; later ones wait for the resend.
  bool telemetry_failed_ = false;
};

}  // namespace

absl::StatusOr<v1::GetMetricsResponse> GetMetricsPage(JobManager& jobs, StateStore& store,
                                                      const v1::GetMetricsRequest& req) {
  TRAINCTL_RETURN_IF_ERROR(jobs.Get(req.job_id()).status());
  MetricPageQuery q;
  q.job_id = req.job_id();
  if (req.has_rank()) {
    if (req.rank() < 0) return absl::InvalidArgumentError(absl::StrCat("rank: ", req.rank(), " is negative"));
    q.rank = req.rank();
  }
  if (!v1::MetricPoint::Kind_IsValid(req.kind())) {
    return absl::InvalidArgumentError(absl::StrCat("kind: ", req.kind(), " is not a MetricPoint.Kind"));
  }
  q.kind = req.kind();
  if (!req.page_token().empty() && (!absl::SimpleAtoi(req.page_token(), &q.after_id) || q.after_id < 0)) {
    return absl::InvalidArgumentError(absl::StrCat("page_token: '", req.page_token().substr(0, 40),
                                                   "' is not a token this coordinator returned"));
  }
  if (req.max_page_bytes() < 0) return absl::InvalidArgumentError("max_page_bytes: must not be negative");
  q.max_bytes = req.max_page_bytes() == 0 ? kMaxMetricPageBytes
                                          : std::clamp<int64_t>(req.max_page_bytes(), 1024, kMaxMetricPageBytes);
  TRAINCTL_ASSIGN_OR_RETURN(MetricPage page, store.ListMetricPage(q));
  v1::GetMetricsResponse resp;
  v1::MetricBatch* batch = nullptr;
  for (StoredMetricPoint& p : page.points) {
    if (batch == nullptr || batch->attempt() != p.attempt) {
      batch = resp.add_batches();
      batch->set_job_id(req.job_id());
      batch->set_attempt(p.attempt);
    }
    *batch->add_points() = std::move(p.point);
  }
  if (page.more) resp.set_next_page_token(absl::StrCat(page.points.back().id));
  resp.set_resume_token(page.points.empty() ? req.page_token() : absl::StrCat(page.points.back().id));
  return resp;
}

// --- JobService ------------------------------------------------------------------

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* ctx,
                                                    const v1::SubmitJobRequest* req,
                                                    v1::SubmitJobResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<Principal> who = Caller(ctx_, ctx, "SubmitJob", {kAdmin, kSubmitter});
  if (!who.ok()) {
    reactor->Finish(ToGrpcStatus(who.status()));
    return reactor;
  }
  ctx_.loop->Post([this, reactor, req, resp, who = *who] {
    // Resuming from a job is acting on it: a submitter resumes its own.
    if (!req->spec().resume_from().job().empty()) {
      absl::StatusOr<v1::Job> source = ctx_.jobs->Get(req->spec().resume_from().job());
      if (source.ok()) {
        absl::Status mine = MayActOnJob(who, "SubmitJob (resume_from)", *source);
        if (!mine.ok()) {
          reactor->Finish(ToGrpcStatus(mine));
          return;
        }
      }
    }
    if (req->dry_run()) {
      absl::StatusOr<v1::SubmitJobResponse> r = ctx_.jobs->DryRun(req->spec());
      if (r.ok()) *resp = std::move(*r);
      reactor->Finish(ToGrpcStatus(r.status()));
      return;
    }
    absl::StatusOr<v1::Job> job = ctx_.jobs->Submit(req->spec(), who.name, who.token_id);
    if (job.ok()) *resp->mutable_job() = std::move(*job);
    reactor->Finish(ToGrpcStatus(job.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* ctx,
                                                 const v1::GetJobRequest* req, v1::Job* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<Principal> who = Caller(ctx_, ctx, "GetJob", {kAdmin, kSubmitter, kViewer});
  if (!who.ok()) {
    reactor->Finish(ToGrpcStatus(who.status()));
    return reactor;
  }
  ctx_.loop->Post([this, reactor, req, resp] {
    absl::StatusOr<v1::Job> job = ctx_.jobs->Get(req->job_id());
    if (job.ok()) *resp = std::move(*job);
    reactor->Finish(ToGrpcStatus(job.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* ctx,
                                                   const v1::ListJobsRequest* req,
                                                   v1::ListJobsResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<Principal> who = Caller(ctx_, ctx, "ListJobs", {kAdmin, kSubmitter, kViewer});
  if (!who.ok()) {
    reactor->Finish(ToGrpcStatus(who.status()));
    return reactor;
  }
  ctx_.loop->Post([this, reactor, req, resp] {
    absl::StatusOr<v1::ListJobsResponse> r = ctx_.jobs->List(*req);
    if (r.ok()) *resp = std::move(*r);
    reactor->Finish(ToGrpcStatus(r.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* ctx,
                                                    const v1::CancelJobRequest* req, v1::Job* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<Principal> who = Caller(ctx_, ctx, "CancelJob", {kAdmin, kSubmitter});
  if (!who.ok()) {
    reactor->Finish(ToGrpcStatus(who.status()));
    return reactor;
  }
  ctx_.loop->Post([this, reactor, req, resp, who = *who] {
    absl::StatusOr<v1::Job> current = ctx_.jobs->Get(req->job_id());
    if (current.ok()) {
      absl::Status mine = MayActOnJob(who, "CancelJob", *current);
      if (!mine.ok()) {
        reactor->Finish(ToGrpcStatus(mine));
        return;
      }
    }
    absl::StatusOr<v1::Job> job = ctx_.jobs->Cancel(req->job_id(), req->reason());
    if (job.ok()) *resp = std::move(*job);
    reactor->Finish(ToGrpcStatus(job.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::GetMetrics(grpc::CallbackServerContext* ctx,
                                                     const v1::GetMetricsRequest* req,
                                                     v1::GetMetricsResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<Principal> who = Caller(ctx_, ctx, "GetMetrics", {kAdmin, kSubmitter, kViewer});
  if (!who.ok()) {
    reactor->Finish(ToGrpcStatus(who.status()));
    return reactor;
  }
  ctx_.loop->Post([this, reactor, req, resp] {
    absl::StatusOr<v1::GetMetricsResponse> r = GetMetricsPage(*ctx_.jobs, *ctx_.store, *req);
    if (r.ok()) *resp = std::move(*r);
    reactor->Finish(ToGrpcStatus(r.status()));
  });
  return reactor;
}

grpc::ServerWriteReactor<v1::JobUpdate>* JobServiceImpl::WatchJob(grpc::CallbackServerContext* ctx,
                                                                  const v1::WatchJobRequest* req) {
  auto* reactor = new WatchReactor(ctx_, req->job_id());
  absl::StatusOr<Principal> who = Caller(ctx_, ctx, "WatchJob", {kAdmin, kSubmitter, kViewer});
  if (!who.ok()) {
    reactor->FinishAfterQueue(ToGrpcStatus(who.status()));
    return reactor;
  }
  v1::WatchJobRequest request = *req;
  ctx_.loop->Post([this, reactor, request] {
    absl::StatusOr<v1::Job> job = ctx_.jobs->Get(request.job_id());
    if (!job.ok()) {
      reactor->FinishAfterQueue(ToGrpcStatus(job.status()));
      return;
    }
    // History and subscription in one loop turn: no gap, no duplicate.
    if (request.include_history()) {
      absl::StatusOr<std::vector<v1::Event>> events = ctx_.store->ListEvents(request.job_id(), 0, 100000);
      if (events.ok()) {
        for (v1::Event& e : *events) {
          v1::JobUpdate u;
          *u.mutable_event() = std::move(e);
          reactor->Offer(u);
        }
      }
      absl::StatusOr<std::vector<v1::MetricPoint>> points = ctx_.store->ListMetrics(request.job_id(), 10000);
      if (points.ok() && !points->empty()) {
        v1::JobUpdate u;
        u.mutable_metrics()->set_job_id(request.job_id());
        for (v1::MetricPoint& p : *points) *u.mutable_metrics()->add_points() = std::move(p);
        reactor->Offer(u);
      }
    }
    v1::JobUpdate snap;
    *snap.mutable_job() = *job;
    snap.mutable_job()->clear_attempts();
    reactor->Offer(snap);
    if (IsTerminal(job->state())) {
      reactor->FinishAfterQueue(grpc::Status::OK);
      return;
    }
    ctx_.hub->Subscribe(request.job_id(), reactor);
    reactor->set_subscribed();
  });
  return reactor;
}

absl::Status LogsRequestError(const v1::GetLogsRequest& req, const v1::Job& job) {
  if (req.tail_lines() < 0) return absl::InvalidArgumentError("tail_lines: must be >= 0");
  const int attempts = job.attempts_size();
  if (req.attempt() < 0 || req.attempt() > attempts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attempt: ", req.attempt(), " is out of range: job '", job.id(), "' has ", attempts, " attempt(s)",
        attempts > 0 ? absl::StrCat(" (1..", attempts, "; 0 = the latest)") : " yet"));
  }
  const int world = job.spec().world_size();
  if (req.has_rank() && (req.rank() < 0 || (world > 0 && req.rank() >= world))) {
    return absl::InvalidArgumentError(absl::StrCat("rank: ", req.rank(), " is outside job '", job.id(),
                                                   "''s world: world_size ", world, " (ranks 0..", world - 1, ")"));
  }
  return absl::OkStatus();
}

grpc::ServerWriteReactor<v1::LogChunk>* JobServiceImpl::GetLogs(grpc::CallbackServerContext* ctx,
                                                                const v1::GetLogsRequest* req) {
  auto* reactor = new LogsReactor(ctx_, *req);
  absl::StatusOr<Principal> who = Caller(ctx_, ctx, "GetLogs", {kAdmin, kSubmitter, kViewer});
  if (!who.ok()) {
    reactor->FinishAfterQueue(ToGrpcStatus(who.status()));
    return reactor;
  }
  v1::GetLogsRequest request = *req;
  ctx_.loop->Post([this, reactor, request] {
    absl::StatusOr<v1::Job> job = ctx_.jobs->Get(request.job_id());
    if (!job.ok()) {
      reactor->FinishAfterQueue(ToGrpcStatus(job.status()));
      return;
    }
    absl::Status bad = LogsRequestError(request, *job);
    if (!bad.ok()) {
      reactor->FinishAfterQueue(ToGrpcStatus(bad));
      return;
    }
    int32_t attempt = request.attempt() == 0 ? job->attempts_size() : request.attempt();
    std::optional<int32_t> rank;
    if (request.has_rank()) rank = request.rank();
    absl::StatusOr<std::vector<v1::LogLine>> lines =
        ctx_.store->ListLogs(request.job_id(), attempt, rank, request.tail_lines());
    if (lines.ok()) {
      // Group consecutive lines of a rank into chunks.
      v1::LogChunk chunk;
      auto flush = [&] {
        if (chunk.lines_size() > 0) reactor->Push(chunk);
        chunk.Clear();
      };
      for (v1::LogLine& l : *lines) {
        if (chunk.lines_size() > 0 && (chunk.rank() != l.rank() || chunk.lines_size() >= 500)) flush();
        chunk.set_job_id(request.job_id());
        chunk.set_attempt(attempt);
        chunk.set_rank(l.rank());
        *chunk.add_lines() = std::move(l);
      }
      flush();
    }
    bool follow = request.follow() && !IsTerminal(job->state()) && attempt == job->attempts_size();
    reactor->Start(attempt, follow);
    if (follow) {
      ctx_.hub->SubscribeLogs(request.job_id(), reactor);
    } else {
      reactor->FinishAfterQueue(ToGrpcStatus(lines.status()));
    }
  });
  return reactor;
}

// --- FetchArtifact ------------------------------------------------------------------

namespace {

// Where a fetch reads from: a connected worker, a path on it, and the
// checksum the file was recorded with ("" when none was).
struct ArtifactSource {
  std::string worker;
  std::string path;
  std::string recorded_checksum;
};

// On the loop.
absl::StatusOr<ArtifactSource> FindArtifact(const ServiceContext& c, const v1::FetchArtifactRequest& req) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  if (req.checkpoint_step() < 0) return absl::InvalidArgumentError("checkpoint_step: must be >= 0 (0: the final model)");
  TRAINCTL_ASSIGN_OR_RETURN(v1::Job job, c.jobs->Get(req.job_id()));
  ArtifactSource src;
  if (req.checkpoint_step() == 0) {
    if (job.final_model().empty()) {
      return absl::NotFoundError(absl::StrCat("job '", job.id(), "' has no final model (",
                                              v1::JobState_Name(job.state()), "); fetch a checkpoint with --checkpoint STEP"));
    }
    src = {job.final_model_worker(), job.final_model(), ""};
  } else {
    const v1::CheckpointRecord* found = nullptr;
    std::vector<std::string> steps;
    for (const v1::CheckpointRecord& r : job.checkpoints()) {
      steps.push_back(absl::StrCat(r.global_step()));
      if (r.global_step() == req.checkpoint_step()) found = &r;
    }
    if (found == nullptr) {
      return absl::NotFoundError(absl::StrCat("checkpoint_step: job '", job.id(), "' has no checkpoint at step ",
                                              req.checkpoint_step(), " (it has: ",
                                              steps.empty() ? "none" : absl::StrJoin(steps, ", "), ")"));
    }
    src = {found->worker_id(), found->path(), found->checksum()};
    if (src.worker.empty()) {
      // A shared checkpoint: any connected worker sees it.
      std::vector<const v1::Worker*> alive = c.registry->Alive();
      if (alive.empty()) return absl::UnavailableError("no worker is connected to read the shared checkpoint");
      src.worker = alive.front()->id();
    }
  }
  const v1::Worker* w = c.registry->Find(src.worker);
  if (w == nullptr || w->state() != v1::WORKER_STATE_ALIVE) {
    return absl::UnavailableError(absl::StrCat("worker '", src.worker, "' holding ", src.path, " is not connected (",
                                               w == nullptr ? "unknown" : v1::WorkerState_Name(w->state()), ")"));
  }
  return src;
}

std::string Crc32Text(uint32_t crc) { return absl::StrFormat("crc32:%08x", crc); }

// One FetchArtifact stream: asks the holder for a piece, writes it to the
// client, and asks for the next only when the write is done (one piece in
// flight). Its state is loop-only; gRPC callbacks post to the loop. It is
// deleted on the loop after OnDone, when nothing refers to it any more.
class FetchReactor final : public grpc::ServerWriteReactor<v1::ArtifactChunk>, public FetchSink {
 public:
  FetchReactor(ServiceContext ctx, int32_t chunk_bytes) : ctx_(ctx), chunk_bytes_(chunk_bytes) {}

  // Loop.
  void Start(ArtifactSource src) {
    src_ = std::move(src);
    Ask(/*want_checksum=*/true);
  }
  void Fail(const absl::Status& why) {
    if (finished_) return;
    finished_ = true;
    if (ctx_.fetches != nullptr) ctx_.fetches->Cancel(this);
    Finish(ToGrpcStatus(why));
  }

  // FetchSink (loop).
  void OnPiece(const v1::FileChunk& c) override {
    if (finished_) return;
    const std::string holder = absl::StrCat("worker '", src_.worker, "': ");
    if (!c.error().empty()) {
      Fail(absl::FailedPreconditionError(absl::StrCat(holder, c.error())));
      return;
    }
    if (c.offset() != offset_) {
      Fail(absl::InternalError(absl::StrCat(holder, "answered for offset ", c.offset(), ", expected ", offset_)));
      return;
    }
    out_.Clear();
    if (first_) {
      size_ = c.size();
      expected_ = src_.recorded_checksum.empty() ? c.checksum() : src_.recorded_checksum;
      if (!src_.recorded_checksum.empty() && !c.checksum().empty() && c.checksum() != src_.recorded_checksum) {
        Fail(absl::DataLossError(absl::StrCat(holder, src_.path, " is ", c.checksum(), " on disk, recorded as ",
                                              src_.recorded_checksum, " (the file changed or is damaged)")));
        return;
      }
      out_.set_path(src_.path);
      out_.set_worker_id(src_.worker);
      out_.set_size(size_);
      out_.set_checksum(expected_);
    } else if (c.size() != size_) {
      Fail(absl::DataLossError(absl::StrCat(holder, src_.path, " changed size during the fetch (", size_, " -> ",
                                            c.size(), " bytes)")));
      return;
    }
    if (c.data().empty() && offset_ < size_) {
      Fail(absl::DataLossError(absl::StrCat(holder, "no bytes at offset ", offset_, " of ", size_)));
      return;
    }
    crc_ = crc32(crc_, reinterpret_cast<const Bytef*>(c.data().data()), static_cast<uInt>(c.data().size()));
    out_.set_offset(offset_);
    out_.set_data(c.data());
    offset_ += static_cast<int64_t>(c.data().size());
    first_ = false;
    StartWrite(&out_);
  }
  void OnFailed(const absl::Status& why) override { Fail(why); }

  // gRPC callbacks: to the loop.
  void OnWriteDone(bool ok) override {
    ctx_.loop->Post([this, ok] {
      if (finished_) return;
      if (!ok) {
        Fail(absl::CancelledError("the client went away"));
        return;
      }
      if (offset_ < size_) {
        Ask(/*want_checksum=*/false);
        return;
      }
      if (!expected_.empty() && Crc32Text(static_cast<uint32_t>(crc_)) != expected_) {
        Fail(absl::DataLossError(absl::StrCat("sent bytes are ", Crc32Text(static_cast<uint32_t>(crc_)), ", expected ",
                                              expected_, ": discard them")));
        return;
      }
      finished_ = true;
      Finish(grpc::Status::OK);
    });
  }
  void OnCancel() override {
    ctx_.loop->Post([this] { Fail(absl::CancelledError("cancelled")); });
  }
  void OnDone() override {
    ctx_.loop->Post([this] {
      if (ctx_.fetches != nullptr) ctx_.fetches->Cancel(this);
      delete this;
    });
  }

 private:
  void Ask(bool want_checksum) {
    v1::ReadFile r;
    r.set_path(src_.path);
    r.set_offset(offset_);
    r.set_max_bytes(chunk_bytes_);
    r.set_want_checksum(want_checksum);
    if (absl::Status s = ctx_.fetches->Request(src_.worker, r, this); !s.ok()) Fail(s);
  }

  ServiceContext ctx_;
  const int32_t chunk_bytes_;
  // Loop-only.
  ArtifactSource src_;
  v1::ArtifactChunk out_;
  bool first_ = true;
  bool finished_ = false;
  int64_t offset_ = 0;
  int64_t size_ = 0;
  std::string expected_;
  uLong crc_ = crc32(0L, Z_NULL, 0);
};

}  // namespace

grpc::ServerWriteReactor<v1::ArtifactChunk>* JobServiceImpl::FetchArtifact(grpc::CallbackServerContext* ctx,
                                                                          const v1::FetchArtifactRequest* req) {
  absl::StatusOr<Principal> who = Caller(ctx_, ctx, "FetchArtifact", {kAdmin, kSubmitter, kViewer});
  auto* reactor = new FetchReactor(ctx_, ctx_.fetch_chunk_bytes);
  if (!who.ok()) {
    ctx_.loop->Post([reactor, s = who.status()] { reactor->Fail(s); });
    return reactor;
  }
  if (ctx_.fetches == nullptr) {
    ctx_.loop->Post([reactor] { reactor->Fail(absl::UnimplementedError("FetchArtifact: not served here")); });
    return reactor;
  }
  ctx_.loop->Post([this, reactor, request = *req] {
    absl::StatusOr<ArtifactSource> src = FindArtifact(ctx_, request);
    if (!src.ok()) {
      reactor->Fail(src.status());
      return;
    }
    reactor->Start(*std::move(src));
  });
  return reactor;
}

// --- WorkerService ------------------------------------------------------------------

WorkerServiceImpl::WorkerServiceImpl(ServiceContext ctx)
    : batcher_(std::make_unique<TelemetryBatcher>(ctx)), ctx_(ctx) {
  ctx_.batcher = batcher_.get();
}

WorkerServiceImpl::~WorkerServiceImpl() = default;

grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* WorkerServiceImpl::Session(
    grpc::CallbackServerContext* ctx) {
  // mTLS: a client certificate the cluster CA signed (verified in the
  // handshake) names the worker; it needs no token.
  std::string cert_id;
  std::vector<std::string> cert_sans;
  if (std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context()) {
    std::vector<grpc::string_ref> cn = auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
    if (!cn.empty()) cert_id.assign(cn.front().data(), cn.front().size());
    if (!cert_id.empty()) {
      for (const grpc::string_ref& san : auth->FindPropertyValues(GRPC_X509_SAN_PROPERTY_NAME)) {
        cert_sans.emplace_back(san.data(), san.size());
      }
    }
  }
  absl::StatusOr<Principal> who;
  if (!cert_id.empty() && ctx->client_metadata().find("authorization") == ctx->client_metadata().end()) {
    who = Principal{absl::StrCat("cert:", cert_id), cert_id, v1::ROLE_WORKER};
  } else {
    who = Caller(ctx_, ctx, "Session", {kWorker});
  }
  if (!who.ok()) return new RefusedSession(who.status());
  return new SessionReactor(ctx_, ctx->peer(), *who, cert_id, std::move(cert_sans));
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ListWorkers(grpc::CallbackServerContext* ctx,
                                                         const v1::ListWorkersRequest* req,
                                                         v1::ListWorkersResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<Principal> who = Caller(ctx_, ctx, "ListWorkers", {kAdmin, kSubmitter, kViewer});
  if (!who.ok()) {
    reactor->Finish(ToGrpcStatus(who.status()));
    return reactor;
  }
  ctx_.loop->Post([this, reactor, req, resp] {
    for (v1::Worker& w : ctx_.registry->List(req->include_gone())) {
      for (int s : ctx_.jobs->BusySlots(w.id())) w.add_busy_slots(s);
      *resp->add_workers() = std::move(w);
    }
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

// --- AuthService ------------------------------------------------------------------
// Token writes run on the loop: the store's telemetry groups assume one
// writing thread.

grpc::ServerUnaryReactor* AuthServiceImpl::CreateToken(grpc::CallbackServerContext* ctx,
                                                       const v1::CreateTokenRequest* req,
                                                       v1::CreateTokenResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<Principal> who = Caller(ctx_, ctx, "CreateToken", {kAdmin});
  if (!who.ok()) {
    reactor->Finish(ToGrpcStatus(who.status()));
    return reactor;
  }
  ctx_.loop->Post([this, reactor, req, resp, who = *who] {
    absl::StatusOr<v1::CreateTokenResponse> r = ctx_.auth->Create(*req, who);
    if (r.ok()) *resp = std::move(*r);
    reactor->Finish(ToGrpcStatus(r.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* AuthServiceImpl::ListTokens(grpc::CallbackServerContext* ctx,
                                                      const v1::ListTokensRequest* req,
                                                      v1::ListTokensResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<Principal> who = Caller(ctx_, ctx, "ListTokens", {kAdmin});
  if (who.ok()) {
    for (v1::Token& t : ctx_.auth->List(req->include_revoked())) *resp->add_tokens() = std::move(t);
  }
  reactor->Finish(ToGrpcStatus(who.status()));
  return reactor;
}

grpc::ServerUnaryReactor* AuthServiceImpl::Join(grpc::CallbackServerContext* ctx, const v1::JoinRequest* req,
                                                v1::JoinResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<Principal> who = Caller(ctx_, ctx, "Join", {v1::ROLE_JOIN});
  if (!who.ok()) {
    reactor->Finish(ToGrpcStatus(who.status()));
    return reactor;
  }
  // The certificate comes back in the reply: never over plaintext.
  std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
  std::vector<grpc::string_ref> transport =
      auth ? auth->FindPropertyValues(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME) : std::vector<grpc::string_ref>();
  if (transport.empty() || std::string(transport.front().data(), transport.front().size()) != "ssl") {
    reactor->Finish(ToGrpcStatus(absl::FailedPreconditionError(
        "Join: needs TLS (start the coordinator with --tls-dir; the worker with --ca)")));
    return reactor;
  }
  if (ctx_.enroller == nullptr) {
    reactor->Finish(ToGrpcStatus(absl::FailedPreconditionError("Join: this coordinator does not sign certificates")));
    return reactor;
  }
  // A refusal is logged by the RPC interceptor (rpc_refused).
  ctx_.loop->Post([this, reactor, req, resp, who = *who] {
    absl::StatusOr<v1::JoinResponse> r = ctx_.enroller->Join(who, *req);
    if (r.ok()) *resp = std::move(*r);
    reactor->Finish(ToGrpcStatus(r.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* AuthServiceImpl::RevokeToken(grpc::CallbackServerContext* ctx,
                                                       const v1::RevokeTokenRequest* req,
                                                       v1::Token* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<Principal> who = Caller(ctx_, ctx, "RevokeToken", {kAdmin});
  if (!who.ok()) {
    reactor->Finish(ToGrpcStatus(who.status()));
    return reactor;
  }
  ctx_.loop->Post([this, reactor, req, resp] {
    absl::StatusOr<v1::Token> r = ctx_.auth->Revoke(req->id());
    if (r.ok()) *resp = std::move(*r);
    reactor->Finish(ToGrpcStatus(r.status()));
  });
  return reactor;
}

}  // namespace trainctl::coordinator
