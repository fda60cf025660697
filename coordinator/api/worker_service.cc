// WorkerService: one bidi Session stream per worker daemon (registration,
// heartbeats, sequenced reports handed to the managers) and ListWorkers.
//
// Threading: a SessionReactor reads on gRPC threads and posts every message
// to the loop, where all of its own state (worker id, hosts, telemetry
// failure) lives; its outgoing queue is guarded by its mutex, since the loop
// sends and gRPC completes writes.
#include <algorithm>
#include <atomic>
#include <deque>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "coordinator/core/peer_address.h"
#include "coordinator/api/service_support.h"
#include "coordinator/api/services.h"
#include "coordinator/api/telemetry_batcher.h"

namespace trainctl::coordinator {

namespace {

// A Session refused before it began (bad token or role).
class RefusedSession final
    : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
 public:
  explicit RefusedSession(const absl::Status& why) { Finish(ToGrpcStatus(why)); }
  void OnDone() override { delete this; }
};

// One worker daemon's Session stream.
class SessionReactor final : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>,
                             public WorkerChannel,
                             public TelemetrySession {
 public:
  // `cert_id`: the CN of the worker's verified client certificate ("" when
  // it presented none); such a worker may register only under that id.
  // `cert_sans`: that certificate's subject alternative names (host names
  // and IP addresses only); `cert_serial`: its serial (hex).
  SessionReactor(ServiceContext ctx, std::string peer, Principal who, std::string cert_id,
                 std::vector<std::string> cert_sans, std::string cert_serial)
      : ctx_(ctx),
        peer_(std::move(peer)),
        who_(std::move(who)),
        cert_id_(std::move(cert_id)),
        cert_sans_(std::move(cert_sans)),
        cert_serial_(std::move(cert_serial)) {
    // Posted before any read completes, so it runs before every Handle and
    // before OnDone's closure (which untracks).
    if (ctx_.live != nullptr) {
      ctx_.loop->Post([this] {
        AssertOnLoop(ctx_.loop, "a worker session");
        live_ = ctx_.live->Add(who_, [this](const absl::Status& why)
                                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { Revoked(why); });
      });
    }
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
  bool Unhandled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) override {
    return read_.load(std::memory_order_relaxed) > handled_;
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The worker closed its side or the stream broke.
      if (read_.load(std::memory_order_relaxed) == 0) {
        // Its first message never arrived (the stream ended at once, or the
        // message did not parse): not a session, and not OK.
        ctx_.loop->Post([this] {
          AssertOnLoop(ctx_.loop, "a worker session");
          Ended(/*left=*/false);
        });
        absl::MutexLock lock(&mu_);
        CloseLocked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "WorkerService/Session: no register message was read (the stream ended before "
                                 "one, or its first message is not a trainctl.v1.WorkerMessage)"));
        return;
      }
      // Messages read before the end may still wait for the loop: their
      // verdict comes first (a first message that is not a register ends
      // the session INVALID_ARGUMENT), then OK.
      ctx_.loop->Post([this] {
        AssertOnLoop(ctx_.loop, "a worker session");
        Ended(/*left=*/false);
        Close(absl::OkStatus());
      });
      return;
    }
    v1::WorkerMessage msg = std::move(in_);
    in_.Clear();
    read_.fetch_add(1, std::memory_order_relaxed);
    ctx_.loop->Post([this, msg = std::move(msg)] {
      AssertOnLoop(ctx_.loop, "a worker session");
      Handle(msg);
    });
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
    ctx_.loop->Post([this] {
      AssertOnLoop(ctx_.loop, "a worker session");
      Ended(false);
    });
  }

  void OnDone() override {
    // gRPC calls OnDone after every other reaction returned, but tells that
    // to the thread it runs OnDone on through its own (uninstrumented)
    // queues; taking mu_ here makes the order explicit: the last reaction
    // released mu_ before this, so the delete below follows it (ThreadSanitizer).
    { absl::MutexLock lock(&mu_); }
    ctx_.loop->Post([this] {
      AssertOnLoop(ctx_.loop, "a worker session");
      if (live_ != 0) ctx_.live->Remove(live_);
      Ended(false);
      // Nothing queued may outlive the session it answers to.
      if (ctx_.batcher != nullptr) ctx_.batcher->Drain();
      delete this;
    });
  }

  // TelemetrySession (loop).
  void TelemetryApplied() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) override { AckTelemetry(); }
  void TelemetryNotApplied(std::vector<v1::WorkerMessage> msgs, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) override {
    Hold(std::move(msgs), why);
  }

 private:
  bool Sequenced(const v1::WorkerMessage& msg) const { return msg.seq() > 0 && ctx_.telemetry != nullptr; }

  // Sequenced metrics and logs go through the group commit.
  bool Batched(const v1::WorkerMessage& msg) const {
    return ctx_.batcher != nullptr && ctx_.telemetry != nullptr && msg.seq() > 0 &&
           (msg.has_metrics() || msg.has_logs());
  }

  // The token this session opened with was revoked or expired (loop): the
  // worker is disconnected, nothing more it sends is applied, and its
  // reconnects are refused (the token no longer authenticates), so the
  // registry declares it LOST after the disconnect grace and its ranks are
  // rescheduled.
  void Revoked(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    ctx_.loop->CheckInLoop("a worker session");
    live_ = 0;
    revoked_ = true;
    LogEvent(LogLevel::kWarn, "coordinator", "worker_session_revoked",
             {{"worker_id", worker_id_.empty() ? "(unregistered)" : worker_id_}, {"peer", peer_},
              {"reason", std::string(why.message())}});
    Close(why);
  }

  // Loop only.
  void Handle(const v1::WorkerMessage& msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    ctx_.loop->CheckInLoop("a worker session");
    ++handled_;
    if (revoked_) return;
    // Everything but a heartbeat and a queued report waits for what is
    // queued: a worker's messages are applied in the order it sent them, and
    // a RegisterAck's applied seq covers what was queued.
    if (ctx_.batcher != nullptr && !msg.has_heartbeat() && !Batched(msg)) ctx_.batcher->Drain();
    // A revoked certificate (trainctl worker revoke) is checked on every
    // message, not only when the session opened: the revocation may come
    // while it is open.
    if (absl::Status revoked = ctx_.auth->CheckCert(cert_id_.empty() ? worker_id_ : cert_id_, cert_serial_);
        !revoked.ok()) {
      revoked_ = true;
      LogEvent(LogLevel::kWarn, "coordinator", "worker_revoked_refused",
               {{"worker_id", worker_id_}, {"peer", peer_}, {"reason", std::string(revoked.message())}});
      Close(revoked);
      if (!worker_id_.empty()) ExpelWorker(ctx_, worker_id_, revoked);
      return;
    }
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
          LogEvent(LogLevel::kWarn, "coordinator", "registration_refused",
                   {{"peer", peer_}, {"error", std::string(s.message())}});
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
          LogEvent(LogLevel::kWarn, "coordinator", "registration_refused",
                   {{"peer", peer_}, {"error", std::string(mine.message())}});
          Close(mine);
          return;
        }
      }
      Register(msg.register_());
      return;
    }
    if (worker_id_.empty()) {
      Close(absl::InvalidArgumentError("the first message of a session must be register"));
      return;
    }
    HandleRegistered(msg);
  }

  // Registers (identity already checked), binds a token worker's id, acks.
  void Register(const v1::Register& reg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    ctx_.loop->CheckInLoop("a worker session");
    // A coordinator unsure it still holds the store (its lease ran out
    // unconfirmed: stopped, or cut off from the database) takes no worker
    // as active: another coordinator may be active now. The worker retries.
    if (!ctx_.store->lease_confirmed()) {
      Close(absl::UnavailableError(
          "register: this coordinator has not confirmed it still holds the store's lock (its lease ran out "
          "unconfirmed); try again in a moment"));
      return;
    }
    // A revoked worker id (trainctl worker revoke) does not come back,
    // whatever credential it registers with.
    if (!reg.worker_id().empty()) {
      if (absl::Status revoked = ctx_.auth->CheckCert(reg.worker_id(), cert_serial_); !revoked.ok()) {
        Close(revoked);
        return;
      }
    }
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
    // connects from, and what the admin authorised for it: its certificate's
    // names (a certificate worker; a joined one's come from its join
    // token), or its token's addresses (a token worker). Never the address
    // it registered: that is the worker's own word (a worker that joined
    // with --address 6.6.6.6 must not send ranks there).
    own_hosts_.clear();
    if (std::string ip = PeerIp(peer_); !ip.empty()) own_hosts_.push_back(ip);
    const std::vector<std::string>& vouched = cert_id_.empty() ? who_.addresses : cert_sans_;
    own_hosts_.insert(own_hosts_.end(), vouched.begin(), vouched.end());
    // A session over an in-process channel (gRPC reports its peer as
    // "unknown"; only code inside the coordinator's process can open one:
    // tests, an embedding program) has no address to check: what it
    // registered is taken, as nobody outside the process can speak there.
    std::string address_refused;
    if (peer_.empty() || peer_ == "unknown" || absl::StartsWith(peer_, "inproc")) {
      own_hosts_.push_back(reg.address().empty() ? reg.hostname() : reg.address());
    } else {
      // The address it registered, judged now: accepted when it is (or
      // resolves to) one of the hosts above, so that a refusal is said at
      // registration, not when a job's rendezvous runs out.
      AddressVerdict verdict = JudgeWorkerAddress(
          reg.address().empty() ? reg.hostname() : reg.address(), PeerIp(peer_), vouched,
          [](const std::string& host) { return ResolveHost(host, kResolveTimeout); });
      if (verdict.accepted) {
        own_hosts_.push_back(verdict.accepted_host);
      } else {
        address_refused = verdict.refused;
        LogEvent(LogLevel::kWarn, "coordinator", "worker_address_refused",
                 {{"worker_id", worker_id_}, {"peer", peer_}, {"address", reg.address()}, {"reason", address_refused}});
      }
    }
    ctx_.registry->SetAddressRefused(worker_id_, address_refused);
    v1::CoordinatorMessage ack;
    ack.mutable_register_ack()->set_worker_id(worker_id_);
    ack.mutable_register_ack()->set_address_refused(address_refused);
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

  void HandleRegistered(const v1::WorkerMessage& msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    if (!ctx_.registry->OwnsSession(worker_id_, this)) {
      Close(absl::FailedPreconditionError("session replaced or expired; reconnect and register"));
      return;
    }
    // While earlier messages wait for the store, a sequenced one waits
    // behind them: the worker's reports are applied in the order it sent them.
    if (!held_.empty() && Sequenced(msg)) {
      Hold({msg}, absl::OkStatus());
      return;
    }
    if (Batched(msg)) {
      // After a failed apply the session is closing (see below).
      if (!telemetry_failed_) ctx_.batcher->Queue(this, worker_id_, msg);
      return;
    }
    switch (msg.msg_case()) {
      case v1::WorkerMessage::kHeartbeat:
        OnHeartbeat(msg.heartbeat());
        RetryHeld();
        return;
      case v1::WorkerMessage::kGoodbye:
        Ended(/*left=*/true);
        Close(absl::OkStatus());
        return;
      default:
        HandleReport(msg);
    }
  }

  // The session's own liveness: renews the lease and answers.
  void OnHeartbeat(const v1::Heartbeat& beat) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    absl::Status s = ctx_.registry->Heartbeat(worker_id_, this);
    if (!s.ok()) {
      Close(s);
      return;
    }
    v1::CoordinatorMessage ack;
    ack.mutable_heartbeat_ack()->set_seq(beat.seq());
    Send(ack);
  }

  // A report (anything but a heartbeat or goodbye). Sequenced telemetry is
  // applied at most once, in one store transaction with its seq, and
  // acknowledged after that commit (TelemetryLedger).
  void HandleReport(const v1::WorkerMessage& msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    const bool sequenced = Sequenced(msg);
    if (!sequenced) {
      LogRefusal(ApplyReport(msg));
      return;
    }
    if (telemetry_failed_) return;  // closing; resent on the next session
    TelemetryLedger::Result r =
        ctx_.telemetry->Apply(worker_id_, msg.seq(), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
          absl::Status s = ApplyReport(msg);
          LogRefusal(s);
          return s;
        });
    if (r.outcome == TelemetryLedger::Outcome::kRetry) {
      Hold({msg}, r.status);
      return;
    }
    AckTelemetry();
  }

  // A bad or stale report is refused without ending the session: the worker
  // may be a step behind (a stale attempt) and everything else it says is
  // still needed. A store failure is the store's to log (StateStore).
  void LogRefusal(const absl::Status& s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    if (s.ok() || s.code() == absl::StatusCode::kAborted || StateStore::IsWriteFailure(s)) return;
    LogEvent(LogLevel::kWarn, "coordinator", "report_refused",
             {{"worker_id", worker_id_}, {"peer", peer_}, {"error", std::string(s.message())}});
  }

  // Sequenced messages a store failure kept from being applied, and every
  // sequenced one after them: kept in seq order and retried (RetryHeld) with
  // backoff, unacknowledged meanwhile (the worker keeps them too). The
  // session, its heartbeats and everything unsequenced go on. Past
  // kMaxHeldBytes the session ends instead (the worker resends on its next
  // one). `why` is OK for a message held only because others wait.
  void Hold(std::vector<v1::WorkerMessage> msgs, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    ctx_.loop->CheckInLoop("a worker session");
    if (telemetry_failed_) return;
    if (held_.empty()) {
      retry_backoff_ = kFirstRetry;
      retry_at_ = ctx_.registry->clock()->Mono() + retry_backoff_;
      if (!why.ok()) {
        LogEvent(LogLevel::kWarn, "coordinator", "telemetry_held",
                 {{"worker_id", worker_id_}, {"from_seq", absl::StrCat(msgs.empty() ? 0 : msgs.front().seq())},
                  {"reason", std::string(why.message())},
                  {"then", "kept unacknowledged and retried; the session stays up"}});
      }
    }
    // Messages come in seq order (a failed batch is handed back before
    // anything later is held), so this is an append; sorted only if not.
    const bool in_order = held_.empty() || msgs.empty() || msgs.front().seq() > held_.back().seq();
    for (v1::WorkerMessage& m : msgs) {
      held_bytes_ += static_cast<int64_t>(m.ByteSizeLong());
      held_.push_back(std::move(m));
    }
    if (!in_order) {
      std::stable_sort(held_.begin(), held_.end(),
                       [](const v1::WorkerMessage& a, const v1::WorkerMessage& b) { return a.seq() < b.seq(); });
    }
    NoteHeld(!held_.empty());
    if (held_bytes_ > kMaxHeldBytes) {
      const int64_t first = held_.front().seq();
      held_.clear();
      held_bytes_ = 0;
      NoteHeld(false);
      TelemetryFailed(first, absl::ResourceExhaustedError(absl::StrCat(
                                 "more than ", kMaxHeldBytes >> 20, " MiB of telemetry waits for the store")));
    }
  }

  // At a heartbeat once the backoff has passed: applies everything held in
  // one store group; acknowledges on success, else backs off (doubling up
  // to kMaxRetry).
  void RetryHeld() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    if (held_.empty() || telemetry_failed_) return;
    const absl::Time now = ctx_.registry->clock()->Mono();
    if (now < retry_at_) return;
    std::vector<TelemetryLedger::Item> items;
    items.reserve(held_.size());
    for (const v1::WorkerMessage& m : held_) {
      items.push_back(
          {worker_id_, m.seq(), [this, &m]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) -> absl::Status {
             absl::Status s = ApplyReport(m);
             LogRefusal(s);
             return s;
           }});
    }
    TelemetryLedger::Result r = ctx_.telemetry->ApplyBatch(items);
    if (r.outcome == TelemetryLedger::Outcome::kRetry) {
      retry_backoff_ = std::min(retry_backoff_ * 2, kMaxRetry);
      retry_at_ = now + retry_backoff_;
      return;
    }
    LogEvent(LogLevel::kInfo, "coordinator", "telemetry_applied_after_wait",
             {{"worker_id", worker_id_}, {"messages", absl::StrCat(held_.size())},
              {"through_seq", absl::StrCat(held_.back().seq())}});
    held_.clear();
    held_bytes_ = 0;
    NoteHeld(false);
    AckTelemetry();
  }

  // Hands one report to its owner; how it went.
  absl::Status ApplyReport(const v1::WorkerMessage& msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    switch (msg.msg_case()) {
      case v1::WorkerMessage::kRankStatus:
        return ctx_.jobs->OnRankStatus(worker_id_, msg.rank_status());
      case v1::WorkerMessage::kRendezvous: {
        absl::Status s = CheckRendezvousHosts(msg.rendezvous().info(), own_hosts_);
        if (!s.ok()) {
          LogEvent(LogLevel::kWarn, "coordinator", "rendezvous_refused",
                   {{"worker_id", worker_id_}, {"peer", peer_}, {"job_id", msg.rendezvous().job_id()},
                    {"reason", std::string(s.message())}});
          // Ranks on other workers could never meet: the attempt fails now
          // (CONFIG, naming the worker and the fix), not when the rendezvous
          // times out.
          return ctx_.jobs->OnRendezvousRefused(worker_id_, msg.rendezvous(), s);
        }
        return ctx_.jobs->OnRendezvous(worker_id_, msg.rendezvous());
      }
      case v1::WorkerMessage::kMetrics:
        return ctx_.jobs->OnMetrics(worker_id_, msg.metrics());
      case v1::WorkerMessage::kLogs:
        return ctx_.jobs->OnLogs(worker_id_, msg.logs());
      case v1::WorkerMessage::kProgress:
        return ctx_.jobs->OnProgress(worker_id_, msg.progress());
      case v1::WorkerMessage::kCheckpoint:
        return ctx_.jobs->OnCheckpoint(worker_id_, msg.checkpoint());
      case v1::WorkerMessage::kFinalModel:
        return ctx_.jobs->OnFinalModel(worker_id_, msg.final_model());
      case v1::WorkerMessage::kFileChunk:
        if (ctx_.fetches != nullptr) ctx_.fetches->OnChunk(worker_id_, msg.file_chunk());
        return absl::OkStatus();
      case v1::WorkerMessage::kPreflight:
        return ctx_.jobs->OnPreflightReport(worker_id_, msg.preflight());
      default:
        return absl::InvalidArgumentError("message: empty or unknown kind");
    }
  }

  // Tells the worker how far its telemetry is applied and committed.
  void AckTelemetry() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    v1::CoordinatorMessage ack;
    ack.mutable_telemetry_ack()->set_seq(ctx_.telemetry->Applied(worker_id_));
    Send(ack);
  }

  // More telemetry waits for the store than a session holds (Hold): end the
  // session so the worker reconnects and resends from its last acknowledged
  // seq.
  void TelemetryFailed(int64_t seq, const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    telemetry_failed_ = true;
    LogEvent(LogLevel::kWarn, "coordinator", "telemetry_session_ended",
             {{"worker_id", worker_id_}, {"peer", peer_}, {"from_seq", absl::StrCat(seq)},
              {"reason", std::string(why.message())}, {"then", "the worker reconnects and resends"}});
    Close(absl::UnavailableError(absl::StrCat("telemetry seq ", seq, " not applied (", why.message(),
                                              "); reconnect and resend")));
  }

  // Tells the job manager whether this session holds reports the store
  // could not take (its hang verdicts wait for them: JobManager::
  // SetReportsHeld); only changes are told.
  void NoteHeld(bool held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    if (held == held_noted_) return;
    held_noted_ = held;
    ctx_.jobs->SetReportsHeld(this, worker_id_, held);
  }

  void Ended(bool left) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    ctx_.loop->CheckInLoop("a worker session");
    // What the worker sent before it left is applied before it is gone.
    if (ctx_.batcher != nullptr) ctx_.batcher->Drain();
    // What it still holds is the worker's again (it resends it).
    NoteHeld(false);
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
  const std::string cert_serial_;
  // Hosts its rendezvous reports may name (set at registration; loop only).
  std::vector<std::string> own_hosts_ ABSL_GUARDED_BY(kLoop);
  v1::WorkerMessage in_;  // gRPC thread (one read in flight).
  // Messages read off the stream (gRPC thread) and handled (loop only):
  // more read than handled means some wait for the loop (Unhandled).
  std::atomic<int64_t> read_{0};
  int64_t handled_ ABSL_GUARDED_BY(kLoop) = 0;

  absl::Mutex mu_;
  std::deque<v1::CoordinatorMessage> out_ ABSL_GUARDED_BY(mu_);
  v1::CoordinatorMessage current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_ ABSL_GUARDED_BY(mu_);

  // Loop only.
  std::string worker_id_ ABSL_GUARDED_BY(kLoop);
  bool ended_ ABSL_GUARDED_BY(kLoop) = false;
  // Closed because its token, certificate or id was revoked (Revoked, or
  // the certificate check in Handle); later messages are dropped.
  bool revoked_ ABSL_GUARDED_BY(kLoop) = false;
  // Held telemetry past its bound: the session is closing, and later
  // messages wait for the resend on the next one.
  bool telemetry_failed_ ABSL_GUARDED_BY(kLoop) = false;
  // Telemetry waiting for the store (Hold, RetryHeld); loop only.
  static constexpr int64_t kMaxHeldBytes = 64 << 20;
  static constexpr absl::Duration kFirstRetry = absl::Milliseconds(500);
  static constexpr absl::Duration kMaxRetry = absl::Seconds(4);
  // How long a registration waits (on the loop) for the resolver to map a
  // worker's address name: /etc/hosts answers at once; a resolver that
  // hangs costs the loop at most this, and the name is refused.
  static constexpr absl::Duration kResolveTimeout = absl::Seconds(1);
  std::vector<v1::WorkerMessage> held_ ABSL_GUARDED_BY(kLoop);
  bool held_noted_ ABSL_GUARDED_BY(kLoop) = false;  // what NoteHeld last told
  int64_t held_bytes_ ABSL_GUARDED_BY(kLoop) = 0;
  absl::Time retry_at_ ABSL_GUARDED_BY(kLoop);
  absl::Duration retry_backoff_ ABSL_GUARDED_BY(kLoop) = kFirstRetry;
  // Tracked in ctx_.live while open (0: not, or already ended by it).
  LiveCalls::Id live_ ABSL_GUARDED_BY(kLoop) = 0;
};

}  // namespace

void ExpelWorker(const ServiceContext& ctx, const std::string& worker_id, const absl::Status& why) {
  ctx.loop->CheckInLoop("a worker session");
  if (ctx.registry->Expel(worker_id, why)) {
    if (ctx.fetches != nullptr) ctx.fetches->WorkerGone(worker_id);
    ctx.jobs->OnWorkerLost(worker_id);
  }
}

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
  return new SessionReactor(ctx_, ctx->peer(), std::move(caller->who), caller->cert_id, std::move(caller->cert_sans),
                            std::move(caller->cert_serial));
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ListWorkers(grpc::CallbackServerContext* ctx,
                                                         const v1::ListWorkersRequest* req,
                                                         v1::ListWorkersResponse* resp) {
  return UnaryOnLoop(ctx_, ctx, "ListWorkers",
                     [this, req, resp](const Principal&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
                       for (v1::Worker& w : ctx_.registry->List(req->include_gone())) {
                         for (int s : ctx_.jobs->BusySlots(w.id())) w.add_busy_slots(s);
                         *resp->add_workers() = std::move(w);
                       }
                       FillStoreHealth(ctx_.store, resp->mutable_store());
                       return absl::OkStatus();
                     });
}

}  // namespace trainctl::coordinator
