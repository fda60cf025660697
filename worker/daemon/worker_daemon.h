// trainctl-worker: one daemon per host. Registers the host's slots with the
// coordinator, launches and supervises one rank process per assigned rank,
// produces the rendezvous data on rank 0's host, and forwards rank status,
// metrics (batched, bounded rate) and logs (rate limited, bounded memory) to
// the coordinator.
//
// WorkerDaemon holds only wiring, as CoordinatorServer does; its owners:
//  - DaemonSession (daemon_session.h): the coordinator link: connect,
//    register, heartbeats, reconnect with backoff, and the outbox of
//    sequenced, acknowledged telemetry (at least once, resent after a
//    reconnect).
//  - RankTable (rank_table.h): the ranks: one record per attempt, one
//    LocalRankState per rank, the rendezvous flow, status lines, logs,
//    metrics, pre-flight, artifact serving.
//  - RankSupervisor (rank_supervisor.h), the RankTable's RankLauncher: the
//    processes, their output and exits.
//  - the EventLoop all rank state lives on, and the /metrics HTTP server.
//
// Threads: the RankTable runs on the loop; the supervisor's monitor and the
// session's reader only post to it (the table's entry points check they
// run on it, in release builds too: EventLoop::CheckInLoop).
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/event_loop.h"
#include "common/http_server.h"
#include "worker/daemon/code_cache.h"
#include "worker/daemon/daemon_options.h"
#include "worker/daemon/daemon_session.h"
#include "worker/daemon/rank_supervisor.h"
#include "worker/daemon/rank_table.h"

namespace trainctl::worker {

class WorkerDaemon {
 public:
  explicit WorkerDaemon(DaemonOptions options);
  // Shutdown(false) if still running.
  ~WorkerDaemon();

  // Reads (or later writes) the worker id in the work dir and starts the
  // session. Fails for an unusable work dir or rank binary.
  absl::Status Start();
  // Stops every rank (SIGTERM, then SIGKILL after `grace`), says goodbye
  // when `goodbye`, and closes the session. Idempotent.
  void Shutdown(bool goodbye, absl::Duration grace = absl::Seconds(5));

  // The id the coordinator knows this worker by ("" until registered once).
  std::string worker_id();
  // Number of rank processes running now.
  int running_ranks();
  // True while a session is registered.
  bool connected();
  // The /metrics page (Prometheus text format): ranks by state, per-rank
  // throughput and step time. Any thread but the loop's.
  std::string MetricsPage();
  // The bound HTTP "host:port" after Start with http_listen; else empty.
  const std::string& http_address() const { return http_address_; }

 private:
  // Checks the joined certificate now and then and renews it when due.
  void RenewLoop();

  DaemonOptions options_;
  EventLoop loop_;
  std::unique_ptr<RankSupervisor> supervisor_;
  std::unique_ptr<DaemonSession> session_;
  // Jobs' code from the coordinator the session dials (before table_: it
  // outlives the table's cache).
  std::unique_ptr<CodeSource> code_source_;
  // Runs on loop_; uses supervisor_ and session_.
  std::unique_ptr<RankTable> table_;
  std::thread renewer_;
  bool started_ = false;
  bool shut_down_ = false;
  // Stopped first in Shutdown (its handler posts to the loop).
  HttpServer http_;
  std::string http_address_;
};

}  // namespace trainctl::worker
