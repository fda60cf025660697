#include "worker/dist/multiprocess_test_support.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/safe_file.h"
#include "common/subprocess.h"
#include "common/temp_dir.h"
#include "worker/dist/rendezvous_store.h"

namespace trainctl::dist::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Starts one rank with stdout and stderr in `log_path` (a rank that cannot
// start shows as exit code 127 or a missing log).
Subprocess Spawn(const std::vector<std::string>& argv, const std::string& log_path) {
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  SpawnOptions o;
  o.argv = argv;
  if (log_fd >= 0) o.fds = {{1, log_fd}, {2, log_fd}};
  absl::StatusOr<Subprocess> p = Subprocess::Spawn(o);
  if (log_fd >= 0) ::close(log_fd);
  return p.ok() ? std::move(*p) : Subprocess();
}

std::vector<std::string> Argv(const std::string& scenario, int rank, int world,
                              const std::string& dir,
                              const std::map<std::string, std::string>& args,
                              const std::vector<std::map<std::string, std::string>>& per_rank,
                              const std::string& store, const std::string& secret) {
  std::vector<std::string> argv = {TRAINCTL_DIST_TEST_RANK, "--scenario=" + scenario,
                                   absl::StrCat("--rank=", rank), absl::StrCat("--world=", world),
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
  return trainctl::MakeTempDir("trainctl_dist_" + tag);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool WriteFileAtomic(const std::string& path, const std::string& content) {
  return WriteFileSafely(path, content).ok();
}

absl::StatusOr<RankRun> RunRanks(
    const std::string& scenario, int world_size, const std::map<std::string, std::string>& args,
    absl::Duration timeout, const std::vector<std::map<std::string, std::string>>& per_rank_args) {
  RankRun run;
  run.dir = MakeTempDir(scenario);
  if (run.dir.empty()) return absl::InternalError("mkdtemp failed");
  const auto start = Clock::now();
  const auto deadline = start + absl::ToChronoNanoseconds(timeout);
  std::vector<Subprocess> ranks(world_size);
  std::vector<std::string> log_paths;
  for (int r = 0; r < world_size; ++r)
    log_paths.push_back(absl::StrCat(run.dir, "/rank", r, ".log"));
  run.exit_codes.assign(world_size, -1000);

  // Reaps what exited; true while some rank still runs.
  auto reap = [&](bool block_until_deadline) {
    for (;;) {
      bool running = false;
      for (int r = 0; r < world_size; ++r) {
        if (!ranks[r].running()) continue;
        if (std::optional<ExitStatus> st = ranks[r].Poll()) {
          run.exit_codes[r] = st->CodeOrMinusSignal();
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
  ranks[0] =
      Spawn(Argv(scenario, 0, world_size, run.dir, args, per_rank_args, "", secret), log_paths[0]);
  std::string store;
  const std::string addr_path = run.dir + "/store_address";
  while (world_size > 1 && Clock::now() < deadline) {
    if (auto s = ReadFile(addr_path); s.ok() && !s->empty()) {
      store = *s;
      break;
    }
    reap(false);
    if (!ranks[0].running()) break;  // rank 0 died before publishing
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (world_size > 1 && !store.empty()) {
    for (int r = 1; r < world_size; ++r) {
      ranks[r] = Spawn(Argv(scenario, r, world_size, run.dir, args, per_rank_args, store, secret),
                       log_paths[r]);
    }
  }
  if (reap(true)) {
    // Past the deadline: what still runs is killed and stays at -1000.
    for (Subprocess& rank : ranks) {
      if (rank.running()) {
        rank.SignalGroup(SIGKILL);
        rank.Wait();
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
