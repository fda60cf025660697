// Telemetry from the ranks: metric batches (stored, published, folded into
// the job's progress, ETA and metric summary), log chunks (stored,
// published) and progress heartbeats (the ranks' last step and the
// RankWatch that judges hangs and stragglers).
//
// What it changes of a job is soft state (job_book.h): kept in memory,
// persisted with the next Commit, published now; an epoch's end is an event
// and so a Commit.
//
// Not thread-safe: built by JobOwners (job_owners.h), on the coordinator's EventLoop.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/clock.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/jobs/job_book.h"
#include "coordinator/jobs/rank_watch.h"
#include "coordinator/store/state_store.h"
#include "coordinator/telemetry/metrics_hub.h"
#include "coordinator/telemetry/stack_dumps.h"
#include "trainctl/v1/worker_service.pb.h"

namespace trainctl::coordinator {

// The global step of a metric point: epoch × steps per epoch + step.
int64_t GlobalStep(const v1::MetricPoint& p);

// The job's progress from the latest train point of each rank: the slowest
// rank's position, throughput summed over ranks, rank 0's loss, and the ETA
// at the slowest rank's rate. `prog` is the job's current progress.
v1::Progress ProgressFromPoints(const v1::Job& job,
                                const absl::flat_hash_map<int32_t, v1::MetricPoint>& last_points,
                                v1::Progress prog);

class TelemetryIngest {
 public:
  TelemetryIngest(JobBook* book, StateStore* store, MetricsHub* hub, const Clock* clock,
                  RankWatchOptions rank_watch)
      : book_(book), store_(store), hub_(hub), clock_(clock), rank_watch_(rank_watch) {}

  absl::Status OnProgress(const std::string& worker_id, const v1::RankProgress& progress)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Stores the batch, updates progress, publishes it.
  absl::Status OnMetrics(const std::string& worker_id, const v1::MetricBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::Status OnLogs(const std::string& worker_id, const v1::LogChunk& chunk)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // OnMetrics and OnLogs in two halves, around a store write made
  // elsewhere (the telemetry batcher's writer thread, off the loop): Check
  // says whether the message is accepted (a refusal is the same as
  // OnMetrics' and changes nothing); Stored, once its rows are committed,
  // does what OnMetrics/OnLogs do after theirs are appended -- memory,
  // watchers -- and says the same refusal when the job moved on meanwhile
  // (then only memory is spared: the rows stay). A batch that MakesEvents
  // (rank 0's epoch end: an event, so a job commit that must be in the
  // same transaction as its points) goes through OnMetrics instead.
  static bool MakesEvents(const v1::MetricBatch& batch);
  absl::Status CheckMetrics(const std::string& worker_id, const v1::MetricBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::Status MetricsStored(const std::string& worker_id, const v1::MetricBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::Status CheckLogs(const std::string& worker_id, const v1::LogChunk& chunk)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::Status LogsStored(const std::string& worker_id, const v1::LogChunk& chunk)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The Python stacks a rank of a hung command job dumped (stack_dumps.h), forgotten.
  std::vector<std::string> TakeStackDump(const std::string& job_id, int32_t attempt, int32_t rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    return stack_dumps_.Take(job_id, attempt, rank);
  }

 private:
  // Folds each point into the ranks' last step, the job's metric summary and
  // last eval; returns the events they make (epoch ends).
  std::vector<JobEvent> ApplyPoints(JobEntry& e, v1::Attempt& a, const v1::MetricBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The job and attempt a batch (chunk) reports on, or why it is refused.
  absl::StatusOr<JobEntry*> MetricsTarget(const std::string& worker_id,
                                          const v1::MetricBatch& batch, v1::Attempt** a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::StatusOr<JobEntry*> LogsTarget(const std::string& worker_id, const v1::LogChunk& chunk,
                                       v1::Attempt** a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // A stored batch (chunk) into memory and out to watchers.
  absl::Status FoldMetrics(JobEntry& e, v1::Attempt& a, const v1::MetricBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void FoldLogs(JobEntry& e, const v1::Attempt& a, const v1::LogChunk& chunk)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  JobBook* book_;
  StateStore* store_;
  MetricsHub* hub_;
  const Clock* clock_;
  RankWatchOptions rank_watch_;
  StackDumps stack_dumps_ ABSL_GUARDED_BY(kLoop);
};

}  // namespace trainctl::coordinator
