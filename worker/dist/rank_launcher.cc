#include "worker/dist/rank_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "worker/dist/rendezvous_store.h"

namespace trainctl::dist::testing {
namespace {

using Clock = std::chrono::steady_clock;

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (log_fd >= 0) {
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
    }
    ::execv(cargv[0], cargv.data());
    _exit(127);
  }
  if (log_fd >= 0) ::close(log_fd);
  return pid;
}

std::vector<std::string> Argv(const std::string& scenario, int rank, int world,
                              const std::string& dir,
                              const std::map<std::string, std::string>& args,
                              const std::vector<std::map<std::string, std::string>>& per_rank,
                              const std::string& store, const std::string& secret) {
  std::vector<std::string> argv = {TRAINCTL_DIST_TEST_RANK,
                                   "--scenario=" + scenario,
                                   absl::StrCat("--rank=", rank),
                                   absl::StrCat("--world=", world),
                                   "--dir=" + dir};
  if (!store.empty()) argv.push_back("--store=" + store);
  // Test support only: the attempt's secret on argv is fine for a test's
  // ranks; trainctl's daemon hands it over in the 0600 rank config instead.
  argv.push_back("--store_secret=" + secret);
  for (const auto& [k, v] : args) argv.push_back(absl::StrCat("--", k, "=", v));
  if (static_cast<size_t>(rank) < per_rank.size()) {
    for (const auto& [k, v] : per_rank[rank]) argv.push_back(absl::StrCat("--", k, "=", v));
  }
  return argv;
}

}  // namespace

std::string MakeTempDir(const std::string& tag) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = absl::StrCat(base && *base ? base : "/tmp", "/trainctl_dist_", tag, "_XXXXXX");
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) return "";
  return std::string(buf.data());
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool WriteFileAtomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    out << content;
    if (!out.flush()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

absl::StatusOr<RankRun> RunRanks(const std::string& scenario, int world_size,
                                 const std::map<std::string, std::string>& args,
                                 absl::Duration timeout,
                                 const std::vector<std::map<std::string, std::string>>& per_rank_args) {
  RankRun run;
  run.dir = MakeTempDir(scenario);
  if (run.dir.empty()) return absl::InternalError("mkdtemp failed");
  const auto start = Clock::now();
  const auto deadline = start + absl::ToChronoNanoseconds(timeout);
  std::vector<pid_t> pids(world_size, -1);
  std::vector<std::string> log_paths;
  for (int r = 0; r < world_size; ++r) log_paths.push_back(absl::StrCat(run.dir, "/rank", r, ".log"));
  run.exit_codes.assign(world_size, -1000);

  auto reap = [&](bool block_until_deadline) {
    for (;;) {
      bool running = false;
      for (int r = 0; r < world_size; ++r) {
        if (pids[r] <= 0) continue;
        int st = 0;
        const pid_t got = ::waitpid(pids[r], &st, WNOHANG);
        if (got == pids[r]) {
          run.exit_codes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
          pids[r] = -1;
        } else {
          running = true;
        }
      }
      if (!running || !block_until_deadline || Clock::now() >= deadline) return running;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };

  // Rank 0 first: it hosts the store and publishes its address.
  const std::string secret = NewRendezvousSecret();
  pids[0] = Spawn(Argv(scenario, 0, world_size, run.dir, args, per_rank_args, "", secret), log_paths[0]);
  std::string store;
  const std::string addr_path = run.dir + "/store_address";
  while (world_size > 1 && Clock::now() < deadline) {
    if (auto s = ReadFile(addr_path); s.ok() && !s->empty()) {
      store = *s;
      break;
    }
    reap(false);
    if (pids[0] <= 0) break;  // rank 0 died before publishing
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (world_size > 1 && !store.empty()) {
    for (int r = 1; r < world_size; ++r) {
      pids[r] = Spawn(Argv(scenario, r, world_size, run.dir, args, per_rank_args, store, secret), log_paths[r]);
    }
  }
  if (reap(true)) {
    for (int r = 0; r < world_size; ++r) {
      if (pids[r] > 0) {
        ::kill(pids[r], SIGKILL);
        ::waitpid(pids[r], nullptr, 0);
        run.exit_codes[r] = -1000;
        pids[r] = -1;
      }
    }
  }
  run.elapsed = absl::FromChrono(Clock::now() - start);
  for (int r = 0; r < world_size; ++r) {
    auto log = ReadFile(log_paths[r]);
    run.logs.push_back(log.ok() ? *log : "");
  }
  return run;
}

}  // namespace trainctl::dist::testing
