#include "worker/trainer/rank_process_test_support.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/subprocess.h"
#include "common/temp_dir.h"
#include "worker/dist/rendezvous_store.h"

namespace trainctl::trainer::testing {
namespace {

constexpr int kChildStatusFd = 3;

}  // namespace

std::string RankBinary() {
#ifdef TRAINCTL_RANK_BINARY
  if (std::filesystem::exists(TRAINCTL_RANK_BINARY)) return TRAINCTL_RANK_BINARY;
#endif
  const char* bin = std::getenv("TRAINCTL_BINARY_DIR");
  return absl::StrCat(bin != nullptr ? bin : ".", "/worker/trainer/trainctl-rank");
}

std::string MakeTempDir(const std::string& tag) {
  return trainctl::MakeTempDir(absl::StrCat("trainctl_", tag));
}

rankproto::FlatConfig ResolvedJobConfig(const rankproto::FlatConfig& overrides) {
  const char* src = std::getenv("TRAINCTL_SOURCE_DIR");
  absl::StatusOr<rankproto::FlatConfig> c = rankproto::ReadConfigFile(
      absl::StrCat(src != nullptr ? src : ".", "/common/jobspec/testdata/resolved_defaults.conf"));
  // Unreadable: the overrides alone, and the rank names the first missing key.
  rankproto::FlatConfig out = c.ok() ? *std::move(c) : rankproto::FlatConfig{};
  for (const auto& [k, v] : overrides) out[k] = v;
  return out;
}

absl::StatusOr<std::unique_ptr<RankGroup>> RankGroup::Start(
    const std::string& dir, int world_size, const rankproto::FlatConfig& base,
    absl::Duration rendezvous_timeout, const std::vector<rankproto::FlatConfig>& per_rank) {
  std::unique_ptr<RankGroup> g(new RankGroup());
  g->dir_ = dir;
  g->procs_.resize(world_size);
  // One secret for the group's store, as the daemon passes one per attempt
  // (a test that sets its own keeps it).
  const std::string secret = dist::NewRendezvousSecret();
  auto config_for = [&](int rank) {
    rankproto::FlatConfig c = base;
    c.emplace(rankproto::run_keys::kStoreSecret, secret);
    c[rankproto::run_keys::kRank] = std::to_string(rank);
    c[rankproto::run_keys::kLocalRank] = std::to_string(rank);
    c[rankproto::run_keys::kWorldSize] = std::to_string(world_size);
    c[rankproto::run_keys::kLocalWorldSize] = std::to_string(world_size);
    c[rankproto::run_keys::kStatusFd] = std::to_string(kChildStatusFd);
    if (c.find(rankproto::run_keys::kWorkDir) == c.end()) {
      c[rankproto::run_keys::kWorkDir] = absl::StrCat(dir, "/work-", rank);
    }
    if (rank < static_cast<int>(per_rank.size())) {
      for (const auto& [k, v] : per_rank[rank]) c[k] = v;
    }
    return c;
  };
  absl::Status s = g->Launch(0, config_for(0));
  if (!s.ok()) return s;
  if (world_size == 1) return g;
  std::string address;
  const absl::Time deadline = absl::Now() + rendezvous_timeout;
  while (address.empty() && !g->procs_[0].exited() && absl::Now() < deadline) {
    g->Pump(absl::Milliseconds(50), [&](int rank, const std::string& line) {
      if (rank == 0 && line.rfind("rendezvous ", 0) == 0) {
        address = line.substr(11);
        return true;
      }
      return false;
    });
  }
  if (address.empty()) {
    if (g->procs_[0].exited()) return g;  // failed before the rendezvous; the caller inspects it
    return absl::DeadlineExceededError(
        absl::StrCat("rank 0 reported no rendezvous line\n", g->Describe()));
  }
  for (int r = 1; r < world_size; ++r) {
    rankproto::FlatConfig c = config_for(r);
    c[rankproto::run_keys::kStoreAddress] = address;
    s = g->Launch(r, c);
    if (!s.ok()) return s;
  }
  return g;
}

absl::Status RankGroup::Launch(int rank, const rankproto::FlatConfig& config) {
  Proc& p = procs_[rank];
  const std::string config_path = absl::StrCat(dir_, "/config-", rank, ".txt");
  absl::Status s = rankproto::WriteConfigFile(config_path, config);
  if (!s.ok()) return s;
  p.log_path = absl::StrCat(dir_, "/rank-", rank, ".log");
  // The child: status pipe on fd 3, stdout and stderr to the log file.
  const int log = open(p.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) return absl::InternalError(absl::StrCat("cannot open ", p.log_path));
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    close(log);
    return absl::InternalError("pipe2 failed");
  }
  SpawnOptions o;
  o.argv = {RankBinary(), "--config", config_path};
  o.fds = {{kChildStatusFd, fds[1]}, {STDOUT_FILENO, log}, {STDERR_FILENO, log}};
  absl::StatusOr<Subprocess> process = Subprocess::Spawn(o);
  close(fds[1]);
  close(log);
  if (!process.ok()) {
    close(fds[0]);
    return process.status();
  }
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  p.process = std::move(*process);
  p.fd = fds[0];
  return absl::OkStatus();
}

