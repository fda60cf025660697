// The one transition table of a job, its attempts and their ranks.
//
//   job:     PENDING → SCHEDULED → RUNNING → SUCCEEDED | FAILED | CANCELLED | TIMEOUT
//                          ↑           │
//                          └ RESTARTING ┘   (an attempt failed, restarts remain)
//            (TIMEOUT, past scheduling.max_runtime_s: from SCHEDULED,
//            RUNNING or RESTARTING)
//   attempt: STARTING → RUNNING → SUCCEEDED | FAILED | CANCELLED
//            (STARTING may end directly: a fast job, a failure, a cancel)
//   rank:    ASSIGNED → STARTING → RUNNING → SUCCEEDED | FAILED | STOPPED
//            (any earlier state may end directly)
//
// JobBook::Commit checks every change of a job against this table
// (CheckJobChange): a change that skips back is refused before anything is
// written. Pure functions; any thread.
#pragma once

#include "absl/status/status.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::coordinator {

bool IsTerminal(v1::JobState s);
bool IsTerminal(v1::RankState s);
bool AttemptEnded(v1::AttemptState s);

// Whether a job, attempt or rank may go from `from` to `to` (staying in the
// same state is allowed: an update without a state change).
bool JobTransitionAllowed(v1::JobState from, v1::JobState to);
bool AttemptTransitionAllowed(v1::AttemptState from, v1::AttemptState to);
bool RankTransitionAllowed(v1::RankState from, v1::RankState to);

const char* StateName(v1::JobState s);

// Whether `to` is a legal successor of `from` (the same job): the job's
// state by the table; attempts are only appended (a new one STARTING with
// its ranks ASSIGNED) and keep their ranks; every attempt's and rank's state
// follows the table. INTERNAL naming the first illegal change otherwise.
absl::Status CheckJobChange(const v1::Job& from, const v1::Job& to);

}  // namespace trainctl::coordinator
