// RankTable (rank_table.h): construction, the coordinator messages'
// dispatch and /metrics' snapshot. Starting ranks is rank_launch.cc, their
// ends rank_end.cc, what they say rank_status_lines.cc, fetches
// daemon_artifacts.cc.
//
// Threading: every function here runs on the daemon's EventLoop.
#include "worker/daemon/rank_table.h"

#include "absl/strings/str_cat.h"
#include "worker/daemon/rank_table_internal.h"

namespace trainctl::worker {

std::string AttemptKey(const std::string& job_id, int32_t attempt) {
  return absl::StrCat(job_id, "/", attempt);
}

RankTable::RankTable(const DaemonOptions& options, RankTablePaths paths, EventLoop& loop,
                     CoordinatorOutbox& out, RankLauncher& launcher, CodeSource* code)
    : options_(options),
      workspace_(options, std::move(paths)),
      loop_(loop),
      out_(out),
      launcher_(launcher),
      code_(std::make_unique<CodeCache>(options.work_dir + "/code", code, loop, options.clock,
                                        options.file_env)) {}

RankTable::~RankTable() {
  // The daemon is going: no rank cgroup outlives it (what is still in one
  // is killed; the supervisor kills the ranks anyway).
  for (auto& [key, a] : attempts_) {
    for (auto& [rank, r] : a->ranks) {
      if (r.cgroup.has_value()) (void)r.cgroup->Remove();
    }
  }
}

void RankTable::OnMessage(const v1::CoordinatorMessage& m) {
  loop_.CheckInLoop("RankTable::OnMessage");
  switch (m.msg_case()) {
    case v1::CoordinatorMessage::kStartRanks:
      return OnStartRanks(m.start_ranks());
    case v1::CoordinatorMessage::kRendezvous:
      return OnRendezvous(m.rendezvous());
    case v1::CoordinatorMessage::kStopRanks:
      return OnStopRanks(m.stop_ranks());
    case v1::CoordinatorMessage::kReadFile:
      return OnReadFile(m.read_file());
    case v1::CoordinatorMessage::kDropCheckpoints:
      return OnDropCheckpoints(m.drop_checkpoints());
    case v1::CoordinatorMessage::kPreflight:
      return OnPreflight(m.preflight());
    default:
      return;  // Acknowledgements: the session takes those it needs.
  }
}

RankTable::Snapshot RankTable::TakeSnapshot() {
  loop_.CheckInLoop("RankTable::TakeSnapshot");
  Snapshot snap;
  for (auto& [key, a] : attempts_) {
    for (auto& [rank, r] : a->ranks) {
      ++snap.by_state[r.state.gauge_label()];
      if (r.state.live()) snap.live.push_back({a->job_id, rank, r.last_train});
    }
  }
  return snap;
}

}  // namespace trainctl::worker
