// GPU flavors in one scheduling pass (scheduler.h, "Flavors" and "Flavor
// quotas"; internal to scheduler.cc): the checks of the per-flavor quota
// fields, the flavor texts of messages, and the charge of a GPU job placed
// on flavored workers without asking for a flavor. The quota arithmetic
// itself is QueueBook's: each flavor with a nominal is one of its
// dimensions (queue_admission.h), lent, borrowed and reclaimed as the
// others are.
//
// Threading: one instance per Schedule() call; not thread-safe.
#pragma once

#include <map>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "coordinator/scheduler/queue_admission.h"
#include "coordinator/scheduler/worker_fit.h"

namespace trainctl::scheduler::internal {

// InvalidArgument naming the queue, the field and the flavor for an empty
// flavor or a value below 0 in nominal_gpu_flavors,
// borrowing_limit_gpu_flavors or lending_limit_gpu_flavors.
absl::Status ValidateFlavorQuotas(const QueueInput& input);

// "cuda", or "cuda (h100)" for a job asking for a flavor.
std::string KindText(SlotKind kind, const std::string& flavor);
// " (GPU flavors here: a100, h100)" over the pools with workers, or
// " (no schedulable GPU worker has a flavor)".
std::string FlavorsText(const std::map<std::string, KindPool>& pools);

// Each GPU worker's flavor, to count where a job's ranks landed.
class WorkerFlavors {
 public:
  explicit WorkerFlavors(absl::Span<const WorkerSlots> workers);

  // A GPU job of queue q that asked for no flavor (`job_flavor` "") holds,
  // after placement `p`, slots of the flavors its ranks' workers have:
  // charges each such flavor's dimension of `book` (counted against the
  // queue, never holding the job back). A flavored job's own flavor is in
  // its Demand already: nothing to do.
  void ChargeUnflavored(QueueBook& book, int q, const std::string& job_flavor,
                        const Placement& p) const;

 private:
  absl::flat_hash_map<std::string, std::string> flavor_of_;
};

}  // namespace trainctl::scheduler::internal
