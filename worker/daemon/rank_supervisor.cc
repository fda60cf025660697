#include "worker/daemon/rank_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"

namespace trainctl::worker {
namespace {

constexpr size_t kMaxLine = 4096;

}  // namespace

RankSupervisor::RankSupervisor(RankCallbacks callbacks, SupervisorOptions options)
    : callbacks_(std::move(callbacks)), options_(options), monitor_([this] { Monitor(); }) {}

RankSupervisor::~RankSupervisor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [key, c] : children_) {
      c.process.SignalGroup(SIGKILL);
    }
  }
  monitor_.join();
}

absl::StatusOr<pid_t> RankSupervisor::Launch(const RankLaunch& l) {
  {
    absl::MutexLock lock(&mu_);
    if (children_.count(l.key) > 0)
      return absl::AlreadyExistsError(absl::StrCat("rank ", l.key, " is running"));
  }
  // Three pipes: stdout, stderr, status (read ends here, write ends to the child).
  int fds[6];
  for (int i = 0; i < 3; ++i) {
    if (pipe2(fds + 2 * i, O_CLOEXEC) != 0) {
      for (int j = 0; j < 2 * i; ++j) close(fds[j]);
      return absl::InternalError(absl::StrCat("pipe failed: ", std::strerror(errno)));
    }
  }
  SpawnOptions o;
  o.argv = {l.binary};
  o.argv.insert(o.argv.end(), l.args.begin(), l.args.end());
  o.env = l.env;
  o.work_dir = l.work_dir;
  o.fds = {{0, ChildFd::kDevNull}, {1, fds[1]}, {2, fds[3]}, {3, fds[5]}};
  o.fds.insert(o.fds.end(), l.extra_fds.begin(), l.extra_fds.end());
  o.run_as = l.run_as;
  o.cgroup_procs_fds = l.cgroup_procs_fds;
  // If the daemon dies, its ranks die with it.
  o.parent_death_signal = SIGKILL;
  o.exec_error_message = "trainctl-worker: cannot execute the rank binary\n";
  absl::StatusOr<Subprocess> process = Subprocess::Spawn(o);
  for (int i : {1, 3, 5}) close(fds[i]);
  if (!process.ok()) {
    for (int i : {0, 2, 4}) close(fds[i]);
    return process.status();
  }
  for (int i : {0, 2, 4}) fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
  const pid_t pid = process->pid();
  absl::MutexLock lock(&mu_);
  Child& c = children_[l.key];
  c.process = std::move(*process);
  c.out_fd = fds[0];
  c.err_fd = fds[2];
  c.status_fd = fds[4];
  c.tokens = options_.log_burst;
  c.refill_at = MonotonicNow();
  return pid;
}

bool RankSupervisor::Stop(const std::string& key, absl::Duration grace) {
  absl::MutexLock lock(&mu_);
  auto it = children_.find(key);
  if (it == children_.end() || !it->second.process.running()) return false;
  it->second.process.SignalGroup(SIGTERM);
  it->second.term_at = absl::InfiniteFuture();
  it->second.kill_at = std::min(it->second.kill_at, MonotonicNow() + grace);
  return true;
}

bool RankSupervisor::DumpStacksThenStop(const std::string& key, absl::Duration dump_wait,
                                        absl::Duration grace) {
  absl::MutexLock lock(&mu_);
  auto it = children_.find(key);
  if (it == children_.end() || !it->second.process.running()) return false;
  Child& c = it->second;
  if (c.kill_at != absl::InfiniteFuture() || c.term_at != absl::InfiniteFuture())
    return true;  // Stopping already.
  // The rank itself, not its group: DataLoader workers inherit the handler
  // and would bury the rank's stack under theirs.
  c.process.Signal(SIGUSR1);
  c.term_at = MonotonicNow() + dump_wait;
  c.term_grace = grace;
  return true;
}

std::vector<std::string> RankSupervisor::Running() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [k, c] : children_) out.push_back(k);
  return out;
}

bool RankSupervisor::WaitNoneRunning(absl::Duration timeout) const {
  const absl::Time until = MonotonicNow() + timeout;
  while (true) {
    uint64_t seen = 0;
    {
      absl::MutexLock lock(&mu_);
      if (children_.empty()) return true;
      seen = exits_.generation();  // under mu_: an exit after it wakes the wait
    }
    const absl::Duration left = until - MonotonicNow();
    if (left <= absl::ZeroDuration()) return false;
    exits_.WaitFor(seen, left);
  }
}

