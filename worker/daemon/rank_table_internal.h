// The RankTable's per-attempt and per-rank records, shared by the files
// that implement it (rank_table.cc: dispatch, the attempt table and
// /metrics' snapshot; rank_launch.cc: starting ranks and the rendezvous;
// rank_end.cc: stops and exits; rank_status_lines.cc: status lines, logs and
// metrics; daemon_artifacts.cc: fetches). Not part of the table's public
// face (rank_table.h).
//
// Threading: every field here belongs to the daemon's EventLoop; only loop
// handlers read or write them.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainctl/v1/worker_service.pb.h"
#include "worker/daemon/cgroup_limits.h"
#include "worker/daemon/local_rank_state.h"
#include "worker/daemon/rank_table.h"
#include "worker/daemon/rendezvous_backend.h"
#include "worker/protocol/rank_protocol.h"
#include "worker/trainer/tensorboard_writer.h"

namespace trainctl::worker {

// Lines of a rank's output kept for its end report.
inline constexpr size_t kLastLogLines = 20;

struct RankTable::LocalRank {
  v1::RankAssignment assignment;
  std::string key;  // "job/attempt/rank"
  // Where the rank stands; its end is reported by the transition into it.
  LocalRankState state;
  pid_t pid = -1;
  std::optional<rankproto::ErrorKind> error_kind;
  std::string error_message;
  int64_t error_step = 0;  // the step of a kNan error
  // The cgroup's OOM-kill count when the rank was launched (unknown: none).
  std::optional<int64_t> oom_kills_at_launch;
  // Its own cgroup, when the job has `resources` (removed at its end).
  std::optional<RankCgroup> cgroup;
  std::deque<std::string> last_lines;
  // Log forwarding (already rate limited by the RankSupervisor): lines for
  // the next chunk, and the count dropped since the last one.
  std::vector<v1::LogLine> pending_logs;
  int64_t dropped = 0;
  // LogLine.seq of the next line forwarded (a "dropped" note too), from 1.
  int64_t next_log_seq = 1;
  // Its latest train window (for /metrics and an OOM report).
  std::optional<v1::MetricPoint> last_train;
  // A command rank whose Python start-up hook beat (python/trainctl/
  // _rank_boot): it dumps its stacks on SIGUSR1. Another program may die of
  // that signal, so only such a rank is sent it.
  bool stack_hook = false;
  // A command rank's: its program as started (argv[0] looked up on the
  // daemon's PATH), named when an import fails; and its
  // TORCHELASTIC_ERROR_FILE (in its own directory, as torchrun's), whose
  // message becomes the failure's reason.
  std::string program;
  std::string error_file;
};

struct RankTable::LocalAttempt {
  std::string job_id;
  int32_t number = 0;
  v1::JobSpec spec;
  // This daemon hosts rank 0 and makes the rendezvous (RendezvousBackend).
  bool produce_rendezvous = false;
  bool gpu = false;
  // Set once the rendezvous is known here (made, or delivered); ranks other
  // than a self-reporting rank 0 start only then.
  std::optional<v1::RendezvousInfo> rendezvous;
  // A command job with code whose archive is not unpacked here yet: no rank
  // starts, and rank 0's daemon makes no rendezvous, until it is.
  bool code_pending = false;
  std::unique_ptr<RendezvousBackend> rendezvous_backend;
  std::map<int32_t, LocalRank> ranks;
  std::vector<v1::MetricPoint> pending_metrics;
  // Its checkpoint, TensorBoard and command directories, or why they are
  // refused here (RankWorkspace::ResolvePaths).
  AttemptPaths paths;
  // Who its ranks run as (RankWorkspace::JobIdentity).
  std::optional<RunAs> run_as;
  // A command job's: the daemon writes its rank 0's reports in
  // paths.tensorboard_dir
  // (WriteCommandTensorBoard), opened at the first; failed: given up.
  std::unique_ptr<trainer::TensorBoardWriter> tensorboard;
  bool tensorboard_failed = false;
  // The coordinator's record to resume from (unset: a fresh start).
  std::optional<v1::CheckpointRecord> resume;
  // Steps the ranks skip (a NaN rollback's), as run.skip_steps.
  std::string skip_steps;
  std::string spec_hash;
  // A command job (spec.command): ranks are the user's program.
  bool command = false;
  // The attempt's rendezvous secret: only ever written to the ranks' 0600
  // config files, never logged or reported.
  std::string store_secret;
};

// "job/attempt", the key of attempts_.
std::string AttemptKey(const std::string& job_id, int32_t attempt);

}  // namespace trainctl::worker
