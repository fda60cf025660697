// GPU flavors in one scheduling pass (scheduler.h, "Flavors" and "Flavor
// quotas"; internal to scheduler.cc): what each queue holds of each GPU
// flavor against its nominal per flavor, and the flavor texts of messages.
//
// Threading: one instance per Schedule() call; not thread-safe.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "coordinator/scheduler/queue_admission.h"
#include "coordinator/scheduler/worker_fit.h"

namespace trainctl::scheduler::internal {

// InvalidArgument naming the queue and flavor for a flavor quota below 0.
absl::Status ValidateFlavorQuotas(const QueueInput& input);

// "cuda", or "cuda (h100)" for a job asking for a flavor.
std::string KindText(SlotKind kind, const std::string& flavor);
// " (GPU flavors here: a100, h100)" over the pools with workers, or
// " (no schedulable GPU worker has a flavor)".
std::string FlavorsText(const std::map<std::string, KindPool>& pools);

class FlavorQuota {
 public:
  // `input` passed ValidateFlavorQuotas; `book` is the pass's QueueBook
  // (queue indices). Counts the running jobs' slots by their flavor.
  FlavorQuota(const QueueInput& input, absl::Span<const WorkerSlots> workers,
              const QueueBook& book);

  // Queue q's nominal for `flavor`; -1 when it has none (or no flavor).
  long long Nominal(int q, const std::string& flavor) const;
  // GPU slots of `flavor` queue q may still take: nominal minus used
  // (never negative); kUnbounded without a nominal.
  long long Headroom(int q, const std::string& flavor) const;
  // Counts this pass's placement `p` of a job of queue q: each rank on the
  // flavor of its worker.
  void Charge(int q, const Placement& p);
  // "queue a: 3 of 4 cuda (h100) used".
  std::string Text(int q, const std::string& flavor) const;

 private:
  const QueueBook& book_;
  // Per queue index: nominal and used GPU slots by flavor.
  std::vector<std::map<std::string, long long>> nominal_, used_;
  // Each GPU worker's flavor ("" none).
  absl::flat_hash_map<std::string, std::string> flavor_of_;
};

}  // namespace trainctl::scheduler::internal
