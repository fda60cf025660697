// How long a job can still hold its slots (scheduler.h, Backfill by
// runtime): what is left of its runtime limit (scheduling.max_runtime_s,
// counted over its attempts as JobBook's RunningTime counts it) plus the
// grace it is stopped with when the limit is reached.
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/scheduler/scheduler.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::coordinator {

class JobBook;

// Seconds `job` can hold slots from `now` (scheduler::PendingJob::
// runtime_bound_s): the limit's remainder (never below 0) plus `grace`;
// 0 when the job has no runtime limit.
double RuntimeBoundSeconds(const v1::Job& job, absl::Time now, absl::Duration grace);

// Per worker, its live ranks' slots grouped by how long they can still be
// held (scheduler::WorkerSlots::busy). A rank of a job without a limit, or
// of an attempt being stopped (its end is the stop's, not the limit's), is
// listed without bound.
absl::flat_hash_map<std::string, std::vector<scheduler::WorkerSlots::Busy>> BusyByWorker(
    const JobBook& book, absl::Time now, absl::Duration grace) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

}  // namespace trainctl::coordinator
