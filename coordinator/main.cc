// trainctl-coordinator: the control plane. See docs/operator.md.
#include <pthread.h>

#include <csignal>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "common/daemon_flags.h"
#include "common/stop_signals.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/match.h"
#include "common/log.h"
#include "coordinator/coordinator_server.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:7070",
          "host:port to serve gRPC on; port 0 picks a free port (printed at start)");
ABSL_FLAG(std::string, db, "trainctl.db", "SQLite database holding every job, event and worker");
ABSL_FLAG(int, heartbeat_interval_ms, 1000, "how often workers heartbeat");
ABSL_FLAG(int, lease_timeout_ms, 3000, "a worker silent this long is LOST and its ranks fail");
ABSL_FLAG(int64_t, gone_worker_ttl_s, 86400,
          "a LOST or LEFT worker with no ranks is forgotten this long after its last heartbeat");
ABSL_FLAG(int, disconnect_grace_ms, 1000,
          "a worker whose session broke without a goodbye is LOST after this long "
          "(or at its lease, if sooner) unless it reconnects");
ABSL_FLAG(int, recovery_grace_s, 15,
          "after a restart, known workers get this long to reconnect before they are LOST");
ABSL_FLAG(int, progress_timeout_s, 300,
          "a running attempt with no step progress this long is failed as hung (per job: "
          "restart.progress_timeout_s)");
ABSL_FLAG(int, rendezvous_timeout_s, 120, "an attempt whose ranks are not all ready by then fails");
ABSL_FLAG(int, stop_grace_s, 10, "SIGTERM-to-SIGKILL grace for stopped ranks");
ABSL_FLAG(int64_t, max_active_jobs, 100000, "most unfinished jobs held; more are refused");
ABSL_FLAG(int64_t, metric_points_per_job, 100000, "metric points kept per job (older ones downsampled to min/max/last per bucket)");
ABSL_FLAG(int64_t, log_lines_per_rank, 10000, "log lines kept per rank and attempt (oldest dropped)");
ABSL_FLAG(int, max_message_mb, 16, "largest gRPC message accepted or sent");
ABSL_FLAG(std::string, log_level, "info", "service log lines below this level are dropped: debug, info, warn, error");
ABSL_FLAG(std::string, http_listen, "",
          "HOST:PORT of an HTTP endpoint serving /metrics in Prometheus' text format (port 0: a free "
          "one); empty (default): off");

int main(int argc, char** argv) {
  trainctl::ParseDaemonFlags(
      argc, argv,
      "trainctl-coordinator --listen HOST:PORT --db PATH\n"
      "The trainctl control plane: accepts jobs, gang-schedules ranks on worker daemons, runs "
      "the rendezvous, watches health, and stores everything in SQLite.",
      "coordinator/main.cc");
  trainctl::BlockStopSignals();  // before any thread starts (see common/stop_signals.h)
  // Debian's abseil keeps deadlock detection on in release builds; it costs
  // every lock a graph update (about 6% of the coordinator's CPU at 10k workers).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  trainctl::LogLevel level;
  if (!trainctl::ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    std::cerr << "trainctl-coordinator: --log-level: '" << absl::GetFlag(FLAGS_log_level)
              << "' is not one of debug, info, warn, error\n";
    return 2;
  }
  trainctl::SetLogLevel(level);

  trainctl::coordinator::CoordinatorOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.db_path = absl::GetFlag(FLAGS_db);
  o.registry.heartbeat_interval = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms));
  o.registry.lease_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_lease_timeout_ms));
  o.registry.disconnect_grace = absl::Milliseconds(absl::GetFlag(FLAGS_disconnect_grace_ms));
  o.registry.gone_ttl = absl::Seconds(absl::GetFlag(FLAGS_gone_worker_ttl_s));
  if (o.registry.gone_ttl <= absl::ZeroDuration()) {
    std::cerr << "trainctl-coordinator: --gone-worker-ttl-s must be > 0\n";
    return 2;
  }
  o.registry.recovery_grace = absl::Seconds(absl::GetFlag(FLAGS_recovery_grace_s));
  o.jobs.progress_timeout = absl::Seconds(absl::GetFlag(FLAGS_progress_timeout_s));
  o.jobs.rendezvous_timeout = absl::Seconds(absl::GetFlag(FLAGS_rendezvous_timeout_s));
  o.jobs.stop_grace = absl::Seconds(absl::GetFlag(FLAGS_stop_grace_s));
  o.jobs.max_active_jobs = absl::GetFlag(FLAGS_max_active_jobs);
  // A survivor's collective error waits this long for a dead peer's broken
  // stream, so the failure names the lost worker rather than the survivor.
  o.jobs.lost_worker_wait = o.registry.disconnect_grace;
  o.store.max_metric_points_per_job = absl::GetFlag(FLAGS_metric_points_per_job);
  o.store.max_log_lines_per_rank = absl::GetFlag(FLAGS_log_lines_per_rank);
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_mb) << 20;
  o.http_listen = absl::GetFlag(FLAGS_http_listen);
  if (o.registry.heartbeat_interval <= absl::ZeroDuration() ||
      o.registry.lease_timeout <= o.registry.heartbeat_interval) {
    std::cerr << "trainctl-coordinator: --lease-timeout-ms must be greater than "
                 "--heartbeat-interval-ms > 0\n";
    return 2;
  }
  if (o.registry.disconnect_grace < absl::ZeroDuration()) {
    std::cerr << "trainctl-coordinator: --disconnect-grace-ms must be >= 0\n";
    return 2;
  }

  std::signal(SIGPIPE, SIG_IGN);
  trainctl::coordinator::CoordinatorServer server(o);
  absl::StatusOr<std::string> addr = server.Start();
  if (!addr.ok()) {
    std::cerr << "trainctl-coordinator: " << addr.status().message() << "\n";
    return 1;
  }
  std::cout << "trainctl-coordinator listening on " << *addr << std::endl;
  trainctl::LogEvent(trainctl::LogLevel::kInfo, "coordinator", "listening",
                     {{"address", *addr}, {"db", o.db_path}, {"metrics", server.http_address().empty() ? "off" : "http://" + server.http_address() + "/metrics"}});
  if (!server.http_address().empty()) {
    std::cout << "trainctl-coordinator: metrics on http://" << server.http_address() << "/metrics" << std::endl;
  }

  trainctl::WaitForStopSignal();
  trainctl::LogEvent(trainctl::LogLevel::kInfo, "coordinator", "shutting_down", {{"reason", "stop signal"}});
  server.Shutdown();
  return 0;
}