bool RankGroup::Pump(absl::Duration wait,
                     const std::function<bool(int, const std::string&)>& on_line) {
  std::vector<pollfd> pfds;
  std::vector<int> ranks;
  for (size_t r = 0; r < procs_.size(); ++r) {
    if (procs_[r].fd >= 0) {
      pfds.push_back({procs_[r].fd, POLLIN, 0});
      ranks.push_back(static_cast<int>(r));
    }
  }
  bool matched = false;
  if (!pfds.empty()) {
    poll(pfds.data(), pfds.size(), static_cast<int>(absl::ToInt64Milliseconds(wait)));
  } else {
    usleep(static_cast<useconds_t>(absl::ToInt64Microseconds(wait)));
  }
  for (size_t i = 0; i < pfds.size(); ++i) {
    Proc& p = procs_[ranks[i]];
    if (pfds[i].revents == 0) continue;
    char buf[4096];
    while (true) {
      ssize_t n = read(p.fd, buf, sizeof buf);
      if (n > 0) {
        p.partial.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n == 0) {  // writer closed: the process is gone
        close(p.fd);
        p.fd = -1;
      }
      break;  // EAGAIN or closed
    }
    size_t pos;
    while ((pos = p.partial.find('\n')) != std::string::npos) {
      std::string line = p.partial.substr(0, pos);
      p.partial.erase(0, pos + 1);
      p.lines.push_back(line);
      if (!matched && on_line && on_line(ranks[i], line)) matched = true;
    }
  }
  for (Proc& p : procs_) {
    if (!p.process.running()) continue;
    if (std::optional<ExitStatus> st = p.process.Poll()) p.exit_code = st->CodeOrMinusSignal();
  }
  return matched;
}

bool RankGroup::AllExited() const {
  for (const Proc& p : procs_) {
    if (p.process.running() || p.fd >= 0) return false;
  }
  return true;
}

bool RankGroup::WaitForLine(const std::function<bool(int, const std::string&)>& pred,
                            absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (Pump(absl::Milliseconds(20), pred)) return true;
    if (AllExited()) return false;
  }
  return false;
}

bool RankGroup::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!AllExited() && absl::Now() < deadline) Pump(absl::Milliseconds(50), nullptr);
  if (AllExited()) return true;
  Signal(SIGKILL);
  while (!AllExited()) Pump(absl::Milliseconds(20), nullptr);
  return false;
}

void RankGroup::Signal(int sig) {
  for (size_t r = 0; r < procs_.size(); ++r) SignalRank(static_cast<int>(r), sig);
}

void RankGroup::SignalRank(int rank, int sig) { procs_[rank].process.Signal(sig); }

int RankGroup::started() const {
  int n = 0;
  for (const Proc& p : procs_) n += p.process.pid() > 0 ? 1 : 0;
  return n;
}

std::vector<std::string> RankGroup::LinesWithPrefix(int rank, const std::string& prefix) const {
  std::vector<std::string> out;
  for (const std::string& l : procs_[rank].lines) {
    if (l.rfind(prefix, 0) == 0) out.push_back(l);
  }
  return out;
}

std::string RankGroup::log(int rank) const {
  std::ifstream in(procs_[rank].log_path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string RankGroup::Describe() const {
  std::string out;
  for (size_t r = 0; r < procs_.size(); ++r) {
    const Proc& p = procs_[r];
    absl::StrAppend(&out, "--- rank ", r, " pid ", p.process.pid(), " exit ", p.exit_code, ", ",
                    p.lines.size(), " status lines\n");
    size_t first = p.lines.size() > 8 ? p.lines.size() - 8 : 0;
    for (size_t i = first; i < p.lines.size(); ++i) absl::StrAppend(&out, "  | ", p.lines[i], "\n");
    if (p.process.pid() > 0) {
      std::string l = log(static_cast<int>(r));
      if (l.size() > 3000) l = l.substr(l.size() - 3000);
      absl::StrAppend(&out, "  log:\n", l, "\n");
    }
  }
  return out;
}

RankGroup::~RankGroup() {
  // Each Subprocess kills and reaps its child.
  for (Proc& p : procs_) {
    if (p.fd >= 0) close(p.fd);
  }
}

std::vector<std::pair<std::string, std::string>> MetricFields(const std::string& line) {
  std::vector<std::pair<std::string, std::string>> out;
  for (absl::string_view w : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    size_t eq = w.find('=');
    if (eq == absl::string_view::npos) continue;
    out.emplace_back(std::string(w.substr(0, eq)), std::string(w.substr(eq + 1)));
  }
  return out;
}

std::string MetricField(const std::string& line, const std::string& k) {
  for (auto& [key, v] : MetricFields(line)) {
    if (key == k) return v;
  }
  return "";
}

}  // namespace trainctl::trainer::testing
