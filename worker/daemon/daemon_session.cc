// DaemonSession (daemon_session.h): connect, register, read, heartbeat,
// write, reconnect.
//
// Threading: SessionLoop, RunSession and its helpers run on the session
// thread; HeartbeatLoop on a thread the session starts per registration;
// WriterLoop on the writer thread, the only one that writes to a registered
// stream; Send on any thread. Shared state is mu_'s.
#include "worker/daemon/daemon_session.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/auth/secret.h"
#include "common/clock.h"
#include "common/coordinator_failover.h"
#include "common/grpc_keepalive.h"
#include "common/log.h"
#include "common/safe_file.h"
#include "worker/daemon/cgroup_limits.h"

namespace trainctl::worker {
namespace {

// A rank's final status (the kind that travels with a re-registration).
bool IsEnd(const v1::WorkerMessage& m) {
  if (!m.has_rank_status()) return false;
  v1::RankState s = m.rank_status().state();
  return s == v1::RANK_STATE_SUCCEEDED || s == v1::RANK_STATE_FAILED || s == v1::RANK_STATE_STOPPED;
}

// "UNAVAILABLE" for a status without a message.
std::string GrpcCodeText(grpc::StatusCode code) {
  return absl::StrCat("gRPC code ", static_cast<int>(code));
}

// The coordinator refused this worker (not a network failure).
bool IsRefusal(grpc::StatusCode code) {
  return code == grpc::StatusCode::ALREADY_EXISTS || code == grpc::StatusCode::INVALID_ARGUMENT ||
         code == grpc::StatusCode::UNAUTHENTICATED || code == grpc::StatusCode::PERMISSION_DENIED;
}

// main checked the list (naming --coordinator); `trainctl run` passes one
// address it made itself.
std::vector<std::string> CoordinatorList(const std::string& text) {
  absl::StatusOr<std::vector<std::string>> list = ParseCoordinatorList(text, "--coordinator");
  return list.ok() ? *list : std::vector<std::string>{text};
}

}  // namespace

DaemonSession::DaemonSession(const DaemonOptions& options, std::string id_file, SessionHooks hooks)
    : options_(options),
      id_file_(std::move(id_file)),
      hooks_(std::move(hooks)),
      rotation_(CoordinatorList(options.coordinator)),
      telemetry_(options.telemetry_buffer_bytes) {}

DaemonSession::~DaemonSession() { Stop(); }

void DaemonSession::Start() {
  std::ifstream in(id_file_);
  std::string id;
  if (in >> id) {
    absl::MutexLock lock(&mu_);
    worker_id_ = id;
  }
  session_ = std::thread([this] { SessionLoop(); });
  writer_ = std::thread([this] { WriterLoop(); });
}

std::string DaemonSession::worker_id() {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

bool DaemonSession::connected() {
  absl::MutexLock lock(&mu_);
  return connected_;
}

bool DaemonSession::AwaitState(absl::FunctionRef<bool()> done, absl::Duration timeout) {
  const Clock& clock = DaemonClock(options_);
  const absl::Time until = clock.Mono() + timeout;
  while (true) {
    uint64_t seen = 0;
    {
      absl::MutexLock lock(&mu_);
      if (done()) return true;
      seen = state_wake_.generation();  // read under mu_: a change after it wakes the wait
    }
    if (clock.Mono() >= until) return false;
    state_wake_.WaitUntil(seen, until, clock);
  }
}

void DaemonSession::AwaitAcknowledged(absl::Duration timeout) {
  auto flushed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return telemetry_.empty() || !connected_;
  };
  AwaitState(flushed, timeout);
}

void DaemonSession::SayGoodbye(const std::string& reason, absl::Duration timeout) {
  v1::WorkerMessage bye;
  bye.mutable_goodbye()->set_reason(reason);
  {
    absl::MutexLock lock(&mu_);
    said_goodbye_ = true;
  }
  Send(bye, true);
  // The coordinator ends the session when it has read the goodbye.
  auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !connected_; };
  AwaitState(ended, timeout);
}

bool DaemonSession::closed() {
  absl::MutexLock lock(&mu_);
  return closed_;
}

void DaemonSession::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (ctx_ != nullptr) ctx_->TryCancel();
  }
  stop_wake_.Notify();  // SleepUnlessStopping returns now
  if (session_.joinable()) session_.join();
  if (writer_.joinable()) writer_.join();
}

