// The worker-session protocol: what the coordinator does with each message a
// worker daemon sends on its WorkerService.Session stream, and what it
// answers. A session's first message registers the worker (its identity
// checked against its certificate or token, its address judged); then it
// heartbeats and reports (rank status, rendezvous, metrics, logs, ...),
// which WorkerSession hands to the owners (WorkerRegistry, JobManager,
// TelemetryLedger, ArtifactFetches). Sequenced telemetry is acknowledged
// only after it is committed; what a store failure kept out is held and
// retried with backoff while the session stays up. A certificate revoked
// while the session is open ends it at the worker's next message; a token
// revoked ends it at once (LiveCalls).
//
// The stream itself is a SessionTransport: in the server a SessionReactor
// (worker_service.cc: gRPC's read loop and write queue), in unit tests a
// fake that records what was sent (worker_session_test.cc).
//
// Threading: loop only. Every method runs on the coordinator's loop (kLoop),
// as do the transport calls it makes (the transport is safe from there).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/api/service_support.h"
#include "coordinator/api/services.h"
#include "coordinator/api/telemetry_batcher.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/workers/worker_registry.h"

namespace trainctl::coordinator {

// One Session stream as the protocol sees it. Called on the loop.
class SessionTransport {
 public:
  virtual ~SessionTransport() = default;
  // Queues a message for the worker; never blocks. False once the stream is
  // closing (nothing more goes out).
  virtual bool Send(const v1::CoordinatorMessage& msg) = 0;
  // Ends the stream with `status` after what is queued has gone out. The
  // first call decides the status; later ones are ignored.
  virtual void Close(const absl::Status& status) = 0;
  // True while messages read off the stream wait for the loop (the worker
  // spoke; the loop is behind): see WorkerChannel::Unhandled.
  virtual bool Unhandled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) = 0;
};

// One worker daemon's session. It is the registry's WorkerChannel for that
// worker (what the owners send goes out through it) and the batcher's
// TelemetrySession. Owned by its transport; after Done nothing calls it.
class WorkerSession final : public WorkerChannel, public TelemetrySession {
 public:
  // `peer`: gRPC's peer string ("ipv4:1.2.3.4:5678"; "unknown" or "inproc"
  // for an in-process channel). `caller`: the credentials the call opened
  // with (a certificate worker may register only under its certificate's
  // id). `transport` outlives the session.
  WorkerSession(ServiceContext ctx, SessionTransport* transport, std::string peer,
                WorkerCaller caller);

  // Before any message: tracks the session under its token (ctx.live, when
  // set), so that a revoked or expired token ends it (Revoked).
  void Open() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // One message, in the order the worker sent it.
  void Handle(const v1::WorkerMessage& msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The worker's side ended (it closed, or a message did not parse), after
  // every message read before that was handled. Ends the stream OK, or
  // INVALID_ARGUMENT when no message came at all (NoRegisterRead).
  void ReadsEnded() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The call was cancelled (the connection broke, a deadline, shutdown).
  void Cancelled() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The stream is finished: the last call. Untracks the session and lets
  // nothing queued (TelemetryBatcher) outlive it.
  void Done() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // The worker's id once registered; "" before.
  const std::string& worker_id() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return worker_id_; }
  // How many sequenced messages wait for the store (Hold).
  size_t held() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return held_.size(); }

  // WorkerChannel: to the transport.
  bool Send(const v1::CoordinatorMessage& msg) override { return transport_->Send(msg); }
  void Close(const absl::Status& status) override { transport_->Close(status); }
  bool Unhandled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) override {
    return transport_->Unhandled();
  }

  // TelemetrySession.
  void TelemetryApplied() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) override { AckTelemetry(); }
  void TelemetryNotApplied(std::vector<v1::WorkerMessage> msgs, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) override {
    Hold(std::move(msgs), why);
  }

  // What a stream that ended before its first message, or whose first
  // message did not parse, is answered: INVALID_ARGUMENT.
  static absl::Status NoRegisterRead();

  // Held telemetry: at most this much waits for the store (then the session
  // ends and the worker resends); retried first after kFirstRetry, the wait
  // doubling up to kMaxRetry.
  static constexpr int64_t kMaxHeldBytes = 64 << 20;
  static constexpr absl::Duration kFirstRetry = absl::Milliseconds(500);
  static constexpr absl::Duration kMaxRetry = absl::Seconds(4);

 private:
  bool Sequenced(const v1::WorkerMessage& msg) const;
  bool Batched(const v1::WorkerMessage& msg) const;
  void Revoked(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  bool CertStillValid() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void HandleRegister(const v1::Register& reg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void Refuse(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void Register(const v1::Register& reg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  std::string JudgeHosts(const v1::Register& reg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void SendRegisterAck(const std::string& address_refused) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void HandleRegistered(const v1::WorkerMessage& msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void OnHeartbeat(const v1::Heartbeat& beat) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void HandleReport(const v1::WorkerMessage& msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void LogRefusal(const absl::Status& s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void Hold(std::vector<v1::WorkerMessage> msgs, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void RetryHeld() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::Status ApplyReport(const v1::WorkerMessage& msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::Status ApplyRendezvous(const v1::RendezvousReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void AckTelemetry() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void TelemetryFailed(int64_t seq, const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void NoteHeld(bool held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void SettleTelemetry(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void Ended(bool left) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // How long a registration waits (on the loop) for the resolver to map a
  // worker's address name: /etc/hosts answers at once; a resolver that
  // hangs costs the loop at most this, and the name is refused.
  static constexpr absl::Duration kResolveTimeout = absl::Seconds(1);

  const ServiceContext ctx_;
  SessionTransport* const transport_;
  const std::string peer_;
  const WorkerCaller caller_;

  // Set by the first message (ReadsEnded tells a session from a stream that
  // said nothing).
  bool any_message_ ABSL_GUARDED_BY(kLoop) = false;
  // Set at registration.
  std::string worker_id_ ABSL_GUARDED_BY(kLoop);
  // Hosts its rendezvous reports may name (set at registration).
  std::vector<std::string> own_hosts_ ABSL_GUARDED_BY(kLoop);
  // Told the registry that the session ended (Ended runs once per worker).
  bool ended_ ABSL_GUARDED_BY(kLoop) = false;
  // Closed because its token, certificate or id was revoked (Revoked, or
  // CertStillValid); later messages are dropped.
  bool revoked_ ABSL_GUARDED_BY(kLoop) = false;
  // Held telemetry past its bound: the session is closing, and later
  // messages wait for the resend on the next one.
  bool telemetry_failed_ ABSL_GUARDED_BY(kLoop) = false;
  // Telemetry waiting for the store (Hold, RetryHeld), in seq order.
  std::vector<v1::WorkerMessage> held_ ABSL_GUARDED_BY(kLoop);
  bool held_noted_ ABSL_GUARDED_BY(kLoop) = false;  // what NoteHeld last told
  int64_t held_bytes_ ABSL_GUARDED_BY(kLoop) = 0;
  absl::Time retry_at_ ABSL_GUARDED_BY(kLoop);
  absl::Duration retry_backoff_ ABSL_GUARDED_BY(kLoop) = kFirstRetry;
  // Tracked in ctx_.live while open (0: not, or already ended by it).
  LiveCalls::Id live_ ABSL_GUARDED_BY(kLoop) = 0;
};

}  // namespace trainctl::coordinator
