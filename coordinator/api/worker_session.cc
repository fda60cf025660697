#include "coordinator/api/worker_session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "coordinator/core/peer_address.h"

namespace trainctl::coordinator {

namespace {
constexpr char kWhat[] = "a worker session";
}  // namespace

void ExpelWorker(const ServiceContext& ctx, const std::string& worker_id, const absl::Status& why) {
  AssertOnLoop(ctx.loop, kWhat);
  if (ctx.registry->Expel(worker_id, why)) {
    if (ctx.fetches != nullptr) ctx.fetches->WorkerGone(worker_id);
    ctx.health->OnWorkerLost(worker_id);
  }
}

WorkerSession::WorkerSession(ServiceContext ctx, SessionTransport* transport, std::string peer,
                             WorkerCaller caller)
    : ctx_(ctx), transport_(transport), peer_(std::move(peer)), caller_(std::move(caller)) {}

absl::Status WorkerSession::NoRegisterRead() {
  return absl::InvalidArgumentError(
      "WorkerService/Session: no register message was read (the stream ended before one, or its "
      "first message "
      "is not a trainctl.v1.WorkerMessage)");
}

void WorkerSession::Open() {
  AssertOnLoop(ctx_.loop, kWhat);
  if (ctx_.live == nullptr) return;
  live_ = ctx_.live->Add(caller_.who, [this](const absl::Status& why)
                                          ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { Revoked(why); });
}

void WorkerSession::ReadsEnded() {
  AssertOnLoop(ctx_.loop, kWhat);
  Ended(/*left=*/false);
  // A first message that was not a register already ended the session
  // INVALID_ARGUMENT (the first Close decides); a stream that said nothing
  // is not a session either.
  Close(any_message_ ? absl::OkStatus() : NoRegisterRead());
}

void WorkerSession::Cancelled() {
  AssertOnLoop(ctx_.loop, kWhat);
  Ended(/*left=*/false);
}

void WorkerSession::Done() {
  AssertOnLoop(ctx_.loop, kWhat);
  if (live_ != 0) ctx_.live->Remove(live_);
  live_ = 0;
  Ended(/*left=*/false);
  // Nothing queued may outlive the session it answers to.
  SettleTelemetry(worker_id_);
}

// Waits until the worker's queued telemetry is applied and answered
// (TelemetryBatcher::Settle): what follows counts on its applied seq.
void WorkerSession::SettleTelemetry(const std::string& worker_id) {
  if (ctx_.batcher != nullptr && !worker_id.empty()) ctx_.batcher->Settle(worker_id);
}

bool WorkerSession::Sequenced(const v1::WorkerMessage& msg) const {
  return msg.seq() > 0 && ctx_.telemetry != nullptr;
}

// Sequenced metrics (that make no event), logs and progress go through the
// group commit.
bool WorkerSession::Batched(const v1::WorkerMessage& msg) const {
  return ctx_.batcher != nullptr && ctx_.telemetry != nullptr && TelemetryBatcher::Batches(msg);
}

// The token this session opened with was revoked or expired: the worker is
// disconnected, nothing more it sends is applied, and its reconnects are
// refused (the token no longer authenticates), so the registry declares it
// LOST after the disconnect grace and its ranks are rescheduled.
void WorkerSession::Revoked(const absl::Status& why) {
  AssertOnLoop(ctx_.loop, kWhat);
  live_ = 0;
  revoked_ = true;
  LogEvent(LogLevel::kWarn, "coordinator", "worker_session_revoked",
           {{"worker_id", worker_id_.empty() ? "(unregistered)" : worker_id_},
            {"peer", peer_},
            {"reason", std::string(why.message())}});
  Close(why);
}

void WorkerSession::Handle(const v1::WorkerMessage& msg) {
  AssertOnLoop(ctx_.loop, kWhat);
  any_message_ = true;
  if (revoked_) return;
  // Everything but a heartbeat and a queued report waits for what the
  // worker queued: its messages are applied in the order it sent them, and
  // a RegisterAck's applied seq covers what was queued (a register names
  // the worker it will be: its certificate's id, or the id it asks for).
  if (!msg.has_heartbeat() && !Batched(msg)) {
    SettleTelemetry(!worker_id_.empty()        ? worker_id_
                    : !caller_.cert_id.empty() ? caller_.cert_id
                                               : msg.register_().worker_id());
  }
  if (!CertStillValid()) return;
  if (msg.has_register_()) {
    HandleRegister(msg.register_());
    return;
  }
  if (worker_id_.empty()) {
    Close(absl::InvalidArgumentError("the first message of a session must be register"));
    return;
  }
  HandleRegistered(msg);
}

// A revoked certificate (trainctl worker revoke) is checked on every
// message, not only when the session opened: the revocation may come while
// it is open. False (the session is closed, the worker expelled) when it was.
bool WorkerSession::CertStillValid() {
  const std::string& id = caller_.cert_id.empty() ? worker_id_ : caller_.cert_id;
  absl::Status revoked = ctx_.auth->CheckCert(id, caller_.cert_serial);
  if (revoked.ok()) return true;
  revoked_ = true;
  LogEvent(
      LogLevel::kWarn, "coordinator", "worker_revoked_refused",
      {{"worker_id", worker_id_}, {"peer", peer_}, {"reason", std::string(revoked.message())}});
  Close(revoked);
  if (!worker_id_.empty()) ExpelWorker(ctx_, worker_id_, revoked);
  return false;
}

void WorkerSession::HandleRegister(const v1::Register& reg) {
  if (!worker_id_.empty()) {
    Close(absl::FailedPreconditionError("register: already registered on this session"));
    return;
  }
  // A worker with a certificate is the id its certificate names (the
  // cluster CA signed it for that id) and nothing else.
  const std::string& cert_id = caller_.cert_id;
  if (!cert_id.empty()) {
    if (!reg.worker_id().empty() && reg.worker_id() != cert_id) {
      Refuse(absl::PermissionDeniedError(
          absl::StrCat("register: this worker's certificate is for '", cert_id,
                       "'; it may not register as '", reg.worker_id(), "'")));
      return;
    }
    v1::Register mine = reg;
    mine.set_worker_id(cert_id);
    Register(mine);
    return;
  }
  // Without one, a worker id belongs to the token that first registered
  // it: another token cannot take it over (not even after a restart).
  if (!reg.worker_id().empty()) {
    if (absl::Status mine = ctx_.auth->CheckWorker(reg.worker_id(), caller_.who); !mine.ok()) {
      Refuse(mine);
      return;
    }
  }
  Register(reg);
}

void WorkerSession::Refuse(const absl::Status& why) {
  LogEvent(LogLevel::kWarn, "coordinator", "registration_refused",
           {{"peer", peer_}, {"error", std::string(why.message())}});
  Close(why);
}

// Registers (identity already checked), binds a token worker's id, acks.
void WorkerSession::Register(const v1::Register& reg) {
  // A coordinator unsure it still holds the store (its lease ran out
  // unconfirmed: stopped, or cut off from the database) takes no worker as
  // active: another coordinator may be active now. The worker retries.
  if (!ctx_.store->lease_confirmed()) {
    Close(
        absl::UnavailableError("register: this coordinator has not confirmed it still holds the "
                               "store's lock (its lease ran out "
                               "unconfirmed); try again in a moment"));
    return;
  }
  // A revoked worker id (trainctl worker revoke) does not come back,
  // whatever credential it registers with.
  if (!reg.worker_id().empty()) {
    if (absl::Status revoked = ctx_.auth->CheckCert(reg.worker_id(), caller_.cert_serial);
        !revoked.ok()) {
      Close(revoked);
      return;
    }
  }
  absl::StatusOr<std::string> id = ctx_.registry->Register(reg, this);
  if (!id.ok()) {
    Close(id.status());
    return;
  }
  if (caller_.cert_id.empty()) {
    if (absl::Status bound = ctx_.auth->BindWorker(*id, caller_.who); !bound.ok()) {
      Close(bound);
      return;
    }
  }
  worker_id_ = *id;
  const std::string address_refused = JudgeHosts(reg);
  ctx_.registry->SetAddressRefused(worker_id_, address_refused);
  SendRegisterAck(address_refused);
  ctx_.jobs->OnWorkerRegistered(worker_id_, reg);
}

// Sets the hosts this worker may name in rendezvous reports: the address it
// connects from, and what the admin authorised for it: its certificate's
// names (a certificate worker; a joined one's come from its join token), or
// its token's addresses (a token worker). Never the address it registered:
// that is the worker's own word (a worker that joined with --address
// 6.6.6.6 must not send ranks there). Returns why its registered address is
// refused ("" when accepted).
std::string WorkerSession::JudgeHosts(const v1::Register& reg) {
  own_hosts_.clear();
  if (std::string ip = PeerIp(peer_); !ip.empty()) own_hosts_.push_back(ip);
  const std::vector<std::string>& vouched =
      caller_.cert_id.empty() ? caller_.who.addresses : caller_.cert_sans;
  own_hosts_.insert(own_hosts_.end(), vouched.begin(), vouched.end());
  const std::string& registered = reg.address().empty() ? reg.hostname() : reg.address();
  // A session over an in-process channel (gRPC reports its peer as
  // "unknown"; only code inside the coordinator's process can open one:
  // tests, an embedding program) has no address to check: what it
  // registered is taken, as nobody outside the process can speak there.
  if (peer_.empty() || peer_ == "unknown" || absl::StartsWith(peer_, "inproc")) {
    own_hosts_.push_back(registered);
    return "";
  }
  // The address it registered, judged now: accepted when it is (or
  // resolves to) one of the hosts above, so that a refusal is said at
  // registration, not when a job's rendezvous runs out.
  AddressVerdict verdict = JudgeWorkerAddress(
      registered, PeerIp(peer_), vouched,
      [](const std::string& host) { return ResolveHost(host, kResolveTimeout); });
  if (verdict.accepted) {
    own_hosts_.push_back(verdict.accepted_host);
    return "";
  }
  LogEvent(LogLevel::kWarn, "coordinator", "worker_address_refused",
           {{"worker_id", worker_id_},
            {"peer", peer_},
            {"address", reg.address()},
            {"reason", verdict.refused}});
  return verdict.refused;
}

void WorkerSession::SendRegisterAck(const std::string& address_refused) {
  v1::CoordinatorMessage ack;
  v1::RegisterAck* a = ack.mutable_register_ack();
  a->set_worker_id(worker_id_);
  a->set_address_refused(address_refused);
  const WorkerRegistry::LeaseTerms terms = ctx_.registry->TermsOf(worker_id_);
  a->set_heartbeat_interval_ms(
      static_cast<int32_t>(absl::ToInt64Milliseconds(terms.heartbeat_interval)));
  a->set_lease_timeout_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(terms.lease_timeout)));
  if (ctx_.telemetry != nullptr) a->set_telemetry_acked_seq(ctx_.telemetry->Applied(worker_id_));
  Send(ack);
}

