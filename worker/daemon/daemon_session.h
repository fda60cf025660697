// DaemonSession: the worker daemon's link to its coordinator. Keeps a
// Session stream open: connects, registers (with the worker id kept in the
// work dir, the ranks still running and the telemetry not yet
// acknowledged), heartbeats, writes, hands the coordinator's messages on,
// and reconnects with exponential backoff and full jitter.
//
// Several coordinators (options.coordinator "a:7070,b:7070"): each
// connection goes to the rotation's current address
// (common/coordinator_failover.h). A standby refuses the session naming
// the active coordinator: the next try goes there. An address that cannot
// be reached, or a session that ends, moves the rotation to the next
// address. Registering is the same on every coordinator, so the outbox's
// unacknowledged reports are resent to the new active one as after a
// coordinator restart, and deduplicated there by sequence.
//
// Telemetry is at least once: every report the coordinator must not lose
// (rank status, rendezvous, metrics, logs, progress — anything but
// register, heartbeat, goodbye and file chunks) goes into a TelemetryBuffer
// (the outbox), numbered, and is kept until the coordinator's TelemetryAck;
// after a reconnect the session resends what is not acknowledged, in order.
//
// Threads: the session thread connects, registers and reads; a heartbeat
// thread per registration; the writer thread is the only one that writes to
// the stream. The session thread destroys a stream only after taking it
// away from the writer (stream_ = nullptr) and waiting until no Write is in
// flight (writing_), so nothing touches a finished stream. Send, worker_id
// and connected: any thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/coordinator_failover.h"
#include "common/wake_signal.h"
#include "trainctl/v1/worker_service.grpc.pb.h"
#include "worker/daemon/coordinator_outbox.h"
#include "worker/daemon/daemon_options.h"
#include "worker/daemon/telemetry_buffer.h"

namespace trainctl::worker {

struct SessionHooks {
  // The ranks running now, for a registration (the session thread calls it;
  // the daemon asks its loop).
  std::function<std::vector<v1::RunningRank>()> running_ranks;
  // A coordinator message other than a TelemetryAck (the session thread
  // calls it: hand it on, do not act on it there).
  std::function<void(const v1::CoordinatorMessage&)> on_message;
};

class DaemonSession final : public CoordinatorOutbox {
 public:
  // `options` outlives the session. The worker id is kept in `id_file`.
  DaemonSession(const DaemonOptions& options, std::string id_file, SessionHooks hooks);
  // Stop().
  ~DaemonSession() override;
  DaemonSession(const DaemonSession&) = delete;
  DaemonSession& operator=(const DaemonSession&) = delete;

  // Reads the id an earlier run kept (if any) and starts the threads.
  void Start();
  bool Send(v1::WorkerMessage msg, bool critical) override;
  std::string worker_id() override;
  // The coordinator the session dials now (or is connected to).
  std::string CoordinatorAddress() { return rotation_.Current(); }
  // True while a session is registered.
  bool connected();
  // Waits, at most `timeout`, until the coordinator acknowledged every
  // report or the session is down.
  void AwaitAcknowledged(absl::Duration timeout);
  // Says goodbye and waits, at most `timeout`, for the coordinator to end
  // the session (cancelling the stream earlier may lose the goodbye, and
  // the coordinator then waits out the disconnect grace).
  void SayGoodbye(const std::string& reason, absl::Duration timeout);
  // True once the coordinator ended the session after SayGoodbye: it is
  // not reconnected (said as `session_closed`, not as a broken session).
  bool closed();
  // Ends the session and joins its threads. Idempotent.
  void Stop();
  // Sleeps `wait` unless Stop began; false when it did (for the daemon's
  // other threads, such as certificate renewal).
  bool SleepUnlessStopping(absl::Duration wait);

 private:
  using Stream = grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>;
  void SessionLoop();
  // Registers on `stream` and, once acknowledged, reads it until it ends;
  // true when the coordinator acknowledged the registration.
  bool RunSession(Stream& stream, const std::string& address);
  v1::WorkerMessage RegisterMessage();
  // Takes a registration's acknowledgement: the id, heartbeat and resend point.
  void OnRegistered(const v1::RegisterAck& ack, Stream* stream, int running_ranks,
                    const std::string& address);
  // Sends heartbeats until `stop` (its own thread: a busy loop never delays them).
  void HeartbeatLoop(WakeSignal& stop);
  // Says why a session ended (or never began), and when the next try is.
  void LogSessionEnd(const grpc::Status& st, bool registered, const std::string& address,
                     absl::Duration wait, int64_t& failures);
  void WriterLoop();
  // Waits, at most `timeout` on the daemon clock's Mono(), until `done`
  // (called with mu_ held) is true; whether it is.
  bool AwaitState(absl::FunctionRef<bool()> done, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // Ranks to list as running in a registration: those running now, and
  // those whose end is still unacknowledged telemetry.
  std::vector<v1::RunningRank> RanksForRegister();

  const DaemonOptions& options_;
  const std::string id_file_;
  const SessionHooks hooks_;
  // Which coordinator to dial (the session thread's; thread-safe itself).
  CoordinatorRotation rotation_;

  absl::Mutex mu_;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Notified by Stop() after stopping_ is set: wakes SleepUnlessStopping.
  WakeSignal stop_wake_;
  // Notified after connected_, writing_ or the acknowledged telemetry
  // changes: wakes AwaitState (AwaitAcknowledged, SayGoodbye, the wait for
  // a Write in flight). A WakeSignal, not an absl timed wait: those run on
  // the wall clock here (common/wake_signal.h); a WakeSignal waits on the
  // daemon's clock (options.clock: a test's FakeClock drives the waits).
  WakeSignal state_wake_;
  // SayGoodbye was called: the session the coordinator then ends is not
  // reconnected, and its end is no warning.
  bool said_goodbye_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Unsequenced messages (heartbeats, goodbye, file chunks), sent before telemetry.
  std::deque<v1::WorkerMessage> control_ ABSL_GUARDED_BY(mu_);
  TelemetryBuffer telemetry_ ABSL_GUARDED_BY(mu_);
  // Highest telemetry seq written on the current session (starts at the
  // acknowledged seq at each registration: the rest is resent).
  int64_t sent_seq_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The registered session's stream, for the writer; nullptr while there is
  // none. Invariant: the session thread finishes and destroys a stream only
  // when stream_ no longer points to it and writing_ is false.
  Stream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The writer is inside Write() on stream_ (taken under mu_).
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  std::thread session_;
  std::thread writer_;
};

}  // namespace trainctl::worker
