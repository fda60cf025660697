// trainctl-worker: one daemon per host. Registers the host's slots with the
// coordinator, keeps a Session stream open (heartbeats; reconnects with
// exponential backoff and jitter, re-registering with the same id and the
// ranks it still runs), launches and supervises one rank process per
// assigned rank, produces the rendezvous data on rank 0's host, and
// forwards rank status, metrics (batched, bounded rate) and logs (rate
// limited per rank in the RankSupervisor, bounded memory) to the
// coordinator.
//
// Telemetry is at least once: every report the coordinator must not lose
// (rank status, rendezvous, metrics, logs, progress — anything but
// register, heartbeat and goodbye) goes through a TelemetryBuffer, numbered,
// and is kept until the coordinator's TelemetryAck; after a reconnect the
// session resends what is not acknowledged, in order.
//
// Threads: all rank state lives on one EventLoop; the RankSupervisor's
// monitor only posts to it (the loop's entry points, OnMessage,
// OnStatusLine, OnLogBatch and OnExit, check they run on it, in release
// builds too: EventLoop::CheckInLoop). The session thread connects, registers and
// reads; the writer thread is the only one that writes to the stream. The
// session thread destroys a stream only after taking it away from the
// writer (stream_ = nullptr) and waiting until no Write is in flight
// (writing_), so nothing touches a finished stream.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/event_loop.h"
#include "common/http_server.h"
#include "trainctl/v1/worker_service.grpc.pb.h"
#include "worker/daemon/rank_files.h"
#include "worker/daemon/rank_supervisor.h"
#include "worker/daemon/telemetry_buffer.h"
#include "worker/protocol/rank_protocol.h"

namespace trainctl::worker {

struct DaemonOptions {
  // Coordinator host:port.
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
};

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
  struct LocalRank;
  struct LocalAttempt;

  // Session (threads; daemon_session.cc).
  void SessionLoop();
  // Checks the joined certificate now and then and renews it when due.
  void RenewLoop();
  // Registers on `stream` and, once acknowledged, reads it until it ends;
  // true when the coordinator acknowledged the registration.
  bool RunSession(grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>& stream);
  v1::WorkerMessage RegisterMessage();
  // Takes a registration's acknowledgement: the id, heartbeat and resend point.
  void OnRegistered(const v1::RegisterAck& ack,
                    grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>* stream, int running_ranks);
  // Sends heartbeats until `stop` (its own thread: a busy loop never delays them).
  void HeartbeatLoop(const std::atomic<bool>& stop);
  // Says why a session ended (or never began), and when the next try is.
  void LogSessionEnd(const grpc::Status& st, bool registered, absl::Duration wait, int64_t& failures);
  // Sleeps `wait` unless a shutdown begins; false when it did.
  bool SleepUnlessShuttingDown(absl::Duration wait);
  // Queues a message for the coordinator. Heartbeats and goodbyes are sent
  // once (a heartbeat is dropped while disconnected, as is a non-critical
  // one); every other kind is sequenced telemetry (TelemetryBuffer), kept
  // until acknowledged whatever `critical` says.
  bool Enqueue(v1::WorkerMessage msg, bool critical);
  void WriterLoop();
  // Ranks to list as running in a registration: those running now, and
  // those whose end is still unacknowledged telemetry.
  std::vector<v1::RunningRank> RanksForRegister();

