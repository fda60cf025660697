// The coordinator's jobs in memory, and the one place they change.
//
// Every transition goes through Commit(): built in full by its owner first
// (a rank's end together with the attempt failure and restart it causes),
// checked against the transition table (job_transitions.h), written to the
// StateStore (the job with its attempts, plus its events, in one
// transaction), then applied to memory, then published to watchers. A failed
// write leaves memory untouched and is UNAVAILABLE; nothing is ever
// half-applied.
//
// Inside a store group (TelemetryLedger, group_memory.h) Commit's write is
// not durable yet: the JobBook then remembers each job as it was before the
// group first touched it (Find, At, ForWorker, Add) and holds every effect
// that leaves the coordinator (publications to watchers, messages to
// workers: AfterCommit). A committed group releases the effects in order; a
// rolled-back one restores the jobs and drops the effects, so memory is what
// the store has and event numbers stay dense (an event's seq follows the
// stored last_event_seq).
//
// Soft state — a job's progress and metric summary, its ranks' last step and
// progress time, and the memory-only parts of a JobEntry — changes without a
// write (telemetry would otherwise cost a transaction per report): it is
// persisted with the job's next Commit and published by PublishSnapshot.
//
// Also keeps the indexes the owners walk (pending jobs, jobs holding slots,
// unsettled jobs) and the pending reasons of the last scheduling pass.
// Not thread-safe: built by JobOwners (job_owners.h), on the coordinator's EventLoop.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "coordinator/core/group_memory.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/jobs/job_transitions.h"
#include "coordinator/jobs/rank_watch.h"
#include "coordinator/jobs/script_watch.h"
#include "coordinator/jobs/usage_report.h"
#include "coordinator/store/state_store.h"
#include "coordinator/telemetry/metrics_hub.h"
#include "trainctl/v1/job.pb.h"
#include "trainctl/v1/worker_service.pb.h"

