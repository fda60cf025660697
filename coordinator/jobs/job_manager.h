// The coordinator's core: the job lifecycle. The owners around it
// (docs/architecture.md) are built and wired in one place, JobOwners
// (job_owners.h), which hands the JobManager those it uses:
//
//   JobBook         jobs in memory; Commit, the one place a job changes
//                   (job_transitions.h: one table for job, attempt, rank)
//   JobPlacer       scheduling passes, new attempts, elastic sizes
//   AttemptStarter  pre-flight, StartRanks, rendezvous, StopRanks, re-sends
//   TelemetryIngest metrics, logs, progress heartbeats
//   JobHealth       rendezvous timeouts, hangs, stragglers, lost workers
//   JobQueries      Get, List, DryRun, usage, gauges, events and logs
//
// Callers (the services, the dashboard, the server's ticks) call each owner
// directly; the JobManager itself owns the lifecycle: submit, cancel, rank
// ends (an attempt's success or failure and the restart it causes,
// attempt_failure.h),
// checkpoint records, held rank reports, request-id deduplication, and
// reconciling a reconnecting worker.
//
//   PENDING → SCHEDULED → RUNNING → SUCCEEDED | FAILED | CANCELLED | TIMEOUT
//                 ↑           │
//                 └ RESTARTING ┘   (an attempt failed, restarts remain)
//
// TIMEOUT: the job's running time (RunningTime: its attempts' time holding
// slots, summed over attempts) reached scheduling.max_runtime_s; Tick ends
// it and stops its ranks as a preemption does (checkpoint first, then the
// preemption grace).
//
// A failed write leaves memory untouched and the error is returned
// (UNAVAILABLE to the caller); nothing is ever half-applied, and a failure
// transition whose write failed is retried: a rank's end is replayed at the
// next Tick, ranks on a LOST worker and hangs are found again by Tick.
//
// Blame: a rank that fails in a collective or the rendezvous usually does
// so because a peer died. When another worker of the attempt has lost its
// session (stream broken, LOST or LEFT), the attempt fails as WORKER_LOST
// with a reason naming that worker first. With lost_worker_wait > 0 such a
// failure of a multi-worker attempt whose peers all look healthy is held
// that long (at most) before it is applied, because the peer's broken
// stream can reach the coordinator just after the survivor's report.
//
// Messages about an attempt other than the job's current one are refused
// with ABORTED (a rank's exit of an old attempt is still recorded, so its
// slot frees).
//
// Called by the gRPC services and the worker sessions, through the loop.
// Not thread-safe: runs on the coordinator's EventLoop.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/jobs/attempt_starter.h"
#include "coordinator/jobs/job_actions.h"
#include "coordinator/jobs/job_book.h"
#include "coordinator/jobs/job_health.h"
#include "coordinator/jobs/job_placer.h"
#include "coordinator/jobs/job_transitions.h"
#include "coordinator/jobs/owner_numbers.h"
#include "coordinator/jobs/rank_watch.h"
#include "coordinator/jobs/telemetry_ingest.h"
#include "coordinator/store/state_store.h"
#include "coordinator/telemetry/metrics_hub.h"
#include "coordinator/workers/worker_registry.h"
#include "trainctl/v1/job_service.pb.h"
#include "trainctl/v1/worker_service.pb.h"