void WorkerSession::HandleRegistered(const v1::WorkerMessage& msg) {
  if (!ctx_.registry->OwnsSession(worker_id_, this)) {
    Close(absl::FailedPreconditionError("session replaced or expired; reconnect and register"));
    return;
  }
  // While earlier messages wait for the store, a sequenced one waits behind
  // them: the worker's reports are applied in the order it sent them.
  if (!held_.empty() && Sequenced(msg)) {
    Hold({msg}, absl::OkStatus());
    return;
  }
  if (Batched(msg)) {
    // After a failed apply the session is closing (TelemetryFailed).
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
void WorkerSession::OnHeartbeat(const v1::Heartbeat& beat) {
  absl::StatusOr<std::optional<WorkerRegistry::LeaseTerms>> terms =
      ctx_.registry->Heartbeat(worker_id_, this);
  if (!terms.ok()) {
    Close(terms.status());
    return;
  }
  v1::CoordinatorMessage ack;
  v1::HeartbeatAck* a = ack.mutable_heartbeat_ack();
  a->set_seq(beat.seq());
  if (terms->has_value()) {  // the fleet's size changed them
    a->set_heartbeat_interval_ms(
        static_cast<int32_t>(absl::ToInt64Milliseconds((*terms)->heartbeat_interval)));
    a->set_lease_timeout_ms(
        static_cast<int32_t>(absl::ToInt64Milliseconds((*terms)->lease_timeout)));
  }
  Send(ack);
}

// A report (anything but a heartbeat or goodbye). Sequenced telemetry is
// applied at most once, in one store transaction with its seq, and
// acknowledged after that commit (TelemetryLedger).
void WorkerSession::HandleReport(const v1::WorkerMessage& msg) {
  if (!Sequenced(msg)) {
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
void WorkerSession::LogRefusal(const absl::Status& s) const {
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
void WorkerSession::Hold(std::vector<v1::WorkerMessage> msgs, const absl::Status& why) {
  AssertOnLoop(ctx_.loop, kWhat);
  if (telemetry_failed_) return;
  if (held_.empty()) {
    retry_backoff_ = kFirstRetry;
    retry_at_ = ctx_.registry->clock()->Mono() + retry_backoff_;
    if (!why.ok()) {
      LogEvent(LogLevel::kWarn, "coordinator", "telemetry_held",
               {{"worker_id", worker_id_},
                {"from_seq", absl::StrCat(msgs.empty() ? 0 : msgs.front().seq())},
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
    std::stable_sort(
        held_.begin(), held_.end(),
        [](const v1::WorkerMessage& a, const v1::WorkerMessage& b) { return a.seq() < b.seq(); });
  }
  NoteHeld(!held_.empty());
  if (held_bytes_ > kMaxHeldBytes) {
    const int64_t first = held_.front().seq();
    held_.clear();
    held_bytes_ = 0;
    NoteHeld(false);
    TelemetryFailed(
        first, absl::ResourceExhaustedError(absl::StrCat("more than ", kMaxHeldBytes >> 20,
                                                         " MiB of telemetry waits for the store")));
  }
}

// At a heartbeat once the backoff has passed: applies everything held in
// one store group; acknowledges on success, else backs off (doubling up to
// kMaxRetry).
void WorkerSession::RetryHeld() {
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
           {{"worker_id", worker_id_},
            {"messages", absl::StrCat(held_.size())},
            {"through_seq", absl::StrCat(held_.back().seq())}});
  held_.clear();
  held_bytes_ = 0;
  NoteHeld(false);
  AckTelemetry();
}

// Hands one report to its owner; how it went.
absl::Status WorkerSession::ApplyReport(const v1::WorkerMessage& msg) {
  switch (msg.msg_case()) {
    case v1::WorkerMessage::kRankStatus:
      return ctx_.jobs->OnRankStatus(worker_id_, msg.rank_status());
    case v1::WorkerMessage::kRendezvous:
      return ApplyRendezvous(msg.rendezvous());
    case v1::WorkerMessage::kMetrics:
      return ctx_.ingest->OnMetrics(worker_id_, msg.metrics());
    case v1::WorkerMessage::kLogs:
      return ctx_.ingest->OnLogs(worker_id_, msg.logs());
    case v1::WorkerMessage::kProgress:
      return ctx_.ingest->OnProgress(worker_id_, msg.progress());
    case v1::WorkerMessage::kCheckpoint:
      return ctx_.jobs->OnCheckpoint(worker_id_, msg.checkpoint());
    case v1::WorkerMessage::kFinalModel:
      return ctx_.jobs->OnFinalModel(worker_id_, msg.final_model());
    case v1::WorkerMessage::kFileChunk:
      if (ctx_.fetches != nullptr) ctx_.fetches->OnChunk(worker_id_, msg.file_chunk());
      return absl::OkStatus();
    case v1::WorkerMessage::kPreflight:
      return ctx_.starter->OnPreflightReport(worker_id_, msg.preflight());
    default:
      return absl::InvalidArgumentError("message: empty or unknown kind");
  }
}

// A rendezvous report may name only this worker's own hosts (JudgeHosts).
absl::Status WorkerSession::ApplyRendezvous(const v1::RendezvousReport& report) {
  absl::Status s = CheckRendezvousHosts(report.info(), own_hosts_);
  if (s.ok()) return ctx_.starter->OnRendezvous(worker_id_, report);
  LogEvent(LogLevel::kWarn, "coordinator", "rendezvous_refused",
           {{"worker_id", worker_id_},
            {"peer", peer_},
            {"job_id", report.job_id()},
            {"reason", std::string(s.message())}});
  // Ranks on other workers could never meet: the attempt fails now
  // (CONFIG, naming the worker and the fix), not when the rendezvous times
  // out.
  return ctx_.starter->OnRendezvousRefused(worker_id_, report, s);
}

// Tells the worker how far its telemetry is applied and committed.
void WorkerSession::AckTelemetry() {
  v1::CoordinatorMessage ack;
  ack.mutable_telemetry_ack()->set_seq(ctx_.telemetry->Applied(worker_id_));
  Send(ack);
}

// More telemetry waits for the store than a session holds (Hold): end the
// session so the worker reconnects and resends from its last acknowledged
// seq.
void WorkerSession::TelemetryFailed(int64_t seq, const absl::Status& why) {
  telemetry_failed_ = true;
  LogEvent(LogLevel::kWarn, "coordinator", "telemetry_session_ended",
           {{"worker_id", worker_id_},
            {"peer", peer_},
            {"from_seq", absl::StrCat(seq)},
            {"reason", std::string(why.message())},
            {"then", "the worker reconnects and resends"}});
  Close(absl::UnavailableError(absl::StrCat("telemetry seq ", seq, " not applied (", why.message(),
                                            "); reconnect and resend")));
}

// Tells the job manager whether this session holds reports the store could
// not take (its hang verdicts wait for them: JobManager::SetReportsHeld);
// only changes are told.
void WorkerSession::NoteHeld(bool held) {
  if (held == held_noted_) return;
  held_noted_ = held;
  ctx_.jobs->SetReportsHeld(this, worker_id_, held);
}

void WorkerSession::Ended(bool left) {
  AssertOnLoop(ctx_.loop, kWhat);
  // What the worker sent before it left is applied before it is gone.
  SettleTelemetry(worker_id_);
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

}  // namespace trainctl::coordinator