namespace trainctl::coordinator {

// An event to store with a transition (Event.seq/time/state are set by Commit).
struct JobEvent {
  std::string type;
  std::string message;
  int32_t attempt = 0;
  int32_t rank = -1;
};

// Ranks grouped by worker, in node order.
using RanksByWorker = std::vector<std::pair<std::string, std::vector<int32_t>>>;

struct JobEntry {
  v1::Job job;
  int64_t submit_seq = 0;
  int64_t last_event_seq = 0;
  // Latest KIND_TRAIN metric point per rank of the current attempt (memory only).
  absl::flat_hash_map<int32_t, v1::MetricPoint> last_points;
  // Rank 0's final model report of the current attempt, until it SUCCEEDS.
  std::optional<v1::FinalModelReport> final_model;
  std::string final_model_worker;
  // The rendezvous secret of attempt `secret_attempt` (memory only, never
  // in the Job): made at its first StartRanks, the same in every re-send.
  // After a coordinator restart a re-send for an attempt still starting
  // gets a new one; that attempt's rendezvous then fails and the job
  // restarts (documented in docs/security.md).
  std::string rendezvous_secret;
  int32_t secret_attempt = 0;
  // Pre-flight of attempt `preflight_attempt` (memory only): each worker's
  // problems as it reported them; `preflight_passed` once every worker of
  // the attempt reported none (StartRanks went out).
  int32_t preflight_attempt = 0;
  std::map<std::string, std::vector<std::string>> preflight_reports;
  // The workers whose problems were all a lack of space (waiting_for_space).
  std::set<std::string> preflight_space_only;
  bool preflight_passed = false;
  // Heartbeats of the current attempt's ranks (memory only).
  RankWatch watch;
  // Reports and start-up-hook heartbeats of a command job's current attempt
  // (memory only).
  ScriptWatch script_watch;
  // The current attempt's timers on the monotonic clock (Clock::Mono;
  // memory only): when it was placed (rendezvous timeout) and each rank's
  // last progress (progress timeout). A stepped wall clock moves neither.
  // Unknown after a coordinator restart (InfiniteFuture / absent): the
  // timer then counts from the first check.
  absl::Time start_mono = absl::InfiniteFuture();
  absl::flat_hash_map<int32_t, absl::Time> progress_mono;
  // A RESTARTING job is not placed before this (monotonic; the restart
  // backoff, attempt_failure.h RestartBackoff); InfinitePast = no wait.
  absl::Time restart_not_before = absl::InfinitePast();
  // When a PENDING job was submitted, monotonic (scheduling.
  // pending_timeout_s); InfinitePast = not stamped yet (after a coordinator
  // restart the first tick stamps it).
  absl::Time pending_since_mono = absl::InfinitePast();
  // Accounting (usage_report.h): each rank's cgroup figures from its exit
  // report, by (attempt, rank), until the attempt's record is stored
  // (memory only: a coordinator restart in between loses them, and the
  // record says "unknown").
  absl::flat_hash_map<std::pair<int32_t, int32_t>, RankFigures> rank_figures;
  // Workers of this job's stragglers, placed around at the next attempts
  // when stragglers.policy is avoid (memory only).
  std::vector<std::string> avoid_workers;
};

// The current (last) attempt of `job`, or nullptr before the first.
v1::Attempt* CurrentAttempt(v1::Job& job);
const v1::Attempt* CurrentAttempt(const v1::Job& job);
// A current attempt that has not ended although every rank has.
bool Unsettled(const v1::Job& job);
// Workers of an attempt, in node order.
std::vector<std::string> AttemptWorkers(const v1::Attempt& a);
// Ranks of an attempt that have not ended, grouped by worker (node order).
RanksByWorker LiveRanksByWorker(const v1::Attempt& a);
// The job's running time (scheduling.max_runtime_s): from each attempt's
// placement to its end, summed over every attempt (restarts and
// preemptions do not reset it; the waits between attempts do not count).
// An attempt not ended counts up to `now`. From the attempts' stored start
// and end times, so a coordinator restart loses none of it.
absl::Duration RunningTime(const v1::Job& job, absl::Time now);

class JobBook : public GroupMemory {
 public:
  JobBook(StateStore* store, MetricsHub* hub, const Clock* clock)
      : store_(store), hub_(hub), clock_(clock) {}
  // The loop every call must come from (checked at run time, in every build); unbound
  // (unit tests) checks nothing.
  void BindToLoop(const EventLoop* loop) { loop_ = loop; }

