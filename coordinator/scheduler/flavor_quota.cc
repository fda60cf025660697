// GPU flavors in one scheduling pass (see flavor_quota.h).
#include "coordinator/scheduler/flavor_quota.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainctl::scheduler::internal {

absl::Status ValidateFlavorQuotas(const QueueInput& input) {
  for (const QueueSpec& q : input.queues) {
    for (const auto& [field, values] :
         {std::pair<const char*, const std::map<std::string, int>*>{"nominal_gpu_flavors",
                                                                    &q.nominal_gpu_flavors},
          std::pair<const char*, const std::map<std::string, int>*>{"borrowing_limit_gpu_flavors",
                                                                    &q.borrowing_limit_gpu_flavors},
          std::pair<const char*, const std::map<std::string, int>*>{
              "lending_limit_gpu_flavors", &q.lending_limit_gpu_flavors}}) {
      for (const auto& [flavor, value] : *values) {
        if (flavor.empty() || value < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("queue ", q.name, ": ", field, "[\"", flavor,
                           "\"]: a flavor and a value >= 0, got ", value));
        }
      }
    }
  }
  return absl::OkStatus();
}

std::string KindText(SlotKind kind, const std::string& flavor) {
  return flavor.empty() ? SlotKindName(kind) : absl::StrCat(SlotKindName(kind), " (", flavor, ")");
}

std::string FlavorsText(const std::map<std::string, KindPool>& pools) {
  std::vector<std::string> names;
  for (const auto& [name, pool] : pools) {
    if (!pool.workers.empty()) names.push_back(name);
  }
  return names.empty() ? " (no schedulable GPU worker has a flavor)"
                       : absl::StrCat(" (GPU flavors here: ", absl::StrJoin(names, ", "), ")");
}

WorkerFlavors::WorkerFlavors(absl::Span<const WorkerSlots> workers) {
  for (const WorkerSlots& w : workers) {
    if (w.kind == SlotKind::kGpu) flavor_of_[w.worker_id] = w.gpu_flavor;
  }
}

void WorkerFlavors::ChargeUnflavored(QueueBook& book, int q, const std::string& job_flavor,
                                     const Placement& p) const {
  if (q < 0 || p.kind != SlotKind::kGpu || !job_flavor.empty()) return;
  std::map<int, long long> slots;  // by flavor dimension
  for (const RankAssignment& r : p.ranks) {
    auto it = flavor_of_.find(r.worker_id);
    const int d = it == flavor_of_.end() ? -1 : book.FlavorDim(it->second);
    if (d >= 0) ++slots[d];
  }
  for (const auto& [d, n] : slots) book.ChargeFlavor(q, d, n);
}

}  // namespace trainctl::scheduler::internal
