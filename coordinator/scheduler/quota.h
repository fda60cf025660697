// Quota questions asked outside a scheduling pass: the largest job a queue
// can ever run, given every queue's nominal quota, cohort and borrowing and
// lending limits (scheduler.h, "Quota" and "Borrowing and lending limits").
// The coordinator asks it at submit to refuse a job its queue and cohort
// could never run (queue_registry.h, ResolveQueue); the scheduler applies
// the same number in every pass (kExceedsQueueLimit), from the same code
// (internal::QueueBook::Ceiling), so the two never disagree.
//
// Threading: stateless; safe to call from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/types/span.h"
#include "coordinator/scheduler/scheduler.h"

namespace trainctl::scheduler {

// The most slots of `kind` a job of queue `name` ("" = "default") may ever
// hold at once (its least size is compared with it): the queue's nominal
// plus all its cohort could lend under their lending limits, at most its
// nominal plus its borrowing limit. nullopt when that kind is unlimited for
// the queue, or the queue is not among `queues`. `queues` as Schedule takes
// them (valid; usage and owners do not matter).
std::optional<long long> QueueCeiling(absl::Span<const QueueSpec> queues, const std::string& name,
                                      SlotKind kind);

// The same for GPU slots of flavor `flavor` (scheduler.h, "Flavor
// quotas"): nullopt when no queue has a nominal for the flavor, the queue
// has none (it is not limited by flavor), or the queue is not among
// `queues`.
std::optional<long long> QueueFlavorCeiling(absl::Span<const QueueSpec> queues,
                                            const std::string& name, const std::string& flavor);

// A resource a job asks for more of than its queue can ever hold.
struct ResourceShort {
  // "resources.cpus" or "resources.memory".
  std::string field;
  // What the job asks in all ("64 GiB", "12 cpus") and the most the queue
  // with its cohort can ever hold of it ("32 GiB").
  std::string asks;
  std::string most;
};

// The same ceiling in CPUs and memory (scheduler.h, "Resource quotas"), for
// a job of `ranks` (its least size) asking `cpus` and `memory_bytes` per
// rank: the first of the two its queue can never hold, counted as the
// scheduler counts them; nullopt when both fit (or are unlimited).
std::optional<ResourceShort> QueueResourceShort(absl::Span<const QueueSpec> queues,
                                                const std::string& name, long long ranks,
                                                double cpus, std::int64_t memory_bytes);

// CPUs as the CPU quotas count them (scheduler.h, "Resource quotas"), in
// thousandths of a CPU: what one rank of a job asking `cpus` per rank holds
// (rounded up, at least 1 when it asks for any; 0 when it asks for none or
// `cpus` is not finite), and a quota field of `cpus` (rounded down; a
// negative one, unlimited, is -1). QueueStatus.used_cpus / borrowed_cpus
// are computed from these, so they read as admission counts.
long long RankMilliCpus(double cpus);
long long QuotaMilliCpus(double cpus);

// Whether one more rank asking `cpus` and `memory_bytes` (and, a GPU job
// asking for a flavor, one GPU slot of `gpu_flavor`) keeps queue `name`
// within its own nominal CPU, memory and flavor quotas, given what
// `running` holds (running jobs of queues not among `queues` are
// ignored): an elastic job grows only then (JobPlacer, as for its slots).
// True when all are unlimited, or the queue is not among `queues`.
bool QueueHasResourceRoom(absl::Span<const QueueSpec> queues, absl::Span<const RunningJob> running,
                          const std::string& name, double cpus, std::int64_t memory_bytes,
                          const std::string& gpu_flavor = "");

}  // namespace trainctl::scheduler
