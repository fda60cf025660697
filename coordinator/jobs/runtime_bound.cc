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
  // Per job, looked up once: the attempt its limit bounds (its current one,
  // while it runs; -1: none) and the bound. A rank of another attempt (an
  // earlier one, stopping) ends with its stop, not the limit: no bound.
  struct Bounded {
    int attempt = -1;
    double bound = kNone;
  };
  absl::flat_hash_map<std::string, Bounded> jobs;
  absl::flat_hash_map<std::string, std::map<double, int>> slots;
  book.ForEachLiveRank([&](const v1::RankAssignment& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    auto [it, added] = jobs.try_emplace(r.job_id());
    if (added) {
      const JobEntry* e = book.Find(r.job_id());
      const v1::Attempt* a =
          e != nullptr && !IsTerminal(e->job.state()) ? CurrentAttempt(e->job) : nullptr;
      const double b =
          a != nullptr && !AttemptEnded(a->state()) ? RuntimeBoundSeconds(e->job, now, grace) : 0;
      if (b > 0) it->second = {a->number(), b};
    }
    ++slots[r.worker_id()][r.attempt() == it->second.attempt ? it->second.bound : kNone];
  });
  absl::flat_hash_map<std::string, std::vector<scheduler::WorkerSlots::Busy>> out;
  for (const auto& [worker, by_bound] : slots) {
    for (const auto& [within, n] : by_bound) out[worker].push_back({n, within});
  }
  return out;
}

}  // namespace trainctl::coordinator