  // Loop handlers.
  void OnMessage(const v1::CoordinatorMessage& m);
  // Rank lifecycle (rank_launch.cc, rank_end.cc).
  void OnStartRanks(const v1::StartRanks& s);
  // An attempt's record with its paths resolved under the path policy.
  std::unique_ptr<LocalAttempt> NewAttempt(const v1::StartRanks& s);
  void ResolveAttemptPaths(LocalAttempt& a);
  // Rank 0's daemon: makes the rendezvous (RendezvousBackend), reports it
  // and starts the local ranks.
  void ProduceRendezvous(LocalAttempt& a);
  void ReportRendezvous(const LocalAttempt& a, const v1::RendezvousInfo& info);
  void OnRendezvous(const v1::RendezvousDelivery& d);
  void OnStopRanks(const v1::StopRanks& s);
  // Runs the pre-flight checks (preflight.h) and reports them; starts nothing.
  void OnPreflight(const v1::Preflight& p);
  void LaunchPending(LocalAttempt& a);
  // Paths and directories of rank_files.h: jobs/JOB, its attempt-N, a
  // rank's own directory (returned), and the default checkpoint.dir.
  std::string JobDir(const std::string& job_id) const;
  std::string AttemptDir(const LocalAttempt& a) const;
  // Who a job's ranks (and the daemon's work on the job's files) run as:
  // the owner's own uid with --rank-uids, else --rank-user (nullopt: this
  // daemon's user).
  absl::StatusOr<std::optional<RunAs>> JobIdentity(int64_t owner_number) const;
  absl::Status MakeJobDirs(const std::string& job_id, const v1::JobSpec& spec, const std::optional<RunAs>& as);
  absl::StatusOr<std::string> MakeRankDirs(const LocalAttempt& a, const v1::RankAssignment& ra);
  void Launch(LocalAttempt& a, LocalRank& r);
  // An engine rank's config (the job spec flattened plus its place in the
  // attempt); an error for a refused data path.
  absl::StatusOr<rankproto::FlatConfig> RankConfig(const LocalAttempt& a, const v1::RankAssignment& ra,
                                                   const std::string& dir);
  // A command job's rank: the user's program under torchrun's environment.
  void LaunchCommand(LocalAttempt& a, LocalRank& r);
  std::vector<std::string> CommandLaunchEnvironment(const LocalAttempt& a, const v1::RankAssignment& ra);
  // Starts `l` for `r` and reports STARTING; a spawn error ends the rank
  // FAILED with "<what>: <error>". False when it did not start.
  bool StartProcess(LocalAttempt& a, LocalRank& r, const RankLaunch& l, const std::string& what);
  // Reports the RankState of `r`'s phase (with exit details for an end).
  void ReportStatus(const LocalAttempt& a, const LocalRank& r);
  // A rank that could not be started ends FAILED (kind LAUNCH, or CONFIG for
  // a refused path) with `why`.
  void ReportLaunchFailure(const LocalAttempt& a, LocalRank& r, const std::string& why,
                           v1::FailureKind kind = v1::FAILURE_KIND_LAUNCH);
  void OnExit(const std::string& key, int code, int signal);
  // Why a failed rank failed: kind and message into `e`.
  void DescribeFailure(const LocalAttempt& a, const LocalRank& r, int code, int signal, v1::ExitInfo& e) const;
  // The OOM-killer message when `r` died of a SIGKILL this daemon did not
  // send while its cgroup's oom_kill count rose (oom_events.h).
  std::optional<std::string> OomKilled(const LocalRank& r, int signal) const;
  void MaybeForget(const std::string& attempt_key);
  std::vector<v1::RunningRank> RunningRanks();
  LocalRank* FindRank(const std::string& key, LocalAttempt** attempt);
  // Status lines, logs and metrics (rank_status_lines.cc).
  void OnStatusLine(const std::string& key, const std::string& line);
  // A status line not acted on: said in the rank's log (stderr), with `why`.
  void IgnoredReport(const std::string& key, const std::string& line, const std::string& why);
  // A command job's rank 0 report as TensorBoard scalars in the job's
  // tensorboard dir (an engine job's rank 0 writes its own): the event file
  // is created as the ranks' identity; a failure costs the plot, logged once.
  void WriteCommandTensorBoard(LocalAttempt& a, const rankproto::RankMetric& m);
  void OnLogBatch(const std::string& key, const RankLogBatch& batch);
  void FlushMetrics();
  void FlushLogs();
  // Artifacts (daemon_artifacts.cc).
  // Answers a fetch's ReadFile with one FileChunk (artifact_reader.h).
  void OnReadFile(const v1::ReadFile& r);
  // Deletes the checkpoint files the coordinator no longer records (ranks
  // never delete checkpoints under a daemon: fencing, docs/failures.md).
  void OnDropCheckpoints(const v1::DropCheckpoints& d);

  DaemonOptions options_;
  EventLoop loop_;
  std::unique_ptr<RankSupervisor> supervisor_;

  // Loop-only state.
  std::map<std::string, std::unique_ptr<LocalAttempt>> attempts_;  // "job/attempt"
  std::string id_file_;
  // The daemon's working directory at Start: the one base a job's relative
  // paths are resolved against (path_policy.h).
  std::string base_dir_;
  // Where data and model files are read from (set at Start): --data-root,
  // else DefaultDataRoots (the work dir, /usr/share/datasets); and how
  // errors name them.
  std::vector<std::string> data_read_roots_;
  std::string data_roots_name_ = "--data-root";

  // Session state shared with the session threads.
  absl::Mutex mu_;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
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
  grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>* stream_ ABSL_GUARDED_BY(mu_) =
      nullptr;
  // The writer is inside Write() on stream_ (taken under mu_).
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  std::thread session_;
  std::thread writer_;
  std::thread renewer_;
  bool started_ = false;
  bool shut_down_ = false;
  // Stopped first in Shutdown (its handler posts to the loop).
  HttpServer http_;
  std::string http_address_;
};

// torchrun's environment contract for one rank of a command job, plus
// TRAINCTL_* (docs/command-jobs.md): "NAME=value" entries.
std::vector<std::string> CommandEnvironment(const std::string& job_id, int32_t attempt,
                                            const v1::RankAssignment& ra, int32_t max_restarts,
                                            const std::string& master_addr, const std::string& master_port,
                                            const std::string& checkpoint_dir);

// The source tree's python/ (holding the trainctl module) when this build
// knows one and it exists, else "".
std::string DefaultPythonDir();

// The last line of `lines` that reads like a Python exception
// ("ValueError: bad shape"), or "" when none does.
std::string ExceptionLine(const std::deque<std::string>& lines);
// A command rank's end that a restart would only repeat: exit 2 (a usage
// error, or python could not open the script), or an ImportError,
// ModuleNotFoundError or SyntaxError as its last exception.
bool CommandCannotHeal(int code, int signal, const std::deque<std::string>& last_lines);

}  // namespace trainctl::worker
