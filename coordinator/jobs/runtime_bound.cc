#include "coordinator/jobs/runtime_bound.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "coordinator/jobs/job_book.h"
#include "coordinator/jobs/job_transitions.h"

namespace trainctl::coordinator {

double RuntimeBoundSeconds(const v1::Job& job, absl::Time now, absl::Duration grace) {
  const double limit = job.spec().scheduling().max_runtime_s();
  if (!(limit > 0) || !std::isfinite(limit)) return 0;
  const double used = absl::ToDoubleSeconds(RunningTime(job, now));
  return std::max(0.0, limit - used) + std::max(0.0, absl::ToDoubleSeconds(grace));
}

absl::flat_hash_map<std::string, std::vector<scheduler::WorkerSlots::Busy>> BusyByWorker(
    const JobBook& book, absl::Time now, absl::Duration grace) {
  constexpr double kNone = std::numeric_limits<double>::infinity();
  // Per job, its bound (computed once), and per worker and bound, slots.
  absl::flat_hash_map<std::string, double> bound;
  absl::flat_hash_map<std::string, std::map<double, int>> slots;
  book.ForEachLiveRank([&](const v1::RankAssignment& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    auto [it, added] = bound.try_emplace(r.job_id(), kNone);
    if (added) {
      if (const JobEntry* e = book.Find(r.job_id()); e != nullptr && !IsTerminal(e->job.state())) {
        const v1::Attempt* a = CurrentAttempt(e->job);
        const double b = RuntimeBoundSeconds(e->job, now, grace);
        if (a != nullptr && !AttemptEnded(a->state()) && b > 0) it->second = b;
      }
    }
    // A rank of an earlier (stopping) attempt is not bounded by the limit.
    const JobEntry* e = book.Find(r.job_id());
    const v1::Attempt* a = e != nullptr ? CurrentAttempt(e->job) : nullptr;
    const bool current = a != nullptr && a->number() == r.attempt();
    ++slots[r.worker_id()][current ? it->second : kNone];
  });
  absl::flat_hash_map<std::string, std::vector<scheduler::WorkerSlots::Busy>> out;
  for (const auto& [worker, by_bound] : slots) {
    for (const auto& [within, n] : by_bound) out[worker].push_back({n, within});
  }
  return out;
}

}  // namespace trainctl::coordinator
