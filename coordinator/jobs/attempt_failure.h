// What an attempt's failure does to its job: the failure reason's words,
// the restart policy (restart, roll back past a NaN step, or fail the job by
// kind and budget) and the steps a rollback skips. Pure functions on the
// Job proto; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/jobs/job_book.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::coordinator {

// "rank R on HOST (worker W) exited with code C: message" plus its last log
// lines. `cause`: what made the rank fail when it was not its own doing (a
// lost peer worker, "worker W (host H) was lost"), named first; or empty.
std::string DescribeExit(const v1::RankAssignment& r, const v1::ExitInfo& exit,
                         const std::string& cause = "");

// Builds the failure of `next`'s current attempt into `next` (the job with
// the failing rank's end already applied): the attempt FAILED with `reason`
// and `kind`, the job RESTARTING or FAILED by its restart policy, their
// events appended to `events`. Returns the ranks to stop once it is
// committed; nothing when the attempt had already ended.
// `first_backoff` is RestartBackoff's `first` (the `restarting` event says
// how long the restart waits).
RanksByWorker BuildAttemptFailure(v1::Job& next, std::vector<JobEvent>& events, absl::Time now,
                                  v1::FailureKind kind, const std::string& reason, int failed_rank,
                                  absl::Duration first_backoff = absl::ZeroDuration());

// How long the next attempt waits after the failure that used restart
// number `restarts` (1 for the first): `first`, doubling, at most 30 s
// (docs/failures.md "Restart backoff"); 0 when `first` is 0. A fault that
// keeps recurring (a crashing dependency, a flapping host) does not burn
// every restart in a second.
absl::Duration RestartBackoff(int32_t restarts, absl::Duration first);

// restart.disk_full_wait_s when a spec leaves it out (job_defaults sets it
// at submission; a job stored before the field existed has none).
inline constexpr int32_t kDefaultDiskFullWaitS = 600;
// The wait before the next attempt of a job waiting for space, after
// `run` DISK_FULL attempts in a row: 2 s, doubling, at most 30 s (the
// restart backoff's curve from 2 s).
inline absl::Duration DiskFullBackoff(int run) { return RestartBackoff(run, absl::Seconds(2)); }
// DiskFullBackoff for `job` when it is RESTARTING after a DISK_FULL
// attempt (waiting for space); else zero.
absl::Duration WaitForSpaceBackoff(const v1::Job& job);

// The step a FAILURE_KIND_NAN attempt failed at (the lowest its ranks
// reported), or -1.
int64_t NanStep(const v1::Attempt& a);
// Steps the next attempt skips: every earlier attempt's skip list plus the
// step of each attempt that failed with FAILURE_KIND_NAN (sorted, unique).
// Restarts of other kinds keep the list, so a later resume from an older
// checkpoint still passes over the bad steps.
std::vector<int64_t> RollbackSkipSteps(const v1::Job& job);

}  // namespace trainctl::coordinator
