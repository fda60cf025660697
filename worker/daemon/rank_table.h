// RankTable: the worker daemon's ranks. One record per attempt this host
// runs ranks of, one LocalRankState machine per rank; it acts on the
// coordinator's messages (StartRanks, the rendezvous flow, StopRanks,
// Preflight, ReadFile, DropCheckpoints) and on what its ranks do (status
// lines, output, exits), and reports each change through its
// CoordinatorOutbox. It starts and stops processes only through its
// RankLauncher, so that both can be fakes in its unit tests
// (rank_table_test.cc); the WorkerDaemon wires the real ones. Where a
// job's files go and as whom its ranks run, it asks its RankWorkspace
// (rank_workspace.h).
//
// Threading: everything runs on the daemon's EventLoop. The public entry
// points check it (EventLoop::CheckInLoop, in release builds too); the rest
// require it, and clang's thread-safety analysis checks that they do.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/event_loop.h"
#include "trainctl/v1/worker_service.pb.h"
#include "worker/daemon/cgroup_limits.h"
#include "worker/daemon/code_cache.h"
#include "worker/daemon/coordinator_outbox.h"
#include "worker/daemon/daemon_options.h"
#include "worker/daemon/rank_supervisor.h"
#include "worker/daemon/rank_workspace.h"
#include "worker/protocol/rank_protocol.h"

namespace trainctl::worker {

class RankTable {
 public:
  // `options` (with work_dir and rank_binary made absolute), `loop`, `out`
  // and `launcher` outlive the table.
  // `code` (may be null: a job with code then fails, naming why) is where
  // jobs' code archives come from (code_cache.h); it outlives the table.
  RankTable(const DaemonOptions& options, RankTablePaths paths, EventLoop& loop,
            CoordinatorOutbox& out, RankLauncher& launcher, CodeSource* code = nullptr);
  ~RankTable();
  RankTable(const RankTable&) = delete;
  RankTable& operator=(const RankTable&) = delete;

  // A coordinator message (acknowledgements are the session's, ignored here).
  void OnMessage(const v1::CoordinatorMessage& m);
  // What the launcher reports of the rank with `key` ("job/attempt/rank").
  void OnStatusLine(const std::string& key, const std::string& line);
  void OnLogBatch(const std::string& key, const RankLogBatch& batch);
  void OnExit(const std::string& key, int code, int signal);
  // Sends the metrics and log lines gathered since the last flush (the
  // daemon calls them every --metrics-flush and --log-flush).
  void FlushMetrics();
  void FlushLogs();
  // The ranks that run now (a registration lists them).
  std::vector<v1::RunningRank> RunningRanks();

  // For /metrics: ranks by LocalRankState::gauge_label, and each live
  // rank's latest train window.
  struct LiveRank {
    std::string job_id;
    int32_t rank = 0;
    std::optional<v1::MetricPoint> last_train;
  };
  struct Snapshot {
    std::map<std::string, int64_t> by_state;
    std::vector<LiveRank> live;
  };
  Snapshot TakeSnapshot();

 private:
  struct LocalRank;
  struct LocalAttempt;

