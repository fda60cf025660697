// Health of running attempts, judged on the coordinator's tick: rendezvous
// timeouts, hangs (a rank's heartbeat missing past the bound, in any phase;
// adaptive from the ranks' heartbeats, rank_watch.h, from a script's
// reports and Python stacks, script_watch.h, or a fixed
// restart.progress_timeout_s; -1 turns progress checks off), stragglers, and ranks on workers whose
// lease expired (LOST). Each finding fails the attempt through JobActions
// (or records a `straggler` event); a failed write changes nothing in
// memory, so the next tick finds the same condition and tries again.
//
// Not thread-safe: built by JobOwners (job_owners.h), on the coordinator's EventLoop.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/jobs/job_actions.h"
#include "coordinator/jobs/job_book.h"
#include "coordinator/workers/worker_registry.h"

namespace trainctl::coordinator {

class JobHealth {
 public:
  struct Options {
    // Hang bound for jobs whose spec leaves restart.progress_timeout_s at 0
    // (the backstop behind the adaptive bound for engine jobs).
    absl::Duration progress_timeout = absl::Minutes(5);
    // An attempt whose ranks are not all ready this long after it was placed fails.
    absl::Duration rendezvous_timeout = absl::Minutes(2);
  };
  JobHealth(JobBook* book, WorkerRegistry* registry, JobActions* actions, Options options)
      : book_(book), registry_(registry), actions_(actions), options_(options) {}

  // Rendezvous timeouts, hangs and stragglers of every running attempt.
  // `now` is monotonic (Clock::Mono), as are every timer's anchors: a
  // stepped wall clock neither declares a hang nor hides one.
  void CheckAttempts(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The worker's lease expired: its ranks failed (the current attempt's
  // failure in the same write).
  void OnWorkerLost(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Ranks still placed on a LOST worker (an OnWorkerLost whose write failed).
  void RetryLostWorkers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // Since this coordinator started (JobGauges).
  int64_t hangs_detected() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return hangs_detected_; }
  int64_t straggler_events() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    return straggler_events_;
  }

 private:
  absl::Status CheckStarting(JobEntry& e, const v1::Attempt& a, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The heartbeat verdicts (rank_watch.h): silence, and with `stall_rule`
  // the adaptive stall bound; true when it failed the attempt (or tried to).
  bool CheckAdaptiveHang(JobEntry& e, const v1::Attempt& a, absl::Time now, bool stall_rule)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void RecordStragglers(JobEntry& e, const v1::Attempt& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::Status CheckProgressTimeout(JobEntry& e, const v1::Attempt& a, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Fails the attempt as HANG with the verdict's message, blaming its
  // first rank (counted, and a scheduling pass asked for, once stored).
  absl::Status FailHung(JobEntry& e, const v1::Attempt& a, const HangVerdict& v)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // A command job without restart.progress_timeout_s (script_watch.h).
  absl::Status CheckScriptHang(JobEntry& e, const v1::Attempt& a, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::Duration ProgressTimeout(const v1::Job& job) const;

  JobBook* book_;
  WorkerRegistry* registry_;
  JobActions* actions_;
  Options options_;
  int64_t hangs_detected_ ABSL_GUARDED_BY(kLoop) = 0;
  int64_t straggler_events_ ABSL_GUARDED_BY(kLoop) = 0;
};

}  // namespace trainctl::coordinator
