// GPU flavors in one scheduling pass (see flavor_quota.h).
#include "coordinator/scheduler/flavor_quota.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainctl::scheduler::internal {

absl::Status ValidateFlavorQuotas(const QueueInput& input) {
  for (const QueueSpec& q : input.queues) {
    for (const auto& [flavor, nominal] : q.nominal_gpu_flavors) {
      if (flavor.empty() || nominal < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("queue ", q.name, ": nominal_gpu_flavors[\"", flavor,
                         "\"]: a flavor and a quota >= 0, got ", nominal));
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

FlavorQuota::FlavorQuota(const QueueInput& input, absl::Span<const WorkerSlots> workers,
                         const QueueBook& book)
    : book_(book),
      nominal_(static_cast<size_t>(book.size())),
      used_(static_cast<size_t>(book.size())) {
  for (const WorkerSlots& w : workers) {
    if (w.kind == SlotKind::kGpu) flavor_of_[w.worker_id] = w.gpu_flavor;
  }
  for (const QueueSpec& spec : input.queues) {
    const int q = book.Find(spec.name);
    if (q < 0) continue;
    for (const auto& [flavor, nominal] : spec.nominal_gpu_flavors) nominal_[q][flavor] = nominal;
  }
  for (const RunningJob& r : input.running) {
    const int q = book.Find(r.queue);
    if (q >= 0 && r.kind == SlotKind::kGpu && !r.gpu_flavor.empty())
      used_[q][r.gpu_flavor] += r.slots;
  }
}

long long FlavorQuota::Nominal(int q, const std::string& flavor) const {
  if (q < 0 || flavor.empty()) return -1;
  auto it = nominal_[q].find(flavor);
  return it == nominal_[q].end() ? -1 : it->second;
}

long long FlavorQuota::Headroom(int q, const std::string& flavor) const {
  const long long nominal = Nominal(q, flavor);
  if (nominal < 0) return kUnbounded;
  auto it = used_[q].find(flavor);
  return std::max(0LL, nominal - (it == used_[q].end() ? 0 : it->second));
}

void FlavorQuota::Charge(int q, const Placement& p) {
  if (q < 0 || p.kind != SlotKind::kGpu) return;
  for (const RankAssignment& r : p.ranks) {
    auto it = flavor_of_.find(r.worker_id);
    if (it != flavor_of_.end() && !it->second.empty()) ++used_[q][it->second];
  }
}

std::string FlavorQuota::Text(int q, const std::string& flavor) const {
  auto it = used_[q].find(flavor);
  return absl::StrCat("queue ", book_.Name(q), ": ", it == used_[q].end() ? 0 : it->second, " of ",
                      Nominal(q, flavor), " ", KindText(SlotKind::kGpu, flavor), " used");
}

}  // namespace trainctl::scheduler::internal