namespace trainctl::coordinator {

struct JobManagerOptions {
  // Hang detection for jobs whose spec leaves restart.progress_timeout_s at 0.
  absl::Duration progress_timeout = absl::Minutes(5);
  // Adaptive hang and straggler detection of engine jobs (rank_watch.h); a
  // job's restart.progress_timeout_s replaces the adaptive bound.
  RankWatchOptions rank_watch;
  // An attempt whose ranks are not all ready this long after it was placed fails.
  absl::Duration rendezvous_timeout = absl::Minutes(2);
  // SIGTERM → SIGKILL grace the workers get when told to stop ranks.
  absl::Duration stop_grace = absl::Seconds(10);
  // Most jobs kept that are not terminal (PENDING...RUNNING); more → RESOURCE_EXHAUSTED.
  int64_t max_active_jobs = 100000;
  // How long a collective/rendezvous failure may wait for a peer worker's
  // lost session to explain it (see Blame above); 0: decide at once. The
  // coordinator sets it to the registry's disconnect_grace.
  absl::Duration lost_worker_wait = absl::ZeroDuration();
  // Pre-flight (docs/failures.md): every worker of a placed attempt checks
  // what its ranks need (a Preflight message) before any StartRanks; one
  // worker's problem fails the attempt as FAILURE_KIND_PREFLIGHT, naming
  // every failing worker, with no rank started. The coordinator binary turns
  // it on (--preflight); off here so that a test's stand-in worker need not
  // answer. State of an unanswered pre-flight is memory only: after a
  // coordinator restart the attempt's StartRanks go out without one.
  bool preflight = false;
  // The first restart's backoff (attempt_failure.h RestartBackoff: doubling
  // per restart, at most 30 s); 0 = restart at once. The coordinator binary
  // sets --restart-backoff-s (1 s); 0 here so that tests place at once.
  absl::Duration restart_backoff = absl::ZeroDuration();
  // Refuse at submit a job the cluster as it is can never run (more slots of
  // its kind than all live workers have, or no worker that can run it),
  // unless its scheduling.wait_for_capacity is set; a cluster with no live
  // worker takes every job (its workers have not joined yet). The
  // coordinator binary turns it on; off here so that tests may submit
  // before their workers register.
  bool refuse_unschedulable = false;
  // Queues (docs/queues.md): the grace a preempted job's ranks get and the
  // half-life of fair share's usage (--preemption-grace-s,
  // --fair-share-half-life-s).
  PlacerOptions placer;
};

// The owners a JobManager uses, each owned by JobOwners (job_owners.h). Its
// constructor only stores them: JobOwners builds the starter, placer,
// ingest and health after it (they take it as their JobActions), and nothing
// calls the JobManager before all of them are built.
struct JobManagerParts {
  JobBook* book;
  OwnerNumbers* owners;
  AttemptStarter* starter;
  JobPlacer* placer;
  TelemetryIngest* ingest;
  JobHealth* health;
};

class JobManager : private JobActions {
 public:
  JobManager(StateStore* store, WorkerRegistry* registry, const Clock* clock,
             JobManagerOptions options, JobManagerParts parts);

  // What AttemptStarter and JobHealth ask of the lifecycle (job_actions.h).
  JobActions* actions() { return this; }

