// Test support: runs the ranks of a multi-process collective test as real
// processes on loopback. Each rank is the dist_test_rank helper
// (dist_test_rank.cc) running one scenario. Rank 0 hosts the rendezvous store
// on a free port and writes its address to <dir>/store_address; the launcher
// then starts the other ranks with that address, as the coordinator hands it
// out in production. Everything is bounded: ranks still running at the
// deadline are killed (SIGKILL, by pid).
//
// Threading: not thread-safe; one test thread uses it.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/dist/collectives.h"

namespace trainctl::dist::testing {

struct RankRun {
  std::string dir;                // scratch directory shared by the ranks
  std::vector<int> exit_codes;    // per rank; -N killed by signal N, -1000 killed at the deadline
  std::vector<std::string> logs;  // per rank: stdout+stderr
  absl::Duration elapsed;
};

// Runs `scenario` on `world_size` ranks. `args` go to every rank as --key=value;
// `per_rank_args[r]` (optional) only to rank r.
absl::StatusOr<RankRun> RunRanks(
    const std::string& scenario, int world_size, const std::map<std::string, std::string>& args,
    absl::Duration timeout,
    const std::vector<std::map<std::string, std::string>>& per_rank_args = {});

// The buffers of the "replicas" scenario, which the rank helper all-reduces
// and the test compares across ranks: sizes that take the Gloo engine's
// small-message path (<= 64 KiB) and Gloo's ring (above it; an odd count so
// that the ring's chunks are uneven), float32 and float64.
struct ReplicaCase {
  const char* name;
  CommDataType type;
  int64_t count;
  bool small;  // within GlooOptions::small_allreduce_max_bytes (default)
};
inline constexpr ReplicaCase kReplicaCases[] = {
    {"small_f32", CommDataType::kFloat32, 1000, true},
    {"small_f64", CommDataType::kFloat64, 1000, true},
    {"large_f32", CommDataType::kFloat32, 100003, false},
    {"large_f64", CommDataType::kFloat64, 50001, false},
};
// Each case is all-reduced this many times (the small path's second and
// later rounds reuse the ring it built in the first).
inline constexpr int kReplicaRounds = 2;

// A fresh directory under $TMPDIR (or /tmp).
std::string MakeTempDir(const std::string& tag);
absl::StatusOr<std::string> ReadFile(const std::string& path);
// Writes atomically (temp file + rename, common/safe_file.h) so readers never
// see half a file.
bool WriteFileAtomic(const std::string& path, const std::string& content);

}  // namespace trainctl::dist::testing
