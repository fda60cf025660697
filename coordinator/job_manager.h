// Job lifecycle, rendezvous, restarts, progress and hang detection: the
// coordinator's core.
//
//   PENDING → SCHEDULED → RUNNING → SUCCEEDED | FAILED | CANCELLED
//                 ↑           │
//                 └ RESTARTING ┘   (an attempt failed, restarts remain)
//
// A job has attempts; an attempt has one RankAssignment per rank. Every
// transition goes through Commit(): built in full first (a rank's end
// together with the attempt failure and restart it causes), then written to
// the StateStore (the job with its attempts, plus its events, in one
// transaction), then applied to memory, then published to watchers, then
// acted on (messages to workers). A failed write leaves memory untouched
// and the error is returned (UNAVAILABLE to the caller); nothing is ever
// half-applied, and a failure transition whose write failed is retried:
// a rank's end is replayed at the next Tick, ranks on a LOST worker and
// hangs are found again by Tick.
//
// Blame: a rank that fails in a collective or the rendezvous usually does
// so because a peer died. When another worker of the attempt has lost its
// session (stream broken, LOST or LEFT), the attempt fails as WORKER_LOST
// with a reason naming that worker first. With lost_worker_wait > 0 such a
// failure of a multi-worker attempt whose peers all look healthy is held
// that long (at most) before it is applied, because the peer's broken
// stream can reach the coordinator just after the survivor's report.
//
// Rendezvous: the worker holding rank 0 produces the NCCL unique id or the
// Gloo store address, reports it, and the coordinator hands it to every
// worker of that attempt. Messages about an attempt other than the job's
// current one are refused with ABORTED (a rank's exit of an old attempt is
// still recorded, so its slot frees).
//
// Called by the gRPC services and the worker sessions, through the loop.
// Not thread-safe: runs on the coordinator's EventLoop.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/metrics_hub.h"
#include "coordinator/rank_watch.h"
#include "coordinator/scheduler/scheduler.h"
#include "coordinator/store/state_store.h"
#include "coordinator/worker_registry.h"
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
};

// Whether a job may go from `from` to `to`. Every state change is checked here.
bool JobTransitionAllowed(v1::JobState from, v1::JobState to);
bool IsTerminal(v1::JobState s);
bool IsTerminal(v1::RankState s);

// What the coordinator's /metrics shows of the jobs, taken on the loop.
struct JobGauges {
  std::map<v1::JobState, int64_t> jobs_by_state;
  // PENDING jobs, and how long the oldest of them has waited.
  int64_t queue_length = 0;
  double oldest_pending_seconds = 0;
  // Attempts that failed and were followed by a restart, by failure kind.
  std::map<v1::FailureKind, int64_t> restarts_by_kind;
  // Straggler events and adaptively detected hangs since the coordinator
  // started.
  int64_t straggler_events = 0;
  int64_t hangs_detected = 0;
  // Jobs RUNNING now: throughput summed over ranks; loss and loss scale of
  // rank 0; step time split averaged over ranks (latest window each).
  struct Running {
    std::string id;
    double samples_per_sec = 0;
    double loss = 0;
    double data_ms = 0;
    double compute_ms = 0;
    double comm_ms = 0;
    double loss_scale = 0;
    double world_size = 0;  // ranks of the current attempt (elastic jobs change it)
  };
  std::vector<Running> running;
};

class JobManager {
 public:
  JobManager(StateStore* store, WorkerRegistry* registry, MetricsHub* hub, const Clock* clock,
             JobManagerOptions options);

  // Rebuilds memory from the store (after WorkerRegistry::Recover). Running
  // attempts continue when their workers reconnect (see OnWorkerRegistered).
  absl::Status Recover(const StoreSnapshot& snapshot);

