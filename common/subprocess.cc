#include "common/subprocess.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"

extern char** environ;

namespace trainctl {
namespace {

std::string EnvName(const std::string& kv) { return kv.substr(0, kv.find('=')); }

// The child's environment as "NAME=value" strings.
std::vector<std::string> ChildEnv(const SpawnOptions& o) {
  std::vector<std::string> env;
  if (o.inherit_env) {
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv(*e);
      const std::string name = EnvName(kv);
      bool overridden = false;
      for (const std::string& v : o.env) overridden |= EnvName(v) == name;
      if (!overridden) env.push_back(std::move(kv));
    }
  }
  if (o.run_as.has_value()) {
    // As login(1) and su(1) set them: a program that writes under $HOME
    // must not aim at the spawning user's home.
    const std::pair<std::string, std::string> identity[] = {
        {"HOME", o.run_as->home}, {"USER", o.run_as->name}, {"LOGNAME", o.run_as->name}};
    for (const auto& [name, value] : identity) {
      bool named = false;
      for (const std::string& v : o.env) named |= EnvName(v) == name;
      if (named) continue;
      const std::string& n = name;
      env.erase(std::remove_if(env.begin(), env.end(),
                               [&n](const std::string& kv) { return EnvName(kv) == n; }),
                env.end());
      env.push_back(absl::StrCat(name, "=", value));
    }
  }
  env.insert(env.end(), o.env.begin(), o.env.end());
  return env;
}

std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Everything the child uses, made before fork.
struct ChildPlan {
  std::vector<std::string> args, env;
  std::vector<char*> argv, envp;
  std::string error_message;
  std::string run_as_error;
  std::string cgroup_error;
  pid_t parent = -1;
};

// Takes on the identity of `u`, groups first (setgid and setgroups need the
// privilege setuid gives up). Raw system calls: they change this thread's
// credentials only, and after fork this thread is the whole process;
// glibc's wrappers would try to reach threads the child does not have.
bool SwitchUser(const RunAs& u) {
  return syscall(SYS_setgroups, u.groups.size(), u.groups.data()) == 0 &&
         syscall(SYS_setresgid, u.gid, u.gid, u.gid) == 0 &&
         syscall(SYS_setresuid, u.uid, u.uid, u.uid) == 0;
}

// In the child, after fork: only async-signal-safe calls from here on.
[[noreturn]] void RunChild(const SpawnOptions& o, ChildPlan& plan) {
  // Into the cgroups first (before the fds below are shuffled and closed):
  // "0" is the writing process.
  bool cgroup_failed = false;
  for (int fd : o.cgroup_procs_fds) cgroup_failed |= write(fd, "0", 1) != 1;
  if (o.new_session) {
    setsid();
  } else if (o.new_process_group) {
    setpgid(0, 0);
  }
  // Copy every source above the targets first, so that one dup2 cannot
  // clobber the source of another (and dup2 onto itself would keep
  // FD_CLOEXEC).
  int top = 2;
  for (const ChildFd& f : o.fds) top = std::max(top, f.child_fd);
  int sources[64];
  const size_t n = std::min<size_t>(o.fds.size(), 64);
  for (size_t i = 0; i < n; ++i) {
    const ChildFd& f = o.fds[i];
    if (f.parent_fd == ChildFd::kDevNull) {
      const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
      sources[i] = null_fd < 0 ? -1 : fcntl(null_fd, F_DUPFD_CLOEXEC, top + 1);
      if (null_fd >= 0) close(null_fd);
    } else {
      sources[i] = fcntl(f.parent_fd, F_DUPFD_CLOEXEC, top + 1);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (sources[i] >= 0) dup2(sources[i], o.fds[i].child_fd);
  }
  for (size_t i = 0; i < n; ++i) {
    if (sources[i] >= 0) close(sources[i]);
  }
  if (o.close_other_fds) {
    // Fds 3..top not named in `fds` are closed one by one; the rest at once.
    for (int fd = 3; fd <= top; ++fd) {
      bool named = false;
      for (size_t i = 0; i < n; ++i) named |= o.fds[i].child_fd == fd;
      if (!named) close(fd);
    }
    syscall(SYS_close_range, static_cast<unsigned>(top + 1), ~0U, 0U);
  }
  if (cgroup_failed) {
    (void)!write(2, plan.cgroup_error.data(), plan.cgroup_error.size());
    _exit(123);
  }
  // After the fds (so the message reaches the child's fd 2), before the
  // parent-death signal: a change of credentials clears it.
  if (o.run_as.has_value() && !SwitchUser(*o.run_as)) {
    (void)!write(2, plan.run_as_error.data(), plan.run_as_error.size());
    _exit(124);
  }
  if (o.parent_death_signal != 0) {
    prctl(PR_SET_PDEATHSIG, o.parent_death_signal);
    if (getppid() != plan.parent) _exit(126);  // The parent died before prctl.
  }
  signal(SIGPIPE, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (!o.work_dir.empty() && chdir(o.work_dir.c_str()) != 0) _exit(125);
  execve(plan.argv[0], plan.argv.data(), plan.envp.data());
  (void)!write(2, plan.error_message.data(), plan.error_message.size());
  _exit(127);
}

}  // namespace

absl::StatusOr<RunAs> LookupUser(const std::string& user) {
  if (user.empty()) return absl::InvalidArgumentError("user: empty name");
  long size_hint = sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(size_hint > 0 ? static_cast<size_t>(size_hint) : 16384);
  passwd pw{};
  passwd* found = nullptr;
  int err;
  while ((err = getpwnam_r(user.c_str(), &pw, buf.data(), buf.size(), &found)) == ERANGE &&
         buf.size() < (1u << 22)) {
    buf.resize(buf.size() * 2);
  }
  if (err != 0)
    return absl::InternalError(
        absl::StrCat("user ", user, ": cannot read the passwd database: ", std::strerror(err)));
  if (found == nullptr)
    return absl::NotFoundError(absl::StrCat("user ", user, ": no such user on this host"));
  RunAs u;
  u.name = pw.pw_name;
  u.home = pw.pw_dir != nullptr ? pw.pw_dir : "/";
  u.uid = pw.pw_uid;
  u.gid = pw.pw_gid;
  int n = 32;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  while (getgrouplist(u.name.c_str(), u.gid, groups.data(), &n) < 0) {
    if (n <= static_cast<int>(groups.size()))
      n = static_cast<int>(groups.size()) * 2;  // glibc sets n; others may not
    if (n > (1 << 16)) return absl::InternalError(absl::StrCat("user ", user, ": too many groups"));
    groups.resize(static_cast<size_t>(n));
  }
  groups.resize(static_cast<size_t>(n));
  u.groups = std::move(groups);
  return u;
}

std::string ExitStatus::ToString() const {
  if (exited()) return absl::StrCat("exit code ", code);
  return absl::StrCat("signal ", signal, " (", strsignal(signal), ")");
}

ExitStatus ExitStatus::FromWaitStatus(int raw) {
  ExitStatus s;
  s.raw = raw;
  if (WIFEXITED(raw)) s.code = WEXITSTATUS(raw);
  if (WIFSIGNALED(raw)) s.signal = WTERMSIG(raw);
  return s;
}

absl::StatusOr<Subprocess> Subprocess::Spawn(const SpawnOptions& o) {
  if (o.argv.empty() || o.argv[0].empty()) return absl::InvalidArgumentError("spawn: no program");
  if (o.fds.size() > 64) return absl::InvalidArgumentError("spawn: more than 64 child fds");
  for (const ChildFd& f : o.fds) {
    if (f.child_fd < 0 || (f.parent_fd < 0 && f.parent_fd != ChildFd::kDevNull)) {
      return absl::InvalidArgumentError(
          absl::StrCat("spawn: bad fd mapping ", f.parent_fd, " -> ", f.child_fd));
    }
  }
  ChildPlan plan;
  plan.args = o.argv;
  plan.env = ChildEnv(o);
  plan.argv = Pointers(plan.args);
  plan.envp = Pointers(plan.env);
  plan.error_message = o.exec_error_message.empty() ? absl::StrCat(o.argv[0], ": cannot execute\n")
                                                    : o.exec_error_message;
  if (o.run_as.has_value()) {
    plan.run_as_error = absl::StrCat(o.argv[0], ": cannot run as user ", o.run_as->name, "\n");
  }
  plan.cgroup_error = absl::StrCat(o.argv[0], ": cannot join its cgroup\n");
  plan.parent = getpid();
  const pid_t pid = fork();
  if (pid < 0)
    return absl::ResourceExhaustedError(absl::StrCat("fork failed: ", std::strerror(errno)));
  if (pid == 0) RunChild(o, plan);
  Subprocess p;
  p.pid_ = pid;
  p.group_leader_ = o.new_process_group || o.new_session;
  // Also from the parent, so that a SignalGroup right after Spawn reaches
  // the group. (After setsid the child's group is already its own.)
  if (o.new_process_group && !o.new_session) setpgid(pid, pid);
  return p;
}

Subprocess::~Subprocess() {
  if (running()) {
    SignalGroup(SIGKILL);
    Wait();
  }
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      group_leader_(other.group_leader_),
      status_(std::exchange(other.status_, std::nullopt)) {}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    if (running()) {
      SignalGroup(SIGKILL);
      Wait();
    }
    pid_ = std::exchange(other.pid_, -1);
    group_leader_ = other.group_leader_;
    status_ = std::exchange(other.status_, std::nullopt);
  }
  return *this;
}

std::optional<ExitStatus> Subprocess::Poll() {
  if (!running()) return status_;
  int raw = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &raw, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    status_ = ExitStatus::FromWaitStatus(raw);
  } else if (r < 0) {
    status_ = ExitStatus{};  // ECHILD: someone else reaped it; how it ended is unknown.
  }
  return status_;
}

