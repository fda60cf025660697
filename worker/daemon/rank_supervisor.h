// Launches and watches rank processes: one child per rank, in its own
// process group, with stdout/stderr captured line by line and the status
// pipe (fd 3) read line by line; reports their exit (code or signal).
//
// A crashing or hanging rank never takes the daemon down: Stop() sends
// SIGTERM to the rank's process group and SIGKILL after the grace period,
// and a rank's whole group is killed when the rank exits (no orphans). If
// the daemon dies, its ranks die with it (PR_SET_PDEATHSIG, set in the
// child; Launch must therefore be called from a thread that lives as long
// as the daemon, such as its event loop).
//
// Output is rate limited and batched here, before it reaches anyone: per
// rank a token bucket (log_burst lines, refilled at log_lines_per_sec), and
// one batch per rank per monitor round. Lines over the rate, or over the
// hard memory bound (max_pending_log_bytes: bytes of batches handed out and
// not yet destroyed by their receiver, all ranks together), are dropped and
// counted in the next batch. A rank printing in a tight loop therefore costs
// the daemon CPU to read and discard, never memory.
//
// Thread-safe. Callbacks run on the supervisor's monitor thread, in order
// per rank; a rank's exit is reported after its remaining output.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/subprocess.h"
#include "common/wake_signal.h"

namespace trainctl::worker {

struct RankLaunch {
  // Identifies the rank in callbacks, e.g. "job/attempt/rank".
  std::string key;
  std::string binary;
  std::vector<std::string> args;
  // Added to (or replacing in) the daemon's environment: "NAME=value".
  std::vector<std::string> env;
  // Working directory of the process (must exist; entered as run_as).
  std::string work_dir;
  // fds the process gets besides 0-3 (e.g. its config at 4). The caller
  // keeps and closes its own copies.
  std::vector<ChildFd> extra_fds;
  // The user the process (and all it starts) runs as; nullopt: the
  // daemon's (--rank-user, docs/security.md).
  std::optional<RunAs> run_as;
  // cgroup.procs files the process joins before it executes (its resource
  // limits, cgroup_limits.h); the caller keeps and closes them.
  std::vector<int> cgroup_procs_fds;
};

// One line a rank printed.
struct RankLogLine {
  // 1 stdout, 2 stderr.
  int stream = 1;
  // When the supervisor read it.
  absl::Time time;
  // Without the newline; lines longer than 4096 bytes are cut.
  std::string text;
};

// A rank's output lines read in one monitor round, after the rate limit.
// Its bytes count against max_pending_log_bytes until the last reference to
// it is gone: a receiver that holds batches (queued closures) holds memory
// the supervisor will not hand out again.
struct RankLogBatch {
  std::vector<RankLogLine> lines;
  // Lines dropped (rate limit or memory bound) since the previous batch.
  int64_t dropped = 0;
  // The last lines read (at most kRecentLines, dropped ones included, oldest
  // first) since the previous batch: what an exit report quotes, even when
  // the rank's last words were over the rate.
  std::vector<std::string> recent;
  static constexpr size_t kRecentLines = 20;
};

struct SupervisorOptions {
  // Per rank: a bucket of log_burst lines, refilled at log_lines_per_sec.
  int log_lines_per_sec = 200;
  int log_burst = 1000;
  // Bytes of line text in batches not yet released, all ranks together.
  int64_t max_pending_log_bytes = int64_t{16} << 20;
  // Bytes read per output stream per monitor round (so that one rank's
  // flood cannot delay another rank's output, exits and kills).
  size_t max_read_per_round = 1 << 20;
  // Stamps each output line (its wall time, Clock::Now). Null: SystemClock.
  // The monitor's own waits and rate limits run on the steady clock.
  const Clock* clock = nullptr;
};

struct RankCallbacks {
  std::function<void(const std::string& key, const std::string& line)> on_status;
  // At most one batch per rank per monitor round (~50 ms), never empty.
  std::function<void(const std::string& key, std::shared_ptr<const RankLogBatch> batch)> on_logs;
  // exit_code >= 0 when it exited, else -1 and `signal` is set.
  std::function<void(const std::string& key, int exit_code, int signal)> on_exit;
};

// Starting and stopping rank processes: what the daemon's rank table needs
// of a RankSupervisor (its unit tests give it a fake).
class RankLauncher {
 public:
  virtual ~RankLauncher() = default;
  // Starts the process; returns its pid. ALREADY_EXISTS for a running key.
  virtual absl::StatusOr<pid_t> Launch(const RankLaunch& launch) = 0;
  // SIGTERM now, SIGKILL after `grace` if still running. False if not running.
  virtual bool Stop(const std::string& key, absl::Duration grace) = 0;
  // A hung command rank: SIGUSR1 to the rank's own process now (its Python
  // start-up hook dumps every thread's stack to its stderr), then after
  // `dump_wait` as Stop. False if not running.
  virtual bool DumpStacksThenStop(const std::string& key, absl::Duration dump_wait,
                                  absl::Duration grace) {
    return Stop(key, grace);
  }
  // Keys of ranks that have not exited yet.
  virtual std::vector<std::string> Running() const = 0;
};

class RankSupervisor final : public RankLauncher {
 public:
  explicit RankSupervisor(RankCallbacks callbacks, SupervisorOptions options = {});
  // Kills every rank (SIGKILL to their groups) and waits for the monitor.
  ~RankSupervisor();
  RankSupervisor(const RankSupervisor&) = delete;
  RankSupervisor& operator=(const RankSupervisor&) = delete;