  // --- client API ---------------------------------------------------------
  // `owner`/`owner_token_id`: the submitting token's name and id, kept on
  // the job (Job.owner, Job.owner_token_id).
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec, const std::string& owner = "",
                                 const std::string& owner_token_id = "");
  // Validates and shows where the job would run now; stores nothing.
  absl::StatusOr<v1::SubmitJobResponse> DryRun(const v1::JobSpec& spec);
  absl::StatusOr<v1::Job> Get(const std::string& job_id) const;
  absl::StatusOr<v1::ListJobsResponse> List(const v1::ListJobsRequest& request) const;
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id, const std::string& reason);

  // --- worker sessions ----------------------------------------------------
  // After WorkerRegistry::Register: reconciles what the worker runs with what
  // the coordinator wants, re-sends what it may have missed, schedules.
  void OnWorkerRegistered(const std::string& worker_id, const v1::Register& msg);
  // The worker's lease expired: its ranks failed.
  void OnWorkerLost(const std::string& worker_id);
  absl::Status OnRankStatus(const std::string& worker_id, const v1::RankStatus& status);
  absl::Status OnRendezvous(const std::string& worker_id, const v1::RendezvousReport& report);
  absl::Status OnProgress(const std::string& worker_id, const v1::RankProgress& progress);
  // Stores the batch, updates progress, publishes it.
  absl::Status OnMetrics(const std::string& worker_id, const v1::MetricBatch& batch);
  absl::Status OnLogs(const std::string& worker_id, const v1::LogChunk& chunk);
  // Records a checkpoint a rank of this worker wrote (the coordinator's
  // record is what restarts and `resume_from` resume, nothing else).
  absl::Status OnCheckpoint(const std::string& worker_id, const v1::CheckpointReport& report);
  // A worker's pre-flight result for its ranks of an attempt (see
  // JobManagerOptions::preflight). When every worker of the attempt has
  // answered: StartRanks to all, or the attempt fails as PREFLIGHT.
  absl::Status OnPreflightReport(const std::string& worker_id, const v1::PreflightReport& report);
  // Rank 0 exported the final model: Job.final_model(_worker) are filled
  // from it when the attempt SUCCEEDS (held in memory until then: a
  // coordinator restarted in between leaves them empty).
  absl::Status OnFinalModel(const std::string& worker_id, const v1::FinalModelReport& report);

  // A snapshot for /metrics (on the loop; O(jobs + attempts)).
  JobGauges Gauges() const;

  // --- periodic -----------------------------------------------------------
  // Hang detection and rendezvous timeouts; applies held and retried rank
  // ends, fails ranks still placed on LOST workers, and settles attempts
  // whose ranks all ended without the attempt ending (a store from before
  // transitions were one write).
  void Tick();
  // One scheduling pass: places what can start and sends the assignments.
  void Schedule();
  // With a deferral, the passes that submissions, ends and registrations
  // ask for are coalesced into one posted pass (a flood of submissions costs
  // one pass per loop turn, not one each); without one (tests) they run at once.
  void SetDeferral(std::function<void(std::function<void()>)> post) { post_ = std::move(post); }

  // Slot indices of `worker_id` running a rank that has not ended.
  std::vector<int> BusySlots(const std::string& worker_id) const;

 private:
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
    bool preflight_passed = false;
    // Heartbeats of the current attempt's ranks (memory only).
    RankWatch watch;
    // Workers of this job's stragglers, placed around at the next attempts
    // when stragglers.policy is avoid (memory only).
    std::vector<std::string> avoid_workers;
  };
  struct EventSpec {
    std::string type;
    std::string message;
    int32_t attempt = 0;
    int32_t rank = -1;
  };

  using RanksByWorker = std::vector<std::pair<std::string, std::vector<int32_t>>>;
  // A rank end not applied yet: held for a lost peer to explain it, or
  // whose commit failed (then due at once, retried every Tick until stored).
  struct HeldReport {
    std::string worker_id;
    v1::RankStatus status;
    absl::Time due;
  };

  // Persists `next` (the entry's job after a change) with `events`, then
  // applies and publishes it. The only place a job changes. A failed write
  // is UNAVAILABLE and leaves memory untouched.
  absl::Status Commit(JobEntry& entry, v1::Job next, std::vector<EventSpec> events);
  // Builds the failure of `next`'s current attempt into `next` (the job with
  // the failing rank's end already applied): the attempt FAILED with
  // `reason` and `kind`, the job RESTARTING or FAILED by its restart policy,
  // their events appended to `events`. Returns the ranks to stop once it is
  // committed; nothing when the attempt had already ended. Pure.
  static RanksByWorker BuildAttemptFailure(v1::Job& next, std::vector<EventSpec>& events,
                                           absl::Time now, v1::FailureKind kind,
                                           const std::string& reason, int failed_rank);
  // The step a FAILURE_KIND_NAN attempt failed at (the lowest its ranks
  // reported), or -1.
  static int64_t NanStep(const v1::Attempt& a);
  // Steps the next attempt skips: every earlier attempt's skip list plus
  // the step of each attempt that failed with FAILURE_KIND_NAN (sorted,
  // unique). Restarts of other kinds keep the list, so a later resume from
  // an older checkpoint still passes over the bad steps.
  static std::vector<int64_t> RollbackSkipSteps(const v1::Job& job);
  // Starts a placed attempt on its workers: pre-flight first when enabled,
  // else StartRanks.
  void LaunchAttempt(JobEntry& entry, const v1::Attempt& attempt);
  void SendPreflight(const JobEntry& entry, const v1::Attempt& attempt, const std::string& worker_id);
  // BuildAttemptFailure + one Commit + stops to the surviving ranks.
  absl::Status CommitFailure(JobEntry& entry, v1::Job next, std::vector<EventSpec> events,
                             v1::FailureKind kind, const std::string& reason, int failed_rank);
  // OnRankStatus's body; `may_hold`: a collective failure may be held.
  absl::Status ApplyRankStatus(const std::string& worker_id, const v1::RankStatus& status,
                               bool may_hold);
  // Queues a rank end for Tick (held until `due`, or retried).
  void HoldReport(const std::string& worker_id, const v1::RankStatus& status, absl::Time due);
  // The first worker of `attempt` other than `except` that has lost its
  // session, as "worker W (host H) was lost"; nullopt when all are connected.
  std::optional<std::string> LostPeer(const v1::Attempt& attempt, const std::string& except) const;
  // Ends a current attempt whose ranks all ended (see Tick). False when its
  // commit failed.
  bool SettleEndedAttempt(JobEntry& entry);
  void SendStartRanks(JobEntry& entry, const v1::Attempt& attempt, const std::string& worker_id);
  void SendStop(const std::string& worker_id, const std::string& job_id, int32_t attempt,
                const std::vector<int32_t>& ranks, const std::string& reason);
  void SendRendezvous(const v1::Job& job, const v1::Attempt& attempt, const std::string& worker_id);
  void TrackIndexes(const JobEntry& entry);
  // Alive workers with their free slots, as the scheduler sees them.
  std::vector<scheduler::WorkerSlots> WorkerView() const;
  // Ids of the alive workers started with --allow-commands.
  absl::flat_hash_set<std::string> AllowingCommands() const;
  JobEntry* FindEntry(const std::string& job_id);
  absl::StatusOr<JobEntry*> EntryForWorker(const std::string& worker_id, const std::string& job_id,
                                           int32_t attempt, int32_t rank, bool allow_stale,
                                           v1::Attempt** attempt_out);
  std::string NewJobId(const std::string& name);
  absl::Duration ProgressTimeout(const v1::Job& job) const;
  // For a new attempt of `job` placed as `p`: moves rank 0 onto a holder of
  // the newest checkpoint when one is in the placement, and returns the
  // record to resume (unset for a fresh start) plus the words for the event.
  std::pair<std::optional<v1::CheckpointRecord>, std::string> ChooseResume(const v1::Job& job,
                                                                         scheduler::Placement& p) const;
  // Elastic jobs (docs/elastic.md): the fewest ranks the next attempt of
  // `job` may start with now (scheduler::PendingJob::min_world_size; 0 =
  // exactly world_size), and when that changes by itself (a replace timeout
  // runs out; absl::InfiniteFuture() when it does not).
  int ElasticMinimum(const v1::Job& job, absl::Time now) const;
  absl::Time ElasticDeadline(const v1::Job& job) const;
  // After checkpoint `r` of a running elastic job below world_size: when
  // slots are free (and no pending job of its priority or higher waits),
  // stops the attempt so that the job restarts larger from `r`.
  void MaybeGrow(JobEntry& entry, const v1::CheckpointRecord& r);
  // Copies `spec.resume_from.job`'s newest checkpoint records into `job`.
  absl::Status AttachResumeSource(v1::Job& job) const;

  StateStore* store_;
  WorkerRegistry* registry_;
  MetricsHub* hub_;
  const Clock* clock_;
  JobManagerOptions options_;

  absl::btree_map<std::string, JobEntry> jobs_;
  // Jobs waiting for placement (PENDING, RESTARTING), by id.
  absl::btree_set<std::string> pending_;
  // Jobs with at least one rank not ended, in any attempt (they hold slots).
  absl::btree_set<std::string> holding_slots_;
  // Jobs loaded by Recover whose current attempt has every rank ended but is
  // not ended itself (written by a version that committed a rank's end and
  // the attempt's failure separately); Tick ends them.
  absl::btree_set<std::string> unsettled_;
  // Rank ends waiting for Tick, by "job/attempt/rank" (see HeldReport).
  absl::btree_map<std::string, HeldReport> held_reports_;
  // Newest first for List: (submit_seq, id).
  int64_t next_submit_seq_ = 1;
  int64_t active_jobs_ = 0;
  // Asks for a scheduling pass (see SetDeferral).
  void RequestSchedule();
  std::function<void(std::function<void()>)> post_;
  bool schedule_requested_ = false;
  // A placement's write failed in the last pass; Tick asks for another.
  bool schedule_retry_ = false;
  // For /metrics (JobGauges): since this coordinator started.
  int64_t straggler_events_ = 0;
  int64_t hangs_detected_ = 0;
  // Pending reason per job from the last scheduling pass (not persisted).
  absl::flat_hash_map<std::string, std::string> pending_reasons_;
};

}  // namespace trainctl::coordinator
