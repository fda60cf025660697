#include "coordinator/jobs/owner_limits.h"

#include "absl/strings/str_cat.h"

namespace trainctl::coordinator {

OwnerLimits::OwnerLimits(const std::vector<scheduler::QueueSpec>& queues) {
  for (const scheduler::QueueSpec& q : queues) {
    if (q.max_running_jobs_per_owner > 0 || q.max_slots_per_owner > 0) {
      limits_[q.name] = Limit{q.max_running_jobs_per_owner, q.max_slots_per_owner};
    }
  }
}

void OwnerLimits::AddRunning(const std::string& queue, const std::string& owner, int slots) {
  if (!limits_.contains(queue)) return;
  Load& l = loads_[{queue, owner}];
  ++l.jobs;
  l.slots += slots;
}

std::string OwnerLimits::Admit(const std::string& queue, const std::string& owner, int slots) {
  const auto it = limits_.find(queue);
  if (it == limits_.end()) return "";
  const Limit& limit = it->second;
  Load& l = loads_[{queue, owner}];
  if (limit.jobs > 0 && l.jobs >= limit.jobs) {
    return absl::StrCat("owner '", owner, "' has ", l.jobs, " running jobs in queue '", queue,
                        "', its max_running_jobs_per_owner; waits for one of them to end");
  }
  if (limit.slots > 0 && l.slots + slots > limit.slots) {
    return absl::StrCat("owner '", owner, "' holds ", l.slots, " slots in queue '", queue, "'; ",
                        slots, " more would pass its max_slots_per_owner of ", limit.slots);
  }
  ++l.jobs;
  l.slots += slots;
  return "";
}

}  // namespace trainctl::coordinator
