// Placement of pending jobs: one scheduling pass turns every placeable
// PENDING/RESTARTING job into a new attempt (ranks on workers' free slots,
// rank 0 on a checkpoint holder, the steps a rollback skips) and starts it;
// elastic jobs (docs/elastic.md) start with what is free down to their
// minimum and grow back at a checkpoint. Command jobs run only on workers
// started with --allow-commands (a second pass over what the engine jobs
// left free: the pure scheduler stays unaware of the distinction).
//
// Each worker's view carries its allocatable CPUs and memory and whether it
// enforces limits (Worker.allocatable, from its registration) and what its
// live ranks reserve (their jobs' per-rank `resources`, stopping attempts'
// ranks included until they end); each job its per-rank resources: the
// scheduler fits ranks in both (scheduler.h, Resources). Its pending
// reasons reach `trainctl status` as every other.
//
// With queues (docs/queues.md) each pass also gives the scheduler the
// queues' quotas and weights, the running jobs and each queue's and owner's
// decayed usage (fair share; kept in the store every
// fair_share_save_interval and restored at start, so a restart or a standby
// taking over keeps the shares), and stops the running jobs it names as preemption victims: their
// attempt ends CANCELLED with `preempted_for`, the job goes back to
// RESTARTING (not a failure: no restart is counted) and resumes from its
// latest checkpoint once slots free. While a victim's ranks are still
// stopping it is not placed again; it counts as a stopping running job.
//
// Not thread-safe: built by JobOwners (job_owners.h), on the coordinator's EventLoop.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/prometheus.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/jobs/attempt_starter.h"
#include "coordinator/jobs/elastic_size.h"
#include "coordinator/jobs/fair_share_usage.h"
#include "coordinator/jobs/job_book.h"
#include "coordinator/jobs/owner_limits.h"
#include "coordinator/scheduler/scheduler.h"
#include "coordinator/store/state_store.h"
#include "coordinator/workers/worker_registry.h"

namespace trainctl::coordinator {

struct PlacerOptions {
  // SIGTERM -> SIGKILL grace a preempted job's ranks get: a training rank
  // stops at its next step boundary, a command gets SIGTERM.
  absl::Duration preemption_grace = absl::Seconds(60);
  // Half-life of the usage fair share orders queues by (> 0).
  absl::Duration fair_share_half_life = absl::Hours(1);
  // How often (on the tick) the usage is written to the store. Usage is
  // soft state: a crash loses at most this much of it.
  absl::Duration fair_share_save_interval = absl::Seconds(10);
};

// The defined queues as the scheduler sees them (usage left 0: the placer
// fills it in); empty = no queues, today's behaviour.
using QueueSource = std::function<std::vector<scheduler::QueueSpec>()>;

class JobPlacer {
 public:
  // `store` keeps the fair-share usage (nullptr: memory only).
  JobPlacer(JobBook* book, WorkerRegistry* registry, AttemptStarter* starter, const Clock* clock,
            PlacerOptions options = {}, StateStore* store = nullptr)
      : book_(book),
        registry_(registry),
        starter_(starter),
        clock_(clock),
        options_(options),
        store_(store),
        usage_(options.fair_share_half_life) {}

