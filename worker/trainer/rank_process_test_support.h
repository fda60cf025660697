// Test harness: runs the ranks of one job as real trainctl-rank processes on
// loopback, the way the worker daemon does — a config file per rank, a status
// pipe per rank (run.status_fd), stdout+stderr to a log file — and collects
// their status lines and exit codes. Rank 0 starts first; once it reports
// "rendezvous HOST:PORT" the other ranks start with run.store_address set.
// Everything is bounded: processes still alive at a deadline are SIGKILLed
// (by pid), and the destructor kills (each rank's process group) and reaps
// whatever is left. Processes start through common/subprocess.h.
//
// Test-only (rank_process_test, fashion_mnist_train_test). Not thread-safe;
// one test thread uses a RankGroup.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "worker/protocol/rank_protocol.h"

namespace trainctl::trainer::testing {

// Path of the trainctl-rank binary this test was built with.
std::string RankBinary();

// A fresh directory under $TMPDIR (or /tmp).
std::string MakeTempDir(const std::string& tag);

// The job keys the worker writes for the minimal job (every default
// resolved: common/jobspec/testdata/resolved_defaults.conf, kept equal to
// ResolveJobSpecDefaults by job_defaults_test) with `overrides` on top. The
// rank has no defaults of its own, so a test config starts here.
rankproto::FlatConfig ResolvedJobConfig(const rankproto::FlatConfig& overrides);

class RankGroup {
 public:
  // Starts `world_size` ranks with `base` plus run.rank / run.world_size /
  // run.status_fd / run.store_address / run.work_dir (per-rank entries of
  // `per_rank` override). Files go to `dir` (config-N.txt, rank-N.log).
  // Returns once every rank is started, or once rank 0 exited before its
  // rendezvous line (then only rank 0 ran; see exit_code(0)).
  static absl::StatusOr<std::unique_ptr<RankGroup>> Start(
      const std::string& dir, int world_size, const rankproto::FlatConfig& base,
      absl::Duration rendezvous_timeout = absl::Seconds(30),
      const std::vector<rankproto::FlatConfig>& per_rank = {});

  ~RankGroup();
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  // Reads status lines until `pred(rank, line)` is true for some new line
  // (true), every process exited, or `timeout` passed (false).
  bool WaitForLine(const std::function<bool(int rank, const std::string& line)>& pred,
                   absl::Duration timeout);

  // Waits until every started process exited; SIGKILLs the rest at the
  // deadline. True when all exited by themselves.
  bool Wait(absl::Duration timeout);

  // Sends `sig` to every live process.
  void Signal(int sig);
  void SignalRank(int rank, int sig);

  int world_size() const { return static_cast<int>(procs_.size()); }
  // Processes actually started (1 when rank 0 failed before its rendezvous).
  int started() const;
  // Exit status; -N when killed by signal N; -1000 while running / not started.
  int exit_code(int rank) const { return procs_[rank].exit_code; }
  const std::vector<std::string>& lines(int rank) const { return procs_[rank].lines; }
  // Lines of `rank` starting with `prefix`.
  std::vector<std::string> LinesWithPrefix(int rank, const std::string& prefix) const;
  std::string log(int rank) const;
  // A summary of every rank's exit code, status lines and log tail, for
  // assertion messages.
  std::string Describe() const;

 private:
  struct Proc {
    Subprocess process;  // pid -1 until started
    int fd = -1;         // read end of the status pipe
    int exit_code = -1000;
    std::string partial;
    std::vector<std::string> lines;
    std::string log_path;
    bool exited() const { return process.exit_status().has_value(); }
  };
  RankGroup() = default;
  absl::Status Launch(int rank, const rankproto::FlatConfig& config);
  // One poll round (up to `wait`): reads lines, reaps exits. Calls `on_line`
  // for each new line; returns true when it returned true.
  bool Pump(absl::Duration wait, const std::function<bool(int, const std::string&)>& on_line);
  bool AllExited() const;

  std::string dir_;
  std::vector<Proc> procs_;
};

// Parses "k=v" words of a "metric ..." line into a map.
std::vector<std::pair<std::string, std::string>> MetricFields(const std::string& line);
// The value of key `k` in a metric line ("" when absent).
std::string MetricField(const std::string& line, const std::string& k);

}  // namespace trainctl::trainer::testing