  // Rank lifecycle (rank_launch.cc, rank_end.cc).
  void OnStartRanks(const v1::StartRanks& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // An attempt's record with its identity and paths (RankWorkspace).
  std::unique_ptr<LocalAttempt> NewAttempt(const v1::StartRanks& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // Rank 0's daemon: makes the rendezvous (RendezvousBackend), reports it
  // and starts the local ranks.
  void ProduceRendezvous(LocalAttempt& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  void ReportRendezvous(const LocalAttempt& a, const v1::RendezvousInfo& info)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  void OnRendezvous(const v1::RendezvousDelivery& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  void OnStopRanks(const v1::StopRanks& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // Makes rank `rank`'s preemption file (StopRanks.checkpoint_first).
  void MarkPreempted(const LocalAttempt& a, int32_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // Runs the pre-flight checks (preflight.h) and reports them; starts nothing.
  void OnPreflight(const v1::Preflight& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  void LaunchPending(LocalAttempt& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // A command job with code (CommandSpec.code): its archive is here (or is
  // not: `archive` says why); unpacks it for the attempt and goes on where
  // OnStartRanks stopped.
  void OnCodeReady(const std::string& attempt_key, const absl::StatusOr<std::string>& archive)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  void Launch(LocalAttempt& a, LocalRank& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // An engine rank's config (the job spec flattened plus its place in the
  // attempt); an error for a refused data path.
  absl::StatusOr<rankproto::FlatConfig> RankConfig(const LocalAttempt& a,
                                                   const v1::RankAssignment& ra,
                                                   const std::string& dir)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // A command job's rank: the user's program under torchrun's environment.
  void LaunchCommand(LocalAttempt& a, LocalRank& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  std::vector<std::string> CommandLaunchEnvironment(const LocalAttempt& a,
                                                    const v1::RankAssignment& ra)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // Starts `l` for `r` and reports STARTING; a spawn error ends the rank
  // FAILED with "<what>: <error>". False when it did not start.
  bool StartProcess(LocalAttempt& a, LocalRank& r, const RankLaunch& l, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // Reports the RankState of `r`'s phase (with exit details for an end).
  void ReportStatus(const LocalAttempt& a, const LocalRank& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // A rank that could not be started ends FAILED (kind LAUNCH, or CONFIG for
  // a refused path) with `why`.
  void ReportLaunchFailure(const LocalAttempt& a, LocalRank& r, const std::string& why,
                           v1::FailureKind kind = v1::FAILURE_KIND_LAUNCH)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // Why a failed rank failed: kind and message into `e`.
  void DescribeFailure(const LocalAttempt& a, const LocalRank& r, int code, int signal,
                       v1::ExitInfo& e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // The message for a rank of a job with resources.memory whose own cgroup
  // saw the OOM killer (or, where the kernel does not count kills, hit its
  // limit and died of SIGKILL): "exceeded its memory limit of 64 MiB".
  std::optional<std::string> OverMemoryLimit(const LocalRank& r, int code, int signal) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // The message for a rank of a job with resources.pids that failed after
  // its own cgroup refused it a fork: "hit its process limit of 32".
  std::optional<std::string> OverProcessLimit(const LocalRank& r, int code, int signal) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // Makes `r`'s cgroup when the job sets resources; the error says why the
  // limits cannot be enforced on this worker.
  absl::Status MakeRankCgroup(const LocalAttempt& a, LocalRank& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // Removes `r`'s cgroup, if it has one (a failure is logged).
  void RemoveRankCgroup(const LocalAttempt& a, LocalRank& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // The OOM-killer message when `r` died of a SIGKILL this daemon did not
  // send while its cgroup's oom_kill count rose (oom_events.h).
  std::optional<std::string> OomKilled(const LocalRank& r, int signal) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  void MaybeForget(const std::string& attempt_key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  LocalRank* FindRank(const std::string& key, LocalAttempt** attempt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // Status lines (rank_status_lines.cc): one not acted on is said in the
  // rank's log (stderr), with `why`.
  void IgnoredReport(const std::string& key, const std::string& line, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // A command job's rank 0 report as TensorBoard scalars in the job's
  // tensorboard dir (an engine job's rank 0 writes its own): the event file
  // is created as the ranks' identity; a failure costs the plot, logged once.
  void WriteCommandTensorBoard(LocalAttempt& a, const rankproto::RankMetric& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // Artifacts (daemon_artifacts.cc).
  // Answers a fetch's ReadFile with one FileChunk (artifact_reader.h).
  void OnReadFile(const v1::ReadFile& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);
  // Deletes the checkpoint files the coordinator no longer records (ranks
  // never delete checkpoints under a daemon: fencing, docs/failures.md).
  void OnDropCheckpoints(const v1::DropCheckpoints& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_);

  const DaemonOptions& options_;
  // The job's directories, identity and paths (stateless).
  const RankWorkspace workspace_;
  EventLoop& loop_;
  CoordinatorOutbox& out_;
  RankLauncher& launcher_;
  // Jobs' code archives on this host (loop-only use).
  std::unique_ptr<CodeCache> code_;
  // Loop-only state (the analysis checks it: EventLoop's capability).
  std::map<std::string, std::unique_ptr<LocalAttempt>> attempts_
      ABSL_GUARDED_BY(loop_);  // "job/attempt"
  // Where rank cgroups go: found at the first job with `resources`.
  std::optional<CgroupLimits> cgroups_ ABSL_GUARDED_BY(loop_);
};

// torchrun's environment contract for one rank of a command job, plus
// TRAINCTL_* (docs/command-jobs.md): "NAME=value" entries.
std::vector<std::string> CommandEnvironment(const std::string& job_id, int32_t attempt,
                                            const v1::RankAssignment& ra, int32_t max_restarts,
                                            const std::string& master_addr,
                                            const std::string& master_port,
                                            const std::string& checkpoint_dir);

// The source tree's python/ (holding the trainctl module) when this build
// knows one and it exists, else "".
std::string DefaultPythonDir();
// Where the command ranks' Python start-up hook lives under `python_dir`
// (python/trainctl/_rank_boot: its sitecustomize.py); first on their PYTHONPATH.
std::string RankBootDir(const std::string& python_dir);

// The last line of `lines` that reads like a Python exception
// ("ValueError: bad shape"), or "" when none does.
std::string ExceptionLine(const std::deque<std::string>& lines);
// A command rank's end that a restart would only repeat: exit 2 (a usage
// error, or python could not open the script), or an ImportError,
// ModuleNotFoundError or SyntaxError as its last exception.
bool CommandCannotHeal(int code, int signal, const std::deque<std::string>& last_lines);
// The same, given the exception line itself (ExceptionLine's, or the
// message of the rank's TORCHELASTIC_ERROR_FILE).
bool ExceptionCannotHeal(int code, int signal, const std::string& exception);

// The message in a TORCHELASTIC_ERROR_FILE as torch.distributed.elastic's
// @record (errors/error_handler.py) writes it,
//   {"message": {"message": "ValueError: x", "extraInfo": {"py_callstack": ..., "timestamp": ...}}}
// or in its plain form {"message": "ValueError: x", "timestamp": ...}:
// its first non-empty line, at most 300 bytes; nullopt when `json` is not
// such a document (or the message is empty). `callstack` (optional) gets
// extraInfo.py_callstack when there is one.
std::optional<std::string> TorchelasticErrorMessage(const std::string& json,
                                                    std::string* callstack = nullptr);

// `exception` with the interpreter named when it is an import failure
// (ModuleNotFoundError, ImportError) of a program that is a Python
// interpreter (its file name starts with "python"): the module is missing
// from *that* interpreter, which may not be the one the user tried.
//   "ModuleNotFoundError: No module named 'torch' (interpreter: /usr/local/bin/python3)"
std::string NameInterpreter(const std::string& exception, const std::string& program);

}  // namespace trainctl::worker