bool DaemonSession::Send(v1::WorkerMessage msg, bool critical) {
  absl::MutexLock lock(&mu_);
  // A file chunk answers a fetch of this session: not telemetry to replay.
  if (msg.has_heartbeat() || msg.has_goodbye() || msg.has_file_chunk()) {
    if (!connected_ && !critical) return false;  // A heartbeat is only worth sending now.
    control_.push_back(std::move(msg));
    return true;
  }
  telemetry_.Append(std::move(msg));
  return true;
}

void DaemonSession::WriterLoop() {
  while (true) {
    v1::WorkerMessage msg;
    Stream* stream = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || (stream_ != nullptr &&
                             (!control_.empty() || telemetry_.NextAfter(sent_seq_, nullptr)));
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      if (!control_.empty()) {
        msg = std::move(control_.front());
        control_.pop_front();
      } else {
        telemetry_.NextAfter(sent_seq_, &msg);
        // Sent once per session; a resend happens only on the next one.
        sent_seq_ = msg.seq();
      }
      stream = stream_;
      writing_ = true;
    }
    bool ok = stream->Write(msg);
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok && stream_ == stream) {
      // The stream broke: the session thread sees it on its Read, ends the
      // session and reconnects. Nothing more goes on this stream.
      stream_ = nullptr;
      connected_ = false;
    }
    state_wake_.Notify();
  }
}

std::vector<v1::RunningRank> DaemonSession::RanksForRegister() {
  std::vector<v1::RunningRank> running = hooks_.running_ranks();
  // A rank whose end the coordinator has not acknowledged is still running
  // as far as it knows: its end follows on the stream, after the metrics and
  // logs sent before it (listing it as ended would apply the end first).
  absl::MutexLock lock(&mu_);
  telemetry_.ForEach([&](const v1::WorkerMessage& m) {
    if (!IsEnd(m)) return;
    const v1::RankStatus& st = m.rank_status();
    for (const v1::RunningRank& r : running) {
      if (r.job_id() == st.job_id() && r.attempt() == st.attempt() && r.rank() == st.rank()) return;
    }
    AboutRank(&running.emplace_back(), st.job_id(), st.attempt(), st.rank())->set_pid(st.pid());
  });
  return running;
}

void DaemonSession::SessionLoop() {
  std::mt19937_64 rng(std::random_device{}());
  absl::Duration backoff = options_.reconnect_min;
  int64_t failures = 0;  // connection attempts in a row that did not register
  grpc::ChannelArguments args;
  SetKeepalive(args, kSessionKeepalive);
  // Each connection attempt gets a channel of its own with a subchannel of
  // its own: a channel kept across attempts remembers its failures, and
  // gRPC's own reconnect backoff then fails calls with the last error for
  // seconds after the coordinator answers again. A fresh one dials at once,
  // so the reconnect is bounded by our backoff (capped at reconnect_max).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auth::ChannelSecurity security;
  security.token = options_.token;
  security.ca_file = options_.ca_file;
  security.cert_file = options_.cert_file;
  security.key_file = options_.key_file;
  while (true) {
    // The coordinator to try: the active one a standby named, else the
    // list's current entry. Over TLS each is verified for its own host name
    // (no target name override).
    const std::string address = rotation_.Current();
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        auth::MakeChannel(address, security, args);
    if (!channel.ok()) {
      // Checked by main before the daemon starts: a file removed or being
      // replaced since then. Said, and tried again after the backoff.
      LogEvent(LogLevel::kWarn, "worker", "coordinator_channel",
               {{"coordinator", address}, {"reason", std::string(channel.status().message())}});
      if (!SleepUnlessStopping(backoff)) return;
      backoff = std::min(backoff * 2, options_.reconnect_max);
      continue;
    }
    auto stub = v1::WorkerService::NewStub(*channel);
    grpc::ClientContext ctx;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      ctx_ = &ctx;
    }
    std::unique_ptr<Stream> stream = stub->Session(&ctx);
    const bool registered = RunSession(*stream, address);
    if (registered) {
      backoff = options_.reconnect_min;
      failures = 0;
      rotation_.Answered(address);
    }
    // Take the stream away from the writer and wait for a Write in flight:
    // then nothing else touches the stream. The read side has ended, so such
    // a Write returns; only one stuck past a second is cancelled (a cancel
    // would replace the coordinator's reason, which Finish reports, with
    // CANCELLED).
    {
      absl::MutexLock lock(&mu_);
      connected_ = false;
      stream_ = nullptr;  // the writer starts no new Write from here on
      ctx_ = nullptr;
      control_.clear();  // Heartbeats of this session; a goodbye has no session left to end.
      state_wake_.Notify();
    }
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !writing_; };
    if (!AwaitState(idle, absl::Seconds(1))) {
      ctx.TryCancel();
      AwaitState(idle, absl::InfiniteDuration());
    }
    grpc::Status st = stream->Finish();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      if (said_goodbye_) {
        // The end the goodbye asked for: the daemon is on its way out.
        closed_ = true;
        LogEvent(LogLevel::kInfo, "worker", "session_closed",
                 {{"coordinator", address}, {"status", GrpcCodeText(st.error_code())}});
        return;
      }
    }
    // Where to reconnect: where a standby points, else (the address could
    // not be reached, refused a session as a standby, or the session
    // ended) the next address of the list; with one address, that one.
    // The same backoff either way, and the same registration: the outbox's
    // unacknowledged reports are resent to whichever coordinator is active.
    std::optional<std::string> hint = ActiveCoordinatorHint(st, ctx);
    if (hint.has_value()) {
      LogEvent(LogLevel::kInfo, "worker", "coordinator_standby",
               {{"coordinator", address}, {"active", *hint}});
      rotation_.Follow(*hint);
    } else if (!IsRefusal(st.error_code())) {
      rotation_.Unreachable(address);
    }
    // Exponential backoff with full jitter.
    absl::Duration wait = absl::Milliseconds(std::uniform_int_distribution<int64_t>(
        absl::ToInt64Milliseconds(backoff) / 2, absl::ToInt64Milliseconds(backoff))(rng));
    LogSessionEnd(st, registered, address, wait, failures);
    if (!SleepUnlessStopping(wait)) return;
    backoff = std::min(backoff * 2, options_.reconnect_max);
  }
}

