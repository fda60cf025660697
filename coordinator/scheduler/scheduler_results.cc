// The scheduler's functions over its inputs' and results' values: the names
// of slot kinds and pending reasons, and PreferNodeZero (scheduler.h).
#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/scheduler/scheduler.h"

namespace trainctl::scheduler {

const char* SlotKindName(SlotKind kind) { return kind == SlotKind::kGpu ? "cuda" : "cpu"; }

const char* PendingReasonName(PendingReason reason) {
  switch (reason) {
    case PendingReason::kInvalidJob:
      return "invalid_job";
    case PendingReason::kNoWorkerOfKind:
      return "no_worker_of_kind";
    case PendingReason::kExceedsCapacity:
      return "exceeds_capacity";
    case PendingReason::kInsufficientFreeSlots:
      return "insufficient_free_slots";
    case PendingReason::kBlockedByReservation:
      return "blocked_by_reservation";
    case PendingReason::kUnknownQueue:
      return "unknown_queue";
    case PendingReason::kExceedsQueueLimit:
      return "exceeds_queue_limit";
    case PendingReason::kQuotaExceeded:
      return "quota_exceeded";
    case PendingReason::kPreempting:
      return "preempting";
  }
  return "unknown";
}

bool PreferNodeZero(Placement& placement, const std::function<bool(const std::string&)>& prefer) {
  // Nodes in node order, each with its ranks in rank order.
  std::vector<std::vector<RankAssignment>> nodes(static_cast<size_t>(placement.num_nodes));
  for (const RankAssignment& r : placement.ranks) {
    if (r.node_rank < 0 || r.node_rank >= placement.num_nodes) return false;
    nodes[static_cast<size_t>(r.node_rank)].push_back(r);
  }
  size_t chosen = nodes.size();
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (!nodes[n].empty() && prefer(nodes[n].front().worker_id)) {
      chosen = n;
      break;
    }
  }
  if (chosen == nodes.size()) return false;
  if (chosen == 0) return true;
  std::rotate(nodes.begin(), nodes.begin() + static_cast<std::ptrdiff_t>(chosen),
              nodes.begin() + static_cast<std::ptrdiff_t>(chosen) + 1);
  std::vector<RankAssignment> ranks;
  int rank = 0;
  for (size_t n = 0; n < nodes.size(); ++n) {
    for (RankAssignment r : nodes[n]) {
      r.rank = rank++;
      r.node_rank = static_cast<int>(n);
      ranks.push_back(std::move(r));
    }
  }
  placement.ranks = std::move(ranks);
  return true;
}

}  // namespace trainctl::scheduler