  // Rebuilds memory from the store (after WorkerRegistry::Recover). Running
  // attempts continue when their workers reconnect (see OnWorkerRegistered).
  absl::Status Recover(const StoreSnapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // --- client API ---------------------------------------------------------
  // `owner`/`owner_token_id`: the submitting token's name and id, kept on
  // the job (Job.owner, Job.owner_token_id).
  // `request_id` (SubmitJobRequest.request_id): a second Submit of the same
  // owner with the same non-empty id within kRequestIdLifetime returns the
  // job the first one created, as it is now, and creates nothing.
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec, const std::string& owner = "",
                                 const std::string& owner_token_id = "",
                                 const std::string& request_id = "")
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  static constexpr absl::Duration kRequestIdLifetime = absl::Hours(24);
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Which jobs CancelMatching takes: those not ended that match every
  // non-empty field (the caller checks that one is given and who may ask).
  struct CancelFilter {
    std::string queue;                 // "default" also matches an empty spec.queue
    std::string owner;                 // Job.owner
    std::vector<v1::JobState> states;  // not terminal; empty = any not ended
    std::string owner_token_id;        // Job.owner_token_id (a submitter's own jobs)
  };
  // Cancels every job `filter` matches, each as Cancel does (one
  // `cancelled` event with `reason` per job), then asks for one scheduling
  // pass; with `dry_run` only lists them. Returns their ids in id order.
  // INVALID_ARGUMENT for a terminal or unspecified state or a reason over
  // 1024 bytes; a failed write stops there with UNAVAILABLE naming how many
  // were cancelled before it.
  absl::StatusOr<std::vector<std::string>> CancelMatching(const CancelFilter& filter,
                                                          const std::string& reason, bool dry_run)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // --- worker sessions ----------------------------------------------------
  // After WorkerRegistry::Register: reconciles what the worker runs with what
  // the coordinator wants, re-sends what it may have missed, schedules.
  void OnWorkerRegistered(const std::string& worker_id, const v1::Register& msg)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::Status OnRankStatus(const std::string& worker_id, const v1::RankStatus& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Records a checkpoint a rank of this worker wrote (the coordinator's
  // record is what restarts and `resume_from` resume, nothing else).
  absl::Status OnCheckpoint(const std::string& worker_id, const v1::CheckpointReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Rank 0 exported the final model: Job.final_model(_worker) are filled
  // from it when the attempt SUCCEEDS (held in memory until then: a
  // coordinator restarted in between leaves them empty).
  absl::Status OnFinalModel(const std::string& worker_id, const v1::FinalModelReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // Checkpoint and final-model reports of stale attempts refused
  // (JobGauges::stale_reports_refused; JobOwners::Gauges).
  int64_t stale_reports_refused() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    return stale_reports_refused_;
  }

  // A worker session (`session`, any unique address) holds sequenced
  // reports the store could not take (`held`), or no longer does (applied,
  // or the session ended: the worker resends them). Hang, rendezvous and
  // straggler verdicts wait while any session holds reports.
  void SetReportsHeld(const void* session, const std::string& worker_id, bool held)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    if (held) {
      reports_held_[session] = worker_id;
    } else {
      reports_held_.erase(session);
    }
  }

  // --- periodic -----------------------------------------------------------
  // Hang detection and rendezvous timeouts; applies held and retried rank
  // ends, fails ranks still placed on LOST workers, and settles attempts
  // whose ranks all ended without the attempt ending (a store from before
  // transitions were one write).
  void Tick() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

 private:
  // The key of a held rank report: "job/attempt/rank".
  static std::string ReportKey(const std::string& job_id, int32_t attempt, int32_t rank);
  // A rank end not applied yet: held for a lost peer to explain it, or
  // whose commit failed (then due at once, retried every Tick until stored).
  struct HeldReport {
    std::string worker_id;
    v1::RankStatus status;
    absl::Time due;
  };

  // JobActions.
  absl::Status FailAttempt(JobEntry& entry, v1::Job next, std::vector<JobEvent> events,
                           v1::FailureKind kind, const std::string& reason, int failed_rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) override;
  void RequestSchedule() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) override {
    placer_->RequestSchedule();
  }

  // Cancel's body for a job not ended, without the scheduling pass.
  absl::Status CancelEntry(JobEntry& entry, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Ends a job not ended in `end` (CANCELLED, TIMEOUT) with one `event`:
  // its current attempt, when not ended, ends CANCELLED with `why`, and its
  // live ranks are stopped `how`.
  absl::Status EndEntry(JobEntry& entry, v1::JobState end, const std::string& event,
                        const std::string& why, StopHow how) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Ends TIMEOUT every job whose RunningTime reached its
  // scheduling.max_runtime_s, stopping its ranks as a preemption does
  // (checkpoint_first, PlacerOptions::preemption_grace).
  void StopOverrunJobs(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // OnRankStatus's body; `may_hold`: a collective failure may be held.
  absl::Status ApplyRankStatus(const std::string& worker_id, const v1::RankStatus& status,
                               bool may_hold) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // A rank of an attempt that already ended: only its end matters (frees the slot).
  absl::Status ApplyEndOfEndedAttempt(const std::string& worker_id, const v1::RankStatus& st,
                                      JobEntry& e, v1::Job next)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::Status ApplyRankRunning(JobEntry& e, v1::Job next, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::Status ApplyRankSucceeded(JobEntry& e, v1::Job next, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::Status ApplyRankFailed(const std::string& worker_id, const v1::RankStatus& st, JobEntry& e,
                               v1::Job next, bool may_hold, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Queues a rank end for Tick (held until `due`, or retried).
  void HoldReport(const std::string& worker_id, const v1::RankStatus& status, absl::Time due)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Tick: the held ends that are due, or explained by a lost peer now.
  void ApplyDueReports(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The first worker of `attempt` other than `except` that has lost its
  // session, as "worker W (host H) was lost"; nullopt when all are connected.
  std::optional<std::string> LostPeer(const v1::Attempt& attempt, const std::string& except) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Ends a current attempt whose ranks all ended (see Tick). False when its
  // commit failed.
  bool SettleEndedAttempt(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // OnWorkerRegistered for one job holding slots: ranks placed on the
  // worker that it no longer runs fail as vanished; what it missed is re-sent.
  void ReconcileWorkerJob(const std::string& worker_id, JobEntry& e,
                          const absl::flat_hash_set<std::string>& reported)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Copies `spec.resume_from.job`'s newest checkpoint records into `job`.
  absl::Status AttachResumeSource(v1::Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // PERMISSION_DENIED naming the owner when an absolute checkpoint.dir is
  // another owner's by the records (DirOwnerFromRecords), unless the job
  // resumes a job of that owner. Relative and default directories are
  // checked by each worker's pre-flight (worker/daemon/job_dir.h).
  absl::Status CheckDirOwner(const v1::JobSpec& spec, const std::string& owner) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // FailedPrecondition when `job` can never run on the cluster as it is
  // (see JobManagerOptions::refuse_unschedulable).
  absl::Status RefuseIfUnschedulable(const v1::Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Fails the PENDING jobs past their scheduling.pending_timeout_s.
  void FailOverduePending(absl::Time mono) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // Whether health verdicts (hangs, rendezvous timeouts, stragglers) may be
  // judged now: not while a worker session holds reports the store could
  // not take, nor while this coordinator's hold on a PostgreSQL store is
  // unconfirmed: the ranks' silence is then the store's, not theirs (a
  // verdict is judged on what the workers said, not on what could be
  // written). Logs the pause and the resume.
  bool HealthJudgeable() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  const Clock* clock_;
  StateStore* store_;
  // Sessions (by address) holding reports the store did not take, with
  // their worker ids (SetReportsHeld); HealthJudgeable's last answer.
  absl::flat_hash_map<const void*, std::string> reports_held_ ABSL_GUARDED_BY(kLoop);
  bool health_paused_ ABSL_GUARDED_BY(kLoop) = false;
  // ABORTED `s` (a stale attempt's report): counted and logged. Returns `s`.
  absl::Status RefuseIfStale(const absl::Status& s, const std::string& worker_id, const char* what,
                             const std::string& job_id, int32_t attempt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Asks the workers that reported `dropped` to delete those files.
  void DropCheckpointFiles(const std::string& job_id,
                           const std::vector<v1::CheckpointRecord>& dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // Checkpoint and final-model reports of stale attempts refused (/metrics).
  int64_t stale_reports_refused_ ABSL_GUARDED_BY(kLoop) = 0;
  // DropCheckpoints a worker was not connected to receive (a shared
  // directory's record it reported), sent when it registers again. Memory
  // only: after a coordinator restart those files stay. At most
  // kMaxPendingDrops per worker, the oldest forgotten first.
  static constexpr size_t kMaxPendingDrops = 1000;
  absl::flat_hash_map<std::string, std::deque<v1::CoordinatorMessage>> pending_drops_
      ABSL_GUARDED_BY(kLoop);
  JobManagerOptions options_;
  WorkerRegistry* registry_;
  JobBook* const book_;
  OwnerNumbers* const owners_;
  AttemptStarter* const starter_;
  JobPlacer* const placer_;
  TelemetryIngest* const ingest_;
  JobHealth* const health_;
  // Rank ends waiting for Tick, by "job/attempt/rank" (see HeldReport).
  absl::btree_map<std::string, HeldReport> held_reports_ ABSL_GUARDED_BY(kLoop);
  // Submissions by (owner, request_id) → job id; entries older than
  // kRequestIdLifetime are ignored and dropped now and then.
  absl::flat_hash_map<std::string, std::string> requests_ ABSL_GUARDED_BY(kLoop);
  size_t requests_pruned_at_ ABSL_GUARDED_BY(kLoop) = 0;  // requests_.size() after the last prune
  // Notes the submission of `job` (its owner and request_id, when set).
  void RememberRequest(const v1::Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
};

}  // namespace trainctl::coordinator
