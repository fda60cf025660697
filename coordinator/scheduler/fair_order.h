// The order a scheduling pass considers jobs in (scheduler.h, Order and
// Fair share): within a queue by priority, then submission; across queues
// by weighted dominant share; within a queue, owners by their own share.
// Internal to the scheduler.
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "coordinator/scheduler/queue_admission.h"
#include "coordinator/scheduler/scheduler_types.h"

namespace trainctl::scheduler::internal {

// Scheduling order: priority desc, submit_seq asc, job id asc.
inline bool ScheduledBefore(const PendingJob& a, const PendingJob& b) {
  if (a.priority != b.priority) return a.priority > b.priority;
  if (a.submit_seq != b.submit_seq) return a.submit_seq < b.submit_seq;
  return a.job_id < b.job_id;
}

// Calls `consider(job, queue)` for every job of `lines` (one list per
// queue, each in scheduling order): next a job of the queue with the
// lowest share, ties by fewer slots used, then queue name (queue index
// order); within the queue the head of an owner (see NextOfQueue).
template <typename Consider>
void ByShare(const QueueBook& book, const std::vector<const PendingJob*>& jobs,
             const std::vector<std::vector<int>>& lines, Consider consider) {
  // Per queue, its owners' lines (each in scheduling order) and how far
  // each has been considered. Without queues one line: the order above.
  struct OwnerLine {
    std::vector<int> jobs;
    size_t next = 0;
  };
  std::vector<std::vector<OwnerLine>> owners(lines.size());
  std::vector<size_t> left(lines.size(), 0);
  for (size_t q = 0; q < lines.size(); ++q) {
    absl::flat_hash_map<std::string, size_t> index;
    for (int j : lines[q]) {
      const std::string& owner = book.implicit() ? std::string() : jobs[j]->owner;
      auto [it, added] = index.try_emplace(owner, owners[q].size());
      if (added) owners[q].emplace_back();
      owners[q][it->second].jobs.push_back(j);
    }
    left[q] = lines[q].size();
  }
  while (true) {
    int best = -1;
    double best_share = 0;
    long long best_used = 0;
    for (int q = 0; q < static_cast<int>(lines.size()); ++q) {
      if (left[q] == 0) continue;
      const double share = book.Share(q);
      const long long used = book.UsedSlots(q);
      if (best < 0 || share < best_share || (share == best_share && used < best_used)) {
        best = q, best_share = share, best_used = used;
      }
    }
    if (best < 0) return;
    // The owner whose head goes next: highest priority, then lowest
    // owner share, then scheduling order.
    OwnerLine* pick = nullptr;
    double pick_share = 0;
    for (OwnerLine& line : owners[best]) {
      if (line.next >= line.jobs.size()) continue;
      const PendingJob& head = *jobs[line.jobs[line.next]];
      const double share = book.OwnerShare(best, head.owner);
      if (pick != nullptr) {
        const PendingJob& other = *jobs[pick->jobs[pick->next]];
        if (head.priority != other.priority) {
          if (head.priority < other.priority) continue;
        } else if (share != pick_share) {
          if (share > pick_share) continue;
        } else if (!ScheduledBefore(head, other)) {
          continue;
        }
      }
      pick = &line, pick_share = share;
    }
    --left[best];
    consider(pick->jobs[pick->next++], best);
  }
}

}  // namespace trainctl::scheduler::internal
