// Placement of pending jobs: one scheduling pass turns every placeable
// PENDING/RESTARTING job into a new attempt (ranks on workers' free slots,
// rank 0 on a checkpoint holder, the steps a rollback skips) and starts it;
// elastic jobs (docs/elastic.md) start with what is free down to their
// minimum and grow back at a checkpoint. Command jobs run only on workers
// started with --allow-commands (a second pass over what the engine jobs
// left free: the pure scheduler stays unaware of the distinction).
//
// Not thread-safe: owned by the JobManager, on the coordinator's EventLoop.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/attempt_starter.h"
#include "coordinator/job_book.h"
#include "coordinator/scheduler/scheduler.h"
#include "coordinator/worker_registry.h"

namespace trainctl::coordinator {

// Whether `spec` may run with fewer ranks than world_size.
bool IsElastic(const v1::JobSpec& spec);
// Elastic jobs: the fewest ranks the next attempt of `job` may start with
// now (scheduler::PendingJob::min_world_size; 0 = exactly world_size), and
// when that changes by itself (a replace timeout runs out;
// absl::InfiniteFuture() when it does not).
int ElasticMinimum(const v1::Job& job, absl::Time now);
absl::Time ElasticDeadline(const v1::Job& job);

class JobPlacer {
 public:
  JobPlacer(JobBook* book, WorkerRegistry* registry, AttemptStarter* starter, const Clock* clock)
      : book_(book), registry_(registry), starter_(starter), clock_(clock) {}

  // One scheduling pass: places what can start and launches the attempts.
  void Schedule();
  // Asks for a pass (see SetDeferral).
  void RequestSchedule();
  // With a deferral, the passes that submissions, ends and registrations
  // ask for are coalesced into one posted pass (a flood of submissions costs
  // one pass per loop turn, not one each); without one (tests) they run at once.
  void SetDeferral(std::function<void(std::function<void()>)> post) { post_ = std::move(post); }
  // On the tick: another pass when a placement's write failed or an elastic
  // job's wait for a replacement ran out.
  void OnTick(absl::Time now);
  // Where `job` would be placed now (DryRun): its PendingJob under the id
  // "dry-run", scheduled against the current free slots.
  absl::StatusOr<scheduler::ScheduleResult> Plan(const v1::Job& job) const;
  // After checkpoint `r` of a running elastic job below world_size: when
  // slots are free (and no pending job of its priority or higher waits),
  // stops the attempt so that the job restarts larger from `r`.
  void MaybeGrow(JobEntry& entry, const v1::CheckpointRecord& r);

 private:
  // Alive workers with their free slots, as the scheduler sees them.
  std::vector<scheduler::WorkerSlots> WorkerView() const;
  // Ids of the alive workers started with --allow-commands.
  absl::flat_hash_set<std::string> AllowingCommands() const;
  scheduler::PendingJob ToPending(const JobEntry& e, absl::Time now) const;
  // Makes placement `p` the job's new attempt and launches it.
  void Place(JobEntry& e, scheduler::Placement& p, absl::Time now);

  JobBook* book_;
  WorkerRegistry* registry_;
  AttemptStarter* starter_;
  const Clock* clock_;
  std::function<void(std::function<void()>)> post_;
  bool schedule_requested_ = false;
  // A placement's write failed in the last pass; the tick asks for another.
  bool schedule_retry_ = false;
};

}  // namespace trainctl::coordinator
