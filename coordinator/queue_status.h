// A queue with what its jobs hold now: the one rule QueueService (GetQueue,
// ListQueues), /metrics and the dashboard's queues page share.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "coordinator/job_queries.h"
#include "trainctl/v1/queue.pb.h"

namespace trainctl::coordinator {

// `queue` with its used slots and pending / running jobs from `usages`
// (JobQueries::QueueUsages; a queue without a live job uses nothing).
v1::QueueStatus QueueStatusOf(const v1::Queue& queue, const std::map<std::string, QueueUsage>& usages);
std::vector<v1::QueueStatus> QueueStatusesOf(const std::vector<v1::Queue>& queues,
                                             const std::map<std::string, QueueUsage>& usages);

// Slots a queue holds beyond its own nominal quota of a kind, i.e. borrowed
// from its cohort (docs/queues.md); 0 for an unlimited nominal.
int32_t BorrowedSlots(int32_t used, bool has_nominal, int32_t nominal);
inline int32_t BorrowedGpu(const v1::QueueStatus& s) {
  return BorrowedSlots(s.used_gpu(), s.queue().has_nominal_gpu(), s.queue().nominal_gpu());
}
inline int32_t BorrowedCpu(const v1::QueueStatus& s) {
  return BorrowedSlots(s.used_cpu(), s.queue().has_nominal_cpu(), s.queue().nominal_cpu());
}

}  // namespace trainctl::coordinator
