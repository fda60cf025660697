// A queue with what its jobs hold now: the one rule QueueService (GetQueue,
// ListQueues), /metrics and the dashboard's queues page share.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "coordinator/jobs/job_queries.h"
#include "trainctl/v1/queue.pb.h"

namespace trainctl::coordinator {

// `queue` with its used and borrowed slots, CPUs and memory, its used and
// borrowed GPU slots by flavor, and pending / running jobs from `usages`
// (JobQueries::QueueUsages; a queue without a live job uses nothing).
// Clients read `borrowed_*` rather than computing it.
v1::QueueStatus QueueStatusOf(const v1::Queue& queue,
                              const std::map<std::string, QueueUsage>& usages);
std::vector<v1::QueueStatus> QueueStatusesOf(const std::vector<v1::Queue>& queues,
                                             const std::map<std::string, QueueUsage>& usages);

// Slots a queue holds beyond its own nominal quota of a kind, i.e. borrowed
// from its cohort (docs/queues.md); 0 for an unlimited nominal. The one
// place the rule is written: QueueStatusOf fills QueueStatus.borrowed_*.
int32_t BorrowedSlots(int32_t used, bool has_nominal, int32_t nominal);
// The same in CPUs (thousandths, the nominal as scheduler::QuotaMilliCpus
// gives it) and bytes of memory: QueueStatus.borrowed_cpus / _memory_bytes.
int64_t Borrowed(int64_t used, bool has_nominal, int64_t nominal);

}  // namespace trainctl::coordinator