pid_t RankSupervisor::Pid(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = children_.find(key);
  return it == children_.end() ? -1 : it->second.process.pid();
}

bool RankSupervisor::Drain(const std::string& key, Child& c, int& fd, std::string& buf,
                           int stream) {
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

void RankSupervisor::DrainAfterExit(const std::string& key, Child& c, int& fd, std::string& buf,
                                    int stream) {
  // Until EAGAIN or EOF: the group is dead, the pipe ends soon.
  while (Drain(key, c, fd, buf, stream)) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) break;
  }
  if (fd >= 0) {
    close(fd);
    fd = -1;
  }
}

void RankSupervisor::Line(const std::string& key, Child& c, int stream, absl::string_view line) {
  if (stream == 3) {
    if (callbacks_.on_status) callbacks_.on_status(key, std::string(line));
    return;
  }
  // Token bucket: a rank printing in a tight loop is cut to the rate here,
  // before a line costs anything beyond reading it.
  absl::Time now = MonotonicNow();
  c.tokens =
      std::min<double>(options_.log_burst, c.tokens + absl::ToDoubleSeconds(now - c.refill_at) *
                                                          options_.log_lines_per_sec);
  c.refill_at = now;
  c.recent[c.recent_next].assign(line.data(), line.size());
  c.recent_next = (c.recent_next + 1) % c.recent.size();
  c.recent_count = std::min(c.recent_count + 1, c.recent.size());
  const int64_t bytes = static_cast<int64_t>(line.size());
  if (c.tokens < 1 ||
      pending_bytes_->load() + c.batch_bytes + bytes > options_.max_pending_log_bytes) {
    ++c.dropped;
    return;
  }
  c.tokens -= 1;
  c.batch_bytes += bytes;
  const Clock& clock = options_.clock != nullptr ? *options_.clock : *SystemClock::Get();
  c.batch.push_back(
      RankLogLine{stream, clock.Now(), std::string(line)});  // wall time: shown with the line
}

void RankSupervisor::EmitBatch(const std::string& key, Child& c) {
  if (c.batch.empty() && c.dropped == 0 && c.recent_count == 0) return;
  auto* batch = new RankLogBatch{std::move(c.batch), c.dropped, {}};
  int64_t bytes = c.batch_bytes;
  // The recent lines, oldest first.
  const size_t n = c.recent.size();
  const size_t first = (c.recent_next + n - c.recent_count) % n;
  int64_t recent_bytes = 0;
  for (size_t i = 0; i < c.recent_count; ++i)
    recent_bytes += static_cast<int64_t>(c.recent[(first + i) % n].size());
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
      absl::Time now = MonotonicNow();
      for (auto it = children_.begin(); it != children_.end();) {
        const std::string& key = it->first;
        Child& c = it->second;
        // Callbacks run under the lock: they only queue work elsewhere.
        Drain(key, c, c.status_fd, c.status_buf, 3);
        Drain(key, c, c.out_fd, c.out_buf, 1);
        Drain(key, c, c.err_fd, c.err_buf, 2);
        EmitBatch(key, c);
        if (now >= c.term_at) {
          c.process.SignalGroup(SIGTERM);
          c.kill_at = std::min(c.kill_at, now + c.term_grace);
          c.term_at = absl::InfiniteFuture();
        }
        if (now >= c.kill_at) {
          c.process.SignalGroup(SIGKILL);
          c.kill_at = absl::InfiniteFuture();
        }
        if (std::optional<ExitStatus> status = c.process.Poll()) {
          // Whatever it left behind in its group goes too.
          c.process.SignalGroup(SIGKILL);
          DrainAfterExit(key, c, c.status_fd, c.status_buf, 3);
          DrainAfterExit(key, c, c.out_fd, c.out_buf, 1);
          DrainAfterExit(key, c, c.err_fd, c.err_buf, 2);
          EmitBatch(key, c);
          exited.emplace_back(key, status->code, status->signal);
          it = children_.erase(it);
          continue;
        }
        ++it;
      }
    }
    if (!exited.empty()) exits_.Notify();
    for (auto& [key, code, sig] : exited) {
      if (callbacks_.on_exit) callbacks_.on_exit(key, code, sig);
    }
  }
}

}  // namespace trainctl::worker