v1::WorkerMessage DaemonSession::RegisterMessage() {
  v1::WorkerMessage reg;
  v1::Register* r = reg.mutable_register_();
  r->set_worker_id(worker_id());
  r->set_hostname(options_.hostname);
  r->set_address(options_.address);
  for (const v1::Slot& s : options_.slots) *r->add_slots() = s;
  for (const auto& [k, v] : options_.labels) (*r->mutable_labels())[k] = v;
  r->set_version(options_.version);
  r->set_allow_commands(options_.allow_commands);
  *r->mutable_allocatable() = AllocatableHere(options_.cgroup_root);
  for (v1::RunningRank& rr : RanksForRegister()) *r->add_running() = std::move(rr);
  return reg;
}

bool DaemonSession::RunSession(Stream& stream, const std::string& address) {
  v1::WorkerMessage reg = RegisterMessage();
  const int running = reg.register_().running_size();
  {
    absl::MutexLock lock(&mu_);
    LogEvent(LogLevel::kDebug, "worker", "registering",
             {{"running_ranks", absl::StrCat(running)},
              {"unacknowledged_reports", absl::StrCat(telemetry_.size())}});
  }
  v1::CoordinatorMessage in;
  // Only this thread uses the stream until stream_ is set in OnRegistered.
  if (!stream.Write(reg) || !stream.Read(&in) || !in.has_register_ack()) return false;
  OnRegistered(in.register_ack(), &stream, running, address);
  WakeSignal hb_stop;
  std::thread heartbeat([this, &hb_stop] { HeartbeatLoop(hb_stop); });
  while (stream.Read(&in)) {
    if (in.has_heartbeat_ack() && in.heartbeat_ack().heartbeat_interval_ms() > 0) {
      // The coordinator's new terms (its fleet grew or shrank): kept from the
      // next heartbeat on.
      absl::MutexLock lock(&mu_);
      heartbeat_interval_ =
          absl::Milliseconds(std::max(50, in.heartbeat_ack().heartbeat_interval_ms()));
      LogEvent(LogLevel::kDebug, "worker", "heartbeat_interval_changed",
               {{"heartbeat", absl::FormatDuration(heartbeat_interval_)},
                {"lease",
                 absl::FormatDuration(absl::Milliseconds(in.heartbeat_ack().lease_timeout_ms()))}});
    }
    if (in.has_telemetry_ack()) {
      absl::MutexLock lock(&mu_);
      telemetry_.Ack(in.telemetry_ack().seq());
      state_wake_.Notify();
      continue;
    }
    hooks_.on_message(in);
  }
  hb_stop.Notify();
  heartbeat.join();
  return true;
}

