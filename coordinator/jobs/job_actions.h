// What the coordinator's owners (attempt_starter, job_health, job_placer)
// ask of the job lifecycle, implemented by the JobManager: fail an attempt
// and ask for a scheduling pass. An interface so that each owner is built
// and tested without the others. On the coordinator's loop.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/jobs/job_book.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::coordinator {

class JobActions {
 public:
  virtual ~JobActions() = default;
  // Fails `next`'s current attempt (BuildAttemptFailure), commits it with
  // `events` in one write and stops the surviving ranks. UNAVAILABLE when the
  // write failed (memory untouched).
  virtual absl::Status FailAttempt(JobEntry& entry, v1::Job next, std::vector<JobEvent> events,
                                   v1::FailureKind kind, const std::string& reason, int failed_rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) = 0;
  // Asks for a scheduling pass (coalesced; see JobPlacer::SetDeferral).
  virtual void RequestSchedule() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) = 0;
};

}  // namespace trainctl::coordinator
