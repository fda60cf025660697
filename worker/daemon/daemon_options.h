// The worker daemon's settings (trainctl-worker's flags, docs/operator.md;
// `trainctl run` fills them for its local worker). Read by the daemon's
// owners: the session (coordinator, TLS, backoff, outbox bound), the rank
// table (paths, rank binary, identities, limits) and the daemon itself.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "trainctl/v1/worker_service.pb.h"
#include "worker/daemon/rank_files.h"

namespace trainctl::worker {

struct DaemonOptions {
  // Coordinator host:port, or a comma-separated list of them (active and
  // standby coordinators; common/coordinator_failover.h).
  std::string coordinator;
  // Worker-role bearer token for the Session (--token-file).
  std::string token;
  // Cluster CA (PEM file): TLS to the coordinator, verified against it.
  std::string ca_file;
  // This worker's certificate and key (PEM files): mutual TLS, its identity.
  std::string cert_file;
  std::string key_file;
  // cert_file/key_file are the work dir's joined pair (join.h): renew them
  // before they expire (RenewCertificateIfDue, on a thread of its own).
  bool renew_certificate = false;
  // Holds the worker id file and each rank's scratch directory.
  std::string work_dir;
  std::vector<v1::Slot> slots;
  std::map<std::string, std::string> labels;
  std::string hostname;
  // Address peers dial for this host (rank 0's store, MASTER_ADDR).
  std::string address;
  // The rank process binary (trainctl-rank).
  std::string rank_binary;
  // Extra arguments before --config (tests run a script through an interpreter).
  std::vector<std::string> rank_binary_args;
  absl::Duration metrics_flush = absl::Milliseconds(500);
  absl::Duration log_flush = absl::Milliseconds(250);
  // Per-rank log rate limit: a bucket of log_burst lines refilled at log_lines_per_sec.
  int log_lines_per_sec = 200;
  int log_burst = 1000;
  // Backoff between connection attempts (full jitter in [b/2, b]); the cap
  // bounds how long after the coordinator answers again a worker is back.
  absl::Duration reconnect_min = absl::Milliseconds(100);
  absl::Duration reconnect_max = absl::Seconds(1);
  // Bound on unacknowledged telemetry held for the coordinator (see
  // TelemetryBuffer: log lines are dropped first when it is full).
  int64_t telemetry_buffer_bytes = int64_t{64} << 20;
  // Collective and rendezvous timeout handed to ranks.
  int rank_timeout_s = 120;
  // When non-empty (canonical directories, see path_policy.h), a job's data
  // and model files must lie inside one of data_roots (a command job's
  // working_dir too), and a checkpoint.dir it sets inside one of
  // checkpoint_roots; otherwise its ranks fail as a configuration error
  // before they start. Empty data_roots: data and model files only from the
  // work dir and the system dataset dirs (DefaultDataRoots); {"/"}: anywhere
  // (local trainctl run, the user's own files). A job without checkpoint.dir
  // writes to <checkpoint_roots[0]>/<owner>/<job id> when there are roots.
  std::vector<std::string> data_roots;
  std::vector<std::string> checkpoint_roots;
  std::string version = "0.1.0";
  // Run command jobs (the user's own program, docs/command-jobs.md), as
  // rank_user. Off by default: a job then runs code of the submitter's
  // choosing on this host.
  bool allow_commands = false;
  // The user rank processes run as (--rank-user; rank_files.h lays out the
  // work dir for it); nullopt: this daemon's user.
  std::optional<RunAs> rank_user;
  // --rank-uids: each job owner's ranks run as a uid of their own from this
  // range (OwnerIdentity, rank_files.h) instead of as rank_user, whose
  // groups they get besides. Needs rank_user.
  std::optional<RankUidRange> rank_uids;
  // Directory holding the `trainctl` Python module, prepended to a command
  // rank's PYTHONPATH ("" = leave PYTHONPATH as the daemon has it).
  std::string python_dir;
  // host:port of an HTTP endpoint serving /metrics (Prometheus); empty: none.
  std::string http_listen;
  // Where the cgroup filesystem is mounted (--cgroup-root): ranks of a job
  // with `resources` get a cgroup of their own there (cgroup_limits.h).
  // "": cgroups off (such a job's ranks fail to launch, saying so).
  std::string cgroup_root = "/sys/fs/cgroup";
  // The file system's calls behind the work dir, the worker-id file and the
  // checkpoint-directory claims (common/file_env.h): a test's FaultFileEnv
  // fails them as a full or broken disk would. Null: the real ones.
  FileEnv* file_env = nullptr;
  // The daemon's time (common/clock.h): Now() for timestamps (reports,
  // log lines) and certificate expiry, Mono() for durations and retry
  // deadlines, and it times the session's blocking waits (heartbeats,
  // reconnect backoff, AwaitAcknowledged, SayGoodbye; Clock::WaitUntil)
  // and the daemon's event loop timers: a test's FakeClock drives them by
  // Advance. Null: SystemClock, whose
  // waits run on the steady clock.
  const Clock* clock = nullptr;
};

// options.clock, or the system's.
inline const Clock& DaemonClock(const DaemonOptions& options) {
  return options.clock != nullptr ? *options.clock : *SystemClock::Get();
}

}  // namespace trainctl::worker