ExitStatus Subprocess::Wait() {
  if (!running()) return status_.value_or(ExitStatus{});
  int raw = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &raw, 0);
  } while (r < 0 && errno == EINTR);
  status_ = r == pid_ ? ExitStatus::FromWaitStatus(raw) : ExitStatus{};
  return *status_;
}

std::optional<ExitStatus> Subprocess::WaitFor(absl::Duration timeout) {
  // Monotonic; woken by the exit itself through a pidfd (Linux 5.3+), so
  // neither a wall clock step nor a poll interval delays it. Without
  // pidfds, short sleeps.
  const absl::Time deadline = MonotonicNow() + timeout;
  if (std::optional<ExitStatus> s = Poll()) return s;
  const int pidfd = pid_ > 0 ? static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)) : -1;
  std::optional<ExitStatus> out;
  while (true) {
    if ((out = Poll())) break;
    const absl::Duration left = deadline - MonotonicNow();
    if (left <= absl::ZeroDuration()) break;
    if (pidfd >= 0) {
      struct pollfd p {
        pidfd, POLLIN, 0
      };
      ::poll(&p, 1,
             static_cast<int>(std::min<int64_t>(
                 absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 1 << 30)));
    } else {
      absl::SleepFor(std::min(left, absl::Milliseconds(5)));
    }
  }
  if (pidfd >= 0) ::close(pidfd);
  return out;
}

bool Subprocess::Signal(int sig) { return running() && kill(pid_, sig) == 0; }

bool Subprocess::SignalGroup(int sig) {
  if (pid_ <= 0) return false;
  if (!group_leader_) return Signal(sig);
  return kill(-pid_, sig) == 0;
}

ExitStatus Subprocess::Terminate(absl::Duration grace) {
  SignalGroup(SIGTERM);
  std::optional<ExitStatus> s = WaitFor(grace);
  SignalGroup(SIGKILL);
  return s ? *s : Wait();
}

}  // namespace trainctl