  // Rebuilds memory from the store. Hang detection restarts its clock: the
  // coordinator was away, not the ranks.
  void Recover(const StoreSnapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // Stores `job` (PENDING, with a new id from NewId) with its first events
  // and keeps it; nothing is kept when the write fails.
  absl::StatusOr<JobEntry*> Add(v1::Job job, std::vector<JobEvent> events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Persists `next` (the entry's job after a change) with `events`, then
  // applies and publishes it. The only place a job's state changes.
  absl::Status Commit(JobEntry& entry, v1::Job next, std::vector<JobEvent> events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Publishes the entry's job without its attempts (after a soft change).
  void PublishSnapshot(const JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // GroupMemory (see the opening comment).
  void GroupBegun() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) override;
  void GroupEnded(bool committed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) override;
  // Runs `effect` (something that leaves the coordinator: a publication, a
  // message to a worker) now, or inside a group once it commits; a group
  // rolled back drops it. `effect` must capture what it sends by value.
  void AfterCommit(std::function<void()> effect) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // An unused id for a job named `name`.
  std::string NewId(const std::string& name) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  JobEntry* Find(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  const JobEntry* Find(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  JobEntry& At(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    Remember(job_id);
    return jobs_.at(job_id);
  }
  const JobEntry& At(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    return jobs_.at(job_id);
  }
  // The entry of `job_id` for a report of `worker_id` about `attempt` (and
  // `rank` when >= 0, which must be that worker's): NOT_FOUND, INVALID_ARGUMENT,
  // PERMISSION_DENIED, or ABORTED for an attempt that is not the current one
  // unless `allow_stale`. `*attempt_out` points into the entry's job.
  absl::StatusOr<JobEntry*> ForWorker(const std::string& worker_id, const std::string& job_id,
                                      int32_t attempt, int32_t rank, bool allow_stale,
                                      v1::Attempt** attempt_out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  const absl::btree_map<std::string, JobEntry>& entries() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    return jobs_;
  }
  // Jobs waiting for placement (PENDING, RESTARTING), by id.
  const absl::btree_set<std::string>& pending() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    return pending_;
  }
  // Jobs with at least one rank not ended, in any attempt (they hold slots).
  const absl::btree_set<std::string>& holding_slots() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    return holding_slots_;
  }
  // Jobs loaded by Recover whose current attempt has every rank ended but is
  // not ended itself (written by a version that committed a rank's end and
  // the attempt's failure separately); the JobManager's Tick settles them.
  const absl::btree_set<std::string>& unsettled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    return unsettled_;
  }
  void MarkSettled(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    Remember(job_id);
    unsettled_.erase(job_id);
  }
  // Why a pending job waits, from the last scheduling pass (not persisted).
  void SetPendingReason(const std::string& job_id, std::string reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    Remember(job_id);
    pending_reasons_[job_id] = std::move(reason);
  }
  const std::string* PendingReason(const std::string& job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Jobs not terminal (PENDING...RUNNING).
  int64_t active_jobs() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return active_jobs_; }
  // Slot indices of `worker_id` held by ranks that have not ended.
  std::vector<int> BusySlots(const std::string& worker_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The same for every worker.
  absl::flat_hash_map<std::string, std::vector<int>> BusySlotsByWorker() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Calls `fn` for every rank, of any attempt, that has not ended.
  void ForEachLiveRank(const std::function<void(const v1::RankAssignment&)>& fn) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

 private:
  // A job as it was before the open group first touched it.
  struct Before {
    std::optional<JobEntry> entry;  // nullopt: the group added the job
    bool unsettled = false;
    std::optional<std::string> pending_reason;
  };
  // Inside a group: notes `job_id` as it is now, once per group.
  void Remember(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void TrackIndexes(const JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void CheckOnLoop() const {
    if (loop_ != nullptr) loop_->CheckInLoop("JobBook");
    static_cast<void>(loop_);
  }

  StateStore* store_;
  MetricsHub* hub_;
  const Clock* clock_;
  const EventLoop* loop_ = nullptr;
  absl::btree_map<std::string, JobEntry> jobs_ ABSL_GUARDED_BY(kLoop);
  absl::btree_set<std::string> pending_ ABSL_GUARDED_BY(kLoop);
  absl::btree_set<std::string> holding_slots_ ABSL_GUARDED_BY(kLoop);
  absl::btree_set<std::string> unsettled_ ABSL_GUARDED_BY(kLoop);
  absl::flat_hash_map<std::string, std::string> pending_reasons_ ABSL_GUARDED_BY(kLoop);
  // Newest first for List: (submit_seq, id).
  int64_t next_submit_seq_ ABSL_GUARDED_BY(kLoop) = 1;
  int64_t active_jobs_ ABSL_GUARDED_BY(kLoop) = 0;
  // An open store group (GroupBegun .. GroupEnded). Invariant outside one:
  // before_ and held_effects_ are empty.
  bool in_group_ ABSL_GUARDED_BY(kLoop) = false;
  absl::flat_hash_map<std::string, Before> before_ ABSL_GUARDED_BY(kLoop);
  int64_t next_submit_seq_before_ ABSL_GUARDED_BY(kLoop) = 0;
  std::vector<std::function<void()>> held_effects_ ABSL_GUARDED_BY(kLoop);
};

}  // namespace trainctl::coordinator