  absl::StatusOr<pid_t> Launch(const RankLaunch& launch) override;
  bool Stop(const std::string& key, absl::Duration grace) override;
  bool DumpStacksThenStop(const std::string& key, absl::Duration dump_wait,
                          absl::Duration grace) override;
  std::vector<std::string> Running() const override;
  // Waits (monotonic, woken by each exit) until no rank is running, at
  // most `timeout`; true when none is.
  bool WaitNoneRunning(absl::Duration timeout) const;
  // pid of a running rank, or -1.
  pid_t Pid(const std::string& key) const;

 private:
  struct Child {
    // Reaped by the monitor, which then erases the child.
    Subprocess process;
    int out_fd = -1, err_fd = -1, status_fd = -1;
    std::string out_buf, err_buf, status_buf;
    absl::Time kill_at = absl::InfiniteFuture();
    // DumpStacksThenStop: SIGTERM at term_at (then kill_at is set).
    absl::Time term_at = absl::InfiniteFuture();
    absl::Duration term_grace;
    // Output rate limit and the batch being filled this round.
    double tokens = 0;
    absl::Time refill_at;
    std::vector<RankLogLine> batch;
    int64_t batch_bytes = 0;
    int64_t dropped = 0;
    // The last lines read, a ring (slots are reused: a dropped line costs
    // no allocation); recent_count of them are newer than the last batch.
    std::array<std::string, RankLogBatch::kRecentLines> recent;
    size_t recent_next = 0;
    size_t recent_count = 0;
  };
  void Monitor();
  // Reads what is available (at most max_read_per_round); returns false at EOF.
  bool Drain(const std::string& key, Child& c, int& fd, std::string& buf, int stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After the child exited: reads what its pipe still holds, then closes it.
  void DrainAfterExit(const std::string& key, Child& c, int& fd, std::string& buf, int stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A complete output line: status lines go to on_status, output lines into
  // the child's batch (or are dropped and counted).
  void Line(const std::string& key, Child& c, int stream, absl::string_view line)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the child's batch to on_logs (when there is anything to say).
  void EmitBatch(const std::string& key, Child& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  RankCallbacks callbacks_;
  const SupervisorOptions options_;
  // Bytes of batches handed out and not yet destroyed (shared with their deleters).
  std::shared_ptr<std::atomic<int64_t>> pending_bytes_ = std::make_shared<std::atomic<int64_t>>(0);
  mutable absl::Mutex mu_;
  std::map<std::string, Child> children_ ABSL_GUARDED_BY(mu_);
  // Notified after ranks leave children_ (WaitNoneRunning).
  mutable WakeSignal exits_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
};

}  // namespace trainctl::worker
