#include "worker/daemon/rank_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace trainctl::worker {
namespace {

constexpr size_t kMaxLine = 4096;

std::string EnvName(const std::string& kv) { return kv.substr(0, kv.find('=')); }

}  // namespace

RankSupervisor::RankSupervisor(RankCallbacks callbacks, SupervisorOptions options)
    : callbacks_(std::move(callbacks)), options_(options), monitor_([this] { Monitor(); }) {}

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
  c.tokens = options_.log_burst;
  c.refill_at = absl::Now();
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
  size_t read_this_round = 0;
  while (read_this_round < options_.max_read_per_round) {
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n > 0) {
      read_this_round += static_cast<size_t>(n);
      buf.append(chunk, static_cast<size_t>(n));
      size_t pos;
      size_t start = 0;
      while ((pos = buf.find('\n', start)) != std::string::npos || buf.size() - start > kMaxLine) {
        size_t len = pos == std::string::npos ? kMaxLine : std::min(pos - start, kMaxLine);
        Line(key, c, stream, absl::string_view(buf).substr(start, len));
        start = pos == std::string::npos ? start + kMaxLine : pos + 1;
      }
      buf.erase(0, start);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    // EOF or error: flush a last partial line.
    if (!buf.empty()) {
      Line(key, c, stream, buf);
      buf.clear();
    }
    close(fd);
    fd = -1;
    return false;
  }
  return true;  // More to read next round.
}

void RankSupervisor::Line(const std::string& key, Child& c, int stream, absl::string_view line) {
  if (stream == 3) {
    if (callbacks_.on_status) callbacks_.on_status(key, std::string(line));
    return;
  }
  // Token bucket: a rank printing in a tight loop is cut to the rate here,
  // before a line costs anything beyond reading it.
  absl::Time now = absl::Now();
  c.tokens = std::min<double>(options_.log_burst,
                              c.tokens + absl::ToDoubleSeconds(now - c.refill_at) * options_.log_lines_per_sec);
  c.refill_at = now;
  c.recent[c.recent_next].assign(line.data(), line.size());
  c.recent_next = (c.recent_next + 1) % c.recent.size();
  c.recent_count = std::min(c.recent_count + 1, c.recent.size());
  const int64_t bytes = static_cast<int64_t>(line.size());
  if (c.tokens < 1 || pending_bytes_->load() + c.batch_bytes + bytes > options_.max_pending_log_bytes) {
    ++c.dropped;
    return;
  }
  c.tokens -= 1;
  c.batch_bytes += bytes;
  c.batch.push_back(RankLogLine{stream, now, std::string(line)});
}

void RankSupervisor::EmitBatch(const std::string& key, Child& c) {
  if (c.batch.empty() && c.dropped == 0 && c.recent_count == 0) return;
  auto* batch = new RankLogBatch{std::move(c.batch), c.dropped, {}};
  int64_t bytes = c.batch_bytes;
  // The recent lines, oldest first.
  const size_t n = c.recent.size();
  const size_t first = (c.recent_next + n - c.recent_count) % n;
  int64_t recent_bytes = 0;
  for (size_t i = 0; i < c.recent_count; ++i) recent_bytes += static_cast<int64_t>(c.recent[(first + i) % n].size());
  // They come along while the memory bound allows (else they wait for the
  // next batch; there are never more than kRecentLines).
  if (pending_bytes_->load() + bytes + recent_bytes <= options_.max_pending_log_bytes) {
    for (size_t i = 0; i < c.recent_count; ++i) batch->recent.push_back(c.recent[(first + i) % n]);
    c.recent_count = 0;
    bytes += recent_bytes;
  }
  pending_bytes_->fetch_add(bytes);
  std::shared_ptr<std::atomic<int64_t>> pending = pending_bytes_;
  std::shared_ptr<const RankLogBatch> shared(batch, [pending, bytes](const RankLogBatch* b) {
    pending->fetch_sub(bytes);
    delete b;
  });
  c.batch.clear();
  c.batch_bytes = 0;
  c.dropped = 0;
  if (callbacks_.on_logs) callbacks_.on_logs(key, std::move(shared));
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
        EmitBatch(key, c);
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
              while (Drain(key, c, *fd, *buf, stream)) {
                // Until EAGAIN or EOF: the group is dead, the pipe ends soon.
                if (*fd < 0) break;
                pollfd p{*fd, POLLIN, 0};
                if (poll(&p, 1, 0) <= 0) break;
              }
              if (*fd >= 0) {
                close(*fd);
                *fd = -1;
              }
            }
          }
          EmitBatch(key, c);
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
