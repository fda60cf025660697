// Read-only views of the jobs: one job, pages of jobs (newest first, bounded
// in count and bytes), a dry run (validation and where the job would run
// now; nothing stored), the gauges /metrics shows, usage, busy slots, and a
// job's stored events and log lines: the services and the dashboard read
// jobs through here, never the store's job tables.
// Not thread-safe: built by JobOwners (job_owners.h), on the coordinator's
// EventLoop.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/jobs/job_book.h"
#include "coordinator/jobs/job_health.h"
#include "coordinator/jobs/job_placer.h"
#include "coordinator/jobs/usage_report.h"
#include "coordinator/store/state_store.h"
#include "coordinator/workers/worker_registry.h"
#include "trainctl/v1/job_service.pb.h"

namespace trainctl::coordinator {

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
  // Checkpoint and final-model reports of attempts that were no longer
  // current (fencing), refused since the coordinator started.
  int64_t stale_reports_refused = 0;
  // Running jobs stopped as preemption victims since the coordinator started.
  int64_t preemptions = 0;
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

// What the live jobs of one queue hold now (QueueService's QueueStatus).
struct QueueUsage {
  // Slots of the current attempts' ranks that have not ended, by kind.
  int32_t used_gpu = 0;
  int32_t used_cpu = 0;
  // PENDING or RESTARTING jobs; SCHEDULED or RUNNING jobs.
  int32_t pending_jobs = 0;
  int32_t running_jobs = 0;
  // What those ranks hold against the CPU and memory quotas, counted as the
  // scheduler counts them (scheduler/quota.h RankMilliCpus): thousandths of
  // a CPU and bytes, each rank its job's resources (0 when none).
  int64_t used_milli_cpus = 0;
  int64_t used_memory_bytes = 0;
  // Those ranks' GPU slots by flavor (Slot.flavor); none without one.
  std::map<std::string, int32_t> used_gpu_flavors;
};

class JobQueries {
 public:
  JobQueries(const JobBook* book, const WorkerRegistry* registry, const JobPlacer* placer,
             const JobHealth* health, StateStore* store, const Clock* clock)
      : book_(book),
        registry_(registry),
        placer_(placer),
        health_(health),
        store_(store),
        clock_(clock) {}

  // The job with its pending reason as state_reason while it waits.
  absl::StatusOr<v1::Job> Get(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::StatusOr<v1::ListJobsResponse> List(const v1::ListJobsRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Validates `spec` and shows where the job would run now; stores nothing.
  absl::StatusOr<v1::SubmitJobResponse> DryRun(const v1::JobSpec& spec) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // A snapshot for /metrics (O(jobs + attempts)); stale_reports_refused is
  // the JobManager's (JobOwners::Gauges fills it).
  JobGauges Gauges() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Per queue (a job naming none counts as "default"), the live jobs' use:
  // O(jobs + ranks of current attempts). Queues without a live job are
  // absent.
  std::map<std::string, QueueUsage> QueueUsages() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Accounting: the `stored` attempt records (StateStore attempt_usage) and
  // every job the coordinator knows (CollectAttempts), summed per filter.by
  // (or listed, by attempt), within [since, until]; an infinite-future
  // `until` (none asked for) is now. InvalidArgument naming `since` or
  // `until` when one is after now or since is not before until.
  // O(jobs + attempts).
  absl::StatusOr<UsageReport> Usage(const UsageFilter& filter,
                                    const std::vector<v1::AttemptUsage>& stored) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The same over the store's attempt records of the window (read here, on
  // the loop: a rare query).
  absl::StatusOr<UsageReport> Usage(const UsageFilter& filter) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Slot indices of `worker_id` running a rank that has not ended.
  std::vector<int> BusySlots(const std::string& worker_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    return book_->BusySlots(worker_id);
  }
  // A job's stored events with seq > `after_seq`, ascending, at most `limit`
  // (<= 0: no limit). Unknown jobs have none.
  absl::StatusOr<std::vector<v1::Event>> Events(const std::string& job_id, int64_t after_seq,
                                                int64_t limit) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // A job's stored log lines of attempt `attempt` (taken literally: 0 is no
  // attempt), per rank in order, ranks ascending; `rank` empty = every rank;
  // `tail_lines` > 0 keeps only the last that many per rank.
  absl::StatusOr<std::vector<v1::LogLine>> Logs(const std::string& job_id, int32_t attempt,
                                                std::optional<int32_t> rank,
                                                int64_t tail_lines) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // A job's stored metric points, oldest first, at most `limit` (a watch's
  // history).
  absl::StatusOr<std::vector<v1::MetricPoint>> Metrics(const std::string& job_id,
                                                       int64_t limit) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // One page of a job's stored metric points (GetMetrics, the dashboard).
  absl::StatusOr<MetricPage> MetricsPage(const MetricPageQuery& query) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

 private:
  const JobBook* book_;
  const WorkerRegistry* registry_;
  const JobPlacer* placer_;
  const JobHealth* health_;
  StateStore* store_;
  const Clock* clock_;
};

}  // namespace trainctl::coordinator
