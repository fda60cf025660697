#include "worker/daemon/rank_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace trainctl::worker {
namespace {

constexpr size_t kMaxLine = 4096;

std::string EnvName(const std::string& kv) { return kv.substr(0, kv.find('=')); }

}  // namespace

RankSupervisor::RankSupervisor(RankCallbacks callbacks)
    : callbacks_(std::move(callbacks)), monitor_([this] { Monitor(); }) {}

RankSupervisor::~RankSupervisor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [key, c] : children_) {
      if (c.pid > 0) kill(-c.pid, SIGKILL);
    }
  }
  monitor_.join();
}

absl::StatusOr<pid_t> RankSupervisor::Launch(const RankLaunch& l) {
  {
    absl::MutexLock lock(&mu_);
    if (children_.count(l.key) > 0) return absl::AlreadyExistsError(absl::StrCat("rank ", l.key, " is running"));
  }
  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls.
  std::vector<std::string> args{l.binary};
  args.insert(args.end(), l.args.begin(), l.args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    bool overridden = false;
    for (const std::string& o : l.env) overridden |= EnvName(o) == EnvName(kv);
    if (!overridden) env.push_back(kv);
  }
  env.insert(env.end(), l.env.begin(), l.env.end());
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  int out[2], err[2], st[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return absl::InternalError("pipe failed");
  }
  if (pipe2(st, O_CLOEXEC) != 0) {
    close(out[0]); close(out[1]); close(err[0]); close(err[1]);
    return absl::InternalError("pipe failed");
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {out[0], out[1], err[0], err[1], st[0], st[1]}) close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("fork failed: ", std::strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);  // The daemon died before prctl.
    // Move the pipe ends above 3 first so the dup2s below cannot clobber them.
    int o = fcntl(out[1], F_DUPFD, 10), e = fcntl(err[1], F_DUPFD, 10), s = fcntl(st[1], F_DUPFD, 10);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(o, 1);
    dup2(e, 2);
    dup2(s, 3);
    syscall(SYS_close_range, 4U, ~0U, 0U);
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (!l.work_dir.empty() && chdir(l.work_dir.c_str()) != 0) _exit(125);
    execve(argv[0], argv.data(), envp.data());
    const char msg[] = "trainctl-worker: cannot execute the rank binary\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(127);
  }
  setpgid(pid, pid);  // Also from the parent: no race with an early Stop.
  close(out[1]);
  close(err[1]);
  close(st[1]);
  for (int fd : {out[0], err[0], st[0]}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  absl::MutexLock lock(&mu_);
  Child& c = children_[l.key];
  c.pid = pid;
  c.out_fd = out[0];
  c.err_fd = err[0];
  c.status_fd = st[0];
  return pid;
}

bool RankSupervisor::Stop(const std::string& key, absl::Duration grace) {
  absl::MutexLock lock(&mu_);
  auto it = children_.find(key);
  if (it == children_.end() || it->second.pid <= 0) return false;
  kill(-it->second.pid, SIGTERM);
  it->second.kill_at = std::min(it->second.kill_at, absl::Now() + grace);
  return true;
}

std::vector<std::string> RankSupervisor::Running() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [k, c] : children_) out.push_back(k);
  return out;
}

pid_t RankSupervisor::Pid(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = children_.find(key);
  return it == children_.end() ? -1 : it->second.pid;
}

bool RankSupervisor::Drain(const std::string& key, Child& c, int& fd, std::string& buf, int stream) {
  if (fd < 0) return false;
  char chunk[8192];
  while (true) {
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n > 0) {
      buf.append(chunk, static_cast<size_t>(n));
      size_t pos;
      while ((pos = buf.find('\n')) != std::string::npos || buf.size() > kMaxLine) {
        std::string line = pos == std::string::npos ? buf.substr(0, kMaxLine) : buf.substr(0, pos);
        buf.erase(0, pos == std::string::npos ? kMaxLine : pos + 1);
        if (line.size() > kMaxLine) line.resize(kMaxLine);
        if (stream == 3) {
          if (callbacks_.on_status) callbacks_.on_status(key, line);
        } else if (callbacks_.on_log) {
          callbacks_.on_log(key, stream, line);
        }
      }
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    // EOF or error: flush a last partial line.
    if (!buf.empty()) {
      if (stream == 3) {
        if (callbacks_.on_status) callbacks_.on_status(key, buf);
      } else if (callbacks_.on_log) {
        callbacks_.on_log(key, stream, buf);
      }
      buf.clear();
    }
    close(fd);
    fd = -1;
    return false;
  }
}

void RankSupervisor::Monitor() {
  while (true) {
    std::vector<pollfd> fds;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ && children_.empty()) return;
      for (auto& [k, c] : children_) {
        for (int fd : {c.out_fd, c.err_fd, c.status_fd}) {
          if (fd >= 0) fds.push_back(pollfd{fd, POLLIN, 0});
        }
      }
    }
    poll(fds.data(), fds.size(), 50);

    std::vector<std::tuple<std::string, int, int>> exited;
    {
      absl::MutexLock lock(&mu_);
      absl::Time now = absl::Now();
      for (auto it = children_.begin(); it != children_.end();) {
        const std::string& key = it->first;
        Child& c = it->second;
        // Callbacks run under the lock: they only queue work elsewhere.
        Drain(key, c, c.status_fd, c.status_buf, 3);
        Drain(key, c, c.out_fd, c.out_buf, 1);
        Drain(key, c, c.err_fd, c.err_buf, 2);
        if (now >= c.kill_at) {
          kill(-c.pid, SIGKILL);
          c.kill_at = absl::InfiniteFuture();
        }
        int status = 0;
        pid_t r = waitpid(c.pid, &status, WNOHANG);
        if (r == c.pid) {
          // Whatever it left behind in its group goes too.
          kill(-c.pid, SIGKILL);
          for (int* fd : {&c.status_fd, &c.out_fd, &c.err_fd}) {
            if (*fd >= 0) {
              std::string* buf = fd == &c.status_fd ? &c.status_buf : fd == &c.out_fd ? &c.out_buf : &c.err_buf;
              int stream = fd == &c.status_fd ? 3 : fd == &c.out_fd ? 1 : 2;
              Drain(key, c, *fd, *buf, stream);
              if (*fd >= 0) {
                close(*fd);
                *fd = -1;
              }
            }
          }
          int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
          int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
          exited.emplace_back(key, code, sig);
          it = children_.erase(it);
          continue;
        }
        ++it;
      }
    }
    for (auto& [key, code, sig] : exited) {
      if (callbacks_.on_exit) callbacks_.on_exit(key, code, sig);
    }
  }
}

}  // namespace trainctl::worker
