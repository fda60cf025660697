// The scheduling pass as the job placer runs it: the scheduler twice, first
// over engine jobs on every worker, then over command jobs on the workers
// that allow them (trainctl-worker --allow-commands) with what the first
// pass left.
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "coordinator/scheduler/scheduler.h"

namespace trainctl::coordinator {

// With queues, the first pass's placements count as running and its victims
// as stopping in the second; its ranks reserve their CPUs and memory and
// hold their slots for their runtime bound. A command job's pending message
// says it waits on the workers that allow commands.
absl::StatusOr<scheduler::ScheduleResult> ScheduleWithCommands(
    const std::vector<scheduler::PendingJob>& jobs,
    const absl::flat_hash_set<std::string>& command_jobs,
    std::vector<scheduler::WorkerSlots> workers, const absl::flat_hash_set<std::string>& allowing,
    scheduler::QueueInput queues);

}  // namespace trainctl::coordinator