  // Where the queues come from (QueueRegistry::Specs); unset = no queues.
  void SetQueueSource(QueueSource source) { queue_source_ = std::move(source); }
  // Decayed usage per queue name, as of the last pass or tick.
  const absl::flat_hash_map<std::string, DecayedUsage>& usage() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    return usage_.queues();
  }
  // Per queue name, the decayed usage of each owner of its jobs (Job.owner);
  // a queue's usage is the sum of its owners'.
  const absl::flat_hash_map<std::string, absl::flat_hash_map<std::string, DecayedUsage>>&
  owner_usage() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    return usage_.owners();
  }
  // At start (before the first pass): the usage the store kept, decayed from
  // its as_of to now (nothing was held while no coordinator ran).
  void RestoreUsage(const v1::FairShareSnapshot& stored) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The usage as the store keeps it, as of now.
  v1::FairShareSnapshot UsageSnapshot() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // One scheduling pass: places what can start and launches the attempts.
  // A pass with jobs pending is timed (pass_latency) on the monotonic clock.
  void Schedule() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // How long the passes that had pending jobs took, the scheduler's choice
  // and the placements and preemptions it led to (thread-safe: read by the
  // /metrics page off the loop).
  const LatencyHistogram& pass_latency() const { return pass_latency_; }
  // Running jobs stopped as preemption victims since the coordinator started.
  int64_t preemptions() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return preemptions_; }
  // Asks for a pass (see SetDeferral).
  void RequestSchedule() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // With a deferral, the passes that submissions, ends and registrations
  // ask for are coalesced into one posted pass (a flood of submissions costs
  // one pass per loop turn, not one each); without one (tests) they run at once.
  void SetDeferral(std::function<void(std::function<void()>)> post) { post_ = std::move(post); }
  // On the tick: another pass when a placement's write failed or an elastic
  // job's wait for a replacement ran out.
  void OnTick(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Where `job` would be placed now (DryRun): its PendingJob under the id
  // "dry-run", scheduled against the current free slots.
  absl::StatusOr<scheduler::ScheduleResult> Plan(const v1::Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // After checkpoint `r` of a running elastic job below world_size: when
  // slots are free (and no pending job of its priority or higher waits),
  // stops the attempt so that the job restarts larger from `r`.
  void MaybeGrow(JobEntry& entry, const v1::CheckpointRecord& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

 private:
  // Alive workers with their free slots, as the scheduler sees them.
  std::vector<scheduler::WorkerSlots> WorkerView() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Ids of the alive workers started with --allow-commands.
  absl::flat_hash_set<std::string> AllowingCommands() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  scheduler::PendingJob ToPending(const JobEntry& e, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The queues with their usage and the jobs holding slots; empty without
  // queues. `stopping_jobs` gets the pending jobs whose earlier attempt's
  // ranks still hold slots (they wait until those have stopped).
  scheduler::QueueInput Queues(absl::flat_hash_set<std::string>* stopping_jobs) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Ages the usage to `mono` and adds what the jobs held since the last call.
  // Without queues it only keeps the time (nothing to share).
  void UpdateUsage(absl::Time mono) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The slots live ranks hold, per queue name and owner: [0] GPU, [1] CPU.
  HeldSlots SlotsHeldByOwner() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The queues' per-owner limits with what each owner runs now (live ranks).
  OwnerLimits RunningByOwner() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // On the tick: writes the usage when fair_share_save_interval has passed
  // since the last write (a failed write is retried at the next tick).
  void MaybeSaveUsage(absl::Time mono) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Schedule's body, once there are pending jobs.
  void SchedulePending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Makes placement `p` the job's new attempt and launches it.
  void Place(JobEntry& e, scheduler::Placement& p, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Stops running job `victim` so that pending job `for_job` gets its slots
  // or its queue's quota.
  void Preempt(const std::string& victim, const std::string& for_job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // With queues: whether `e`'s queue has quota left for another slot of the
  // kind its current attempt runs on, and for its CPUs and memory (an
  // elastic job grows only then).
  bool QueueHasRoom(const JobEntry& e, bool gpu) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  JobBook* book_;
  WorkerRegistry* registry_;
  AttemptStarter* starter_;
  const Clock* clock_;
  PlacerOptions options_;
  QueueSource queue_source_;
  StateStore* store_;
  FairShareUsage usage_ ABSL_GUARDED_BY(kLoop);
  // When the usage was last written (monotonic); InfinitePast = never.
  absl::Time usage_saved_mono_ ABSL_GUARDED_BY(kLoop) = absl::InfinitePast();
  // The last write stored no usage and none was gained since: nothing to write.
  bool usage_saved_empty_ ABSL_GUARDED_BY(kLoop) = false;
  // When usage_ was last aged (monotonic); InfinitePast = never.
  absl::Time usage_mono_ ABSL_GUARDED_BY(kLoop) = absl::InfinitePast();
  std::function<void(std::function<void()>)> post_;
  bool schedule_requested_ ABSL_GUARDED_BY(kLoop) = false;
  // A placement's write failed in the last pass; the tick asks for another.
  bool schedule_retry_ ABSL_GUARDED_BY(kLoop) = false;
  LatencyHistogram pass_latency_;
  int64_t preemptions_ ABSL_GUARDED_BY(kLoop) = 0;
};

}  // namespace trainctl::coordinator
