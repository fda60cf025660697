// Starting and ending child processes: the one fork/exec in trainctl.
//
// Spawn() starts a program with the file descriptors, environment, working
// directory, process group, user and parent-death signal the caller asks
// for, and
// returns a Subprocess that reaps it (blocking or not, with the exit code or
// signal decoded) and can end its whole process group (SIGTERM, a grace
// period, SIGKILL). Callers: the worker daemon's rank supervisor, the test
// harnesses that run ranks and clusters, and the benchmarks.
//
// Everything the child needs (argv, envp, messages) is built before fork;
// between fork and exec the child makes only async-signal-safe calls, so
// Spawn is safe to call from a process with many threads.
//
// Threading: Spawn may be called from any thread, but with
// parent_death_signal set the child gets that signal when the *thread* that
// spawned it exits (PR_SET_PDEATHSIG's rule): spawn from a thread that lives
// as long as the child should. A Subprocess is not thread-safe: one thread
// uses it (or its owner's lock guards it).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainctl {

// How a child ended.
struct ExitStatus {
  // The exit code (0..255) when it exited, else -1.
  int code = -1;
  // The signal that killed it, else 0.
  int signal = 0;
  // The raw status waitpid returned (for WIFEXITED and friends).
  int raw = 0;

  bool exited() const { return code >= 0; }
  bool success() const { return code == 0; }
  // The exit code, or minus the signal number when a signal killed it.
  int CodeOrMinusSignal() const { return code >= 0 ? code : -signal; }
  // "exit code 3" or "signal 9 (Killed)".
  std::string ToString() const;

  static ExitStatus FromWaitStatus(int raw);
};

// An fd of the child: `child_fd` becomes a copy of the parent's `parent_fd`
// (which may be close-on-exec; the copy is not). kDevNull opens /dev/null
// (read-write) instead.
struct ChildFd {
  static constexpr int kDevNull = -2;
  int child_fd = -1;
  int parent_fd = -1;
};

// A Unix user a child runs as (SpawnOptions::run_as): everything the switch
// needs, resolved before any fork (LookupUser), so that the child makes
// only system calls.
struct RunAs {
  // The user's name (for USER and LOGNAME) and home directory (HOME).
  std::string name;
  std::string home;
  uid_t uid = 0;
  gid_t gid = 0;
  // Every group the user is in (its primary group included), as
  // initgroups(3) would set them.
  std::vector<gid_t> groups;
};

// `user` from the passwd database (getpwnam_r) with its groups
// (getgrouplist). NotFound naming the user when there is none.
absl::StatusOr<RunAs> LookupUser(const std::string& user);

struct SpawnOptions {
  // argv[0] is the path executed (no PATH search) and the child's argv[0].
  std::vector<std::string> argv;
  // "NAME=value" entries. With inherit_env, they are added to (or replace
  // the same names in) this process's environment; without, they are the
  // child's whole environment.
  std::vector<std::string> env;
  bool inherit_env = true;
  // The child's working directory ("": this process's). Exit code 125 when
  // it cannot change into it.
  std::string work_dir;
  // The child's fds: any of 0, 1, 2 not listed are inherited as they are.
  std::vector<ChildFd> fds;
  // Close every fd above 2 that `fds` does not name (close-on-exec or not).
  bool close_other_fds = true;
  // setpgid(0, 0): the child leads a process group of its own (and so do
  // the processes it starts, unless they move), which KillGroup ends.
  bool new_process_group = true;
  // setsid(): a new session (and process group) without a terminal.
  bool new_session = false;
  // Sent to the child when the spawning thread exits (0: none). If this
  // process died between fork and prctl, the child exits 126 at once (a
  // spawning thread that exits before the child's prctl is not caught:
  // spawn from a long-lived thread).
  int parent_death_signal = 0;
  // Run the child as this user: its supplementary groups, then real,
  // effective and saved gid and uid, set in the child before exec (needs
  // root, or CAP_SETUID and CAP_SETGID). Its HOME, USER and LOGNAME become
  // the user's unless `env` names them. When the switch fails the child
  // writes "<argv[0]>: cannot run as user NAME" to (its) fd 2 and exits
  // 124, before it changes directory or executes anything.
  std::optional<RunAs> run_as;
  // Open cgroup.procs files (of one cgroup per v1 hierarchy, or one v2
  // cgroup): the child writes "0" to each first thing after fork, which
  // moves it, and so everything it later starts, into those cgroups before
  // it executes anything. When a write fails the child writes "<argv[0]>:
  // cannot join its cgroup" to (its) fd 2 and exits 123. The caller keeps
  // and closes its copies.
  std::vector<int> cgroup_procs_fds;
  // Written to the child's fd 2 when exec fails (then it exits 127);
  // "" means "<argv[0]>: cannot execute\n".
  std::string exec_error_message;
};

// A started child. Movable; the destructor of one that was not reaped kills
// it (its group when it leads one) with SIGKILL and reaps it: no orphans,
// no zombies.
class Subprocess {
 public:
  // Starts the child. The signal mask of the child is empty and SIGPIPE has
  // its default action, whatever this process set.
  static absl::StatusOr<Subprocess> Spawn(const SpawnOptions& options);

  Subprocess() = default;
  ~Subprocess();
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // -1 for a default-constructed one.
  pid_t pid() const { return pid_; }
  // Started and not reaped yet (it may have exited: Poll says).
  bool running() const { return pid_ > 0 && !status_; }
  // The exit status once reaped.
  const std::optional<ExitStatus>& exit_status() const { return status_; }

  // Reaps the child if it has exited (never blocks).
  std::optional<ExitStatus> Poll();
  // Blocks until the child exits.
  ExitStatus Wait();
  // Waits up to `timeout` (polling); nullopt if it is still running.
  std::optional<ExitStatus> WaitFor(absl::Duration timeout);

  // Sends `sig` to the child only; false once it is reaped.
  bool Signal(int sig);
  // Sends `sig` to the child's process group (the child only when it does
  // not lead one). The group is signalled even after the child is reaped:
  // what it left behind goes too.
  bool SignalGroup(int sig);
  // SIGTERM to the group, up to `grace` for the child to exit, then SIGKILL
  // to the group; reaps it and returns how it ended.
  ExitStatus Terminate(absl::Duration grace);

 private:
  pid_t pid_ = -1;
  bool group_leader_ = false;
  std::optional<ExitStatus> status_;
};

}  // namespace trainctl
