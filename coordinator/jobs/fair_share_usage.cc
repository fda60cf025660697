// The decayed fair-share usage (see fair_share_usage.h).
#include "coordinator/jobs/fair_share_usage.h"

#include <cmath>

#include "absl/container/btree_map.h"
#include "common/time_util.h"

namespace trainctl::coordinator {

void FairShareUsage::Advance(absl::Duration dt, const HeldSlots& held) {
  const double h = absl::ToDoubleSeconds(half_life_);
  const double f = std::exp2(-absl::ToDoubleSeconds(dt) / h);
  const double gain = h / std::log(2.0) * (1 - f);
  for (auto& [q, u] : usage_) {
    for (double& x : u) x *= f;
  }
  for (auto& [q, owners] : owner_usage_) {
    for (auto& [owner, u] : owners) {
      for (double& x : u) x *= f;
    }
  }
  for (const auto& [q, owners] : held) {
    for (const auto& [owner, n] : owners) {
      for (int k = 0; k < 2; ++k) {
        usage_[q][k] += n[k] * gain;
        owner_usage_[q][owner][k] += n[k] * gain;
      }
    }
  }
  const auto negligible = [](const DecayedUsage& u) { return u[0] < 1e-3 && u[1] < 1e-3; };
  for (auto& [q, owners] : owner_usage_)
    absl::erase_if(owners, [&](const auto& kv) { return negligible(kv.second); });
  absl::erase_if(owner_usage_, [](const auto& kv) { return kv.second.empty(); });
  absl::erase_if(usage_, [&](const auto& kv) {
    return negligible(kv.second) && !owner_usage_.contains(kv.first);
  });
}

void FairShareUsage::Clear() {
  usage_.clear();
  owner_usage_.clear();
}

void FairShareUsage::Restore(const v1::FairShareSnapshot& stored, absl::Duration idle) {
  Clear();
  const double f =
      std::exp2(-std::max(0.0, absl::ToDoubleSeconds(idle)) / absl::ToDoubleSeconds(half_life_));
  const auto clean = [f](double x) { return std::isfinite(x) && x > 0 ? x * f : 0.0; };
  for (const v1::FairShareUsage& q : stored.queues()) {
    for (const auto& [owner, u] : q.owners()) {
      const DecayedUsage d = {clean(u.gpu_slot_seconds()), clean(u.cpu_slot_seconds())};
      owner_usage_[q.queue()][owner] = d;
      for (int k = 0; k < 2; ++k) usage_[q.queue()][k] += d[k];
    }
  }
}

v1::FairShareSnapshot FairShareUsage::Snapshot(absl::Time as_of) const {
  v1::FairShareSnapshot out;
  SetTimestamp(as_of, out.mutable_as_of());
  // Sorted, so that equal usage writes equal rows.
  absl::btree_map<std::string, const absl::flat_hash_map<std::string, DecayedUsage>*> queues;
  for (const auto& [q, owners] : owner_usage_) queues[q] = &owners;
  for (const auto& [q, owners] : queues) {
    v1::FairShareUsage* row = out.add_queues();
    row->set_queue(q);
    for (const auto& [owner, u] : *owners) {
      v1::FairShareOwnerUsage& o = (*row->mutable_owners())[owner];
      o.set_gpu_slot_seconds(u[0]);
      o.set_cpu_slot_seconds(u[1]);
    }
  }
  return out;
}

}  // namespace trainctl::coordinator
