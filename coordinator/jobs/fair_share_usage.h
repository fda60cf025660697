// The decayed slot usage fair share orders queues and owners by
// (docs/queues.md): per queue and owner, slot-seconds per kind, aged by a
// half-life, as the store keeps it (FairShareSnapshot). A value: no clock,
// no store, no loop; JobPlacer ages it on its ticks and passes and saves it.
#pragma once

#include <array>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "trainctl/v1/queue.pb.h"

namespace trainctl::coordinator {

// Decayed usage of one queue in slot-seconds per kind ([0] GPU, [1] CPU).
using DecayedUsage = std::array<double, 2>;

// Slots held now: per queue name, per owner, per kind ([0] GPU, [1] CPU).
using HeldSlots =
    absl::flat_hash_map<std::string, absl::flat_hash_map<std::string, std::array<int, 2>>>;

class FairShareUsage {
 public:
  using OwnerUsage =
      absl::flat_hash_map<std::string, absl::flat_hash_map<std::string, DecayedUsage>>;

  // `half_life` > 0.
  explicit FairShareUsage(absl::Duration half_life) : half_life_(half_life) {}

  // Ages every usage by `dt` and adds `held` over it, taken as constant
  // meanwhile: usage' = usage * f + held * h/ln2 * (1 - f), f = 2^(-dt/h),
  // the exact decayed integral of a constant. What decays under a
  // thousandth of a slot-second goes (owners who left do not accumulate).
  void Advance(absl::Duration dt, const HeldSlots& held);
  void Clear();

  // The stored usage, decayed by `idle` (nothing was held meanwhile);
  // replaces what is here. A stored value that is negative or not finite
  // counts as none.
  void Restore(const v1::FairShareSnapshot& stored, absl::Duration idle);
  // The usage as the store keeps it, stamped `as_of`, queues sorted by name.
  v1::FairShareSnapshot Snapshot(absl::Time as_of) const;

  // Per queue name; the sum of its owners'.
  const absl::flat_hash_map<std::string, DecayedUsage>& queues() const { return usage_; }
  // Per queue name, each owner's (Job.owner).
  const OwnerUsage& owners() const { return owner_usage_; }
  bool empty() const { return owner_usage_.empty(); }

 private:
  absl::Duration half_life_;
  // Invariant: usage_[q] is the sum over owner_usage_[q] (decay is linear).
  absl::flat_hash_map<std::string, DecayedUsage> usage_;
  OwnerUsage owner_usage_;
};

}  // namespace trainctl::coordinator
