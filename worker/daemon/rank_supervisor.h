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
// Thread-safe. Callbacks run on the supervisor's monitor thread, in order
// per rank; a rank's exit is reported after its remaining output.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace trainctl::worker {

struct RankLaunch {
  // Identifies the rank in callbacks, e.g. "job/attempt/rank".
  std::string key;
  std::string binary;
  std::vector<std::string> args;
  // Added to (or replacing in) the daemon's environment: "NAME=value".
  std::vector<std::string> env;
  // Working directory of the process (must exist).
  std::string work_dir;
};

struct RankCallbacks {
  std::function<void(const std::string& key, const std::string& line)> on_status;
  // stream: 1 stdout, 2 stderr. Lines longer than 4096 bytes are cut.
  std::function<void(const std::string& key, int stream, const std::string& line)> on_log;
  // exit_code >= 0 when it exited, else -1 and `signal` is set.
  std::function<void(const std::string& key, int exit_code, int signal)> on_exit;
};

class RankSupervisor {
 public:
  explicit RankSupervisor(RankCallbacks callbacks);
  // Kills every rank (SIGKILL to their groups) and waits for the monitor.
  ~RankSupervisor();
  RankSupervisor(const RankSupervisor&) = delete;
  RankSupervisor& operator=(const RankSupervisor&) = delete;

  // Starts the process; returns its pid. ALREADY_EXISTS for a running key.
  absl::StatusOr<pid_t> Launch(const RankLaunch& launch);
  // SIGTERM now, SIGKILL after `grace` if still running. False if not running.
  bool Stop(const std::string& key, absl::Duration grace);
  // Keys of ranks that have not exited yet.
  std::vector<std::string> Running() const;
  // pid of a running rank, or -1.
  pid_t Pid(const std::string& key) const;

 private:
  struct Child {
    pid_t pid = -1;
    int out_fd = -1, err_fd = -1, status_fd = -1;
    std::string out_buf, err_buf, status_buf;
    absl::Time kill_at = absl::InfiniteFuture();
  };
  void Monitor();
  // Reads what is available; returns false at EOF.
  bool Drain(const std::string& key, Child& c, int& fd, std::string& buf, int stream);

  RankCallbacks callbacks_;
  mutable absl::Mutex mu_;
  std::map<std::string, Child> children_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
};

}  // namespace trainctl::worker