void DaemonSession::OnRegistered(const v1::RegisterAck& ack, Stream* stream, int running_ranks,
                                 const std::string& address) {
  {
    absl::MutexLock lock(&mu_);
    worker_id_ = ack.worker_id();
    heartbeat_interval_ = absl::Milliseconds(std::max(50, ack.heartbeat_interval_ms()));
    telemetry_.OnRegistered(ack.telemetry_acked_seq());
    sent_seq_ = telemetry_.acked();  // Resend everything not acknowledged.
    stream_ = stream;
    connected_ = true;
    state_wake_.Notify();
  }
  {
    absl::MutexLock lock(&mu_);
    LogEvent(LogLevel::kInfo, "worker", "registered",
             {{"worker_id", ack.worker_id()},
              {"coordinator", address},
              {"running_ranks", absl::StrCat(running_ranks)},
              {"unacknowledged_reports", absl::StrCat(telemetry_.size())},
              {"heartbeat", absl::FormatDuration(heartbeat_interval_)}});
  }
  // Said at every registration while it holds: jobs spanning this worker
  // and another fail (CONFIG) until its --address is fixed.
  if (!ack.address_refused().empty()) {
    LogEvent(LogLevel::kWarn, "worker", "address_refused",
             {{"address", options_.address}, {"reason", ack.address_refused()}});
  }
  // 0600, as the daemon's other files: not for its ranks (--rank-user) to
  // read. Kept so a restart registers as the same worker (and its ranks' reports
  // are accepted). A failure does not stop this session, but is said: the
  // next start would take a new id and lose this one's ranks.
  SafeWriteOptions id_options = PrivateFile();
  id_options.env = options_.file_env;
  if (absl::Status w = WriteFileSafely(id_file_, absl::StrCat(ack.worker_id(), "\n"), id_options);
      !w.ok()) {
    LogEvent(LogLevel::kError, "worker", "worker_id_not_saved",
             {{"worker_id", ack.worker_id()}, {"error", std::string(w.message())}});
  }
}

void DaemonSession::HeartbeatLoop(WakeSignal& stop) {
  int64_t seq = 0;
  while (true) {
    v1::WorkerMessage hb;
    hb.mutable_heartbeat()->set_seq(++seq);
    Send(hb, false);
    absl::Duration d;
    {
      absl::MutexLock lock(&mu_);
      d = heartbeat_interval_;
    }
    // Monotonic (the clock's Mono): a wall clock stepped back must not hold
    // heartbeats up. The signal is fresh per session: any Notify stops it.
    const Clock& clock = DaemonClock(options_);
    if (stop.WaitUntil(0, clock.Mono() + d, clock)) return;
  }
}

void DaemonSession::LogSessionEnd(const grpc::Status& st, bool registered,
                                  const std::string& address, absl::Duration wait,
                                  int64_t& failures) {
  // Said at once and at every retry: an operator sees why nothing runs.
  const std::string reason =
      st.error_message().empty() ? GrpcCodeText(st.error_code()) : st.error_message();
  if (IsRefusal(st.error_code())) {
    LogEvent(
        LogLevel::kError, "worker", "registration_refused",
        {{"coordinator", address}, {"reason", reason}, {"retry_in", absl::FormatDuration(wait)}});
  } else if (registered) {
    LogEvent(
        LogLevel::kWarn, "worker", "session_ended",
        {{"coordinator", address}, {"reason", reason}, {"retry_in", absl::FormatDuration(wait)}});
  } else {
    ++failures;
    LogEvent(LogLevel::kWarn, "worker", "coordinator_unreachable",
             {{"coordinator", address},
              {"reason", reason},
              {"attempt", absl::StrCat(failures)},
              {"retry_in", absl::FormatDuration(wait)}});
  }
}

bool DaemonSession::SleepUnlessStopping(absl::Duration wait) {
  const Clock& clock = DaemonClock(options_);
  const absl::Time until = clock.Mono() + wait;
  while (true) {
    uint64_t seen = 0;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return false;
      seen = stop_wake_.generation();  // read under mu_: a Stop after it wakes the wait
    }
    if (clock.Mono() >= until) return true;
    stop_wake_.WaitUntil(seen, until, clock);
  }
}

}  // namespace trainctl::worker
