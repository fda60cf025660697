// The store's telemetry tables (StateStore::telemetry()): what running jobs
// report -- metric points (kept to StoreOptions::max_metric_points_per_job,
// downsampled before the oldest are deleted) and log lines (kept to
// max_log_lines_per_rank per attempt and rank). Written by TelemetryIngest;
// read by JobService and the dashboard.
//
// Inside a group (StateStore::BeginGroup, or AppendGroup: the telemetry
// batcher's group commit) appends are queued and written together at the
// group's commit or the next read, so a read on the store's connection sees
// them.
//
// Threading: every method takes the store's one lock (state_store.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainctl/v1/metrics.pb.h"
#include "trainctl/v1/worker_service.pb.h"

namespace trainctl::coordinator {

class StateStore;
namespace store_internal {
struct StoreCore;
}  // namespace store_internal

// Points per downsampling bucket (see StoreOptions); each keeps at most 3.
inline constexpr int kMetricBucketPoints = 8;

// One page of a job's stored metric points (TelemetryTables::ListMetricPage).
struct MetricPageQuery {
  std::string job_id;
  // Only rows stored after this one (a previous page's last_id); 0 = from
  // the start.
  int64_t after_id = 0;
  // Only this rank; unset = every rank.
  std::optional<int32_t> rank;
  // Only this kind; KIND_UNSPECIFIED = every kind.
  v1::MetricPoint::Kind kind = v1::MetricPoint::KIND_UNSPECIFIED;
  // Stop before the serialized points would exceed this many bytes (at
  // least one point is returned when one matches).
  int64_t max_bytes = 1 << 20;
};
struct StoredMetricPoint {
  int64_t id;
  int32_t attempt;
  v1::MetricPoint point;
};
struct MetricPage {
  // Arrival order.
  std::vector<StoredMetricPoint> points;
  // True when more matching points follow the last one returned.
  bool more = false;
};

class TelemetryTables {
 public:
  TelemetryTables(const TelemetryTables&) = delete;
  TelemetryTables& operator=(const TelemetryTables&) = delete;

  // Appends the batch's points (one row per point). Applies retention.
  absl::Status AppendMetrics(const v1::MetricBatch& batch);
  // The newest `limit` points of a job (all attempts), oldest first
  // (<= 0: every kept point).
  absl::StatusOr<std::vector<v1::MetricPoint>> ListMetrics(const std::string& job_id,
                                                           int64_t limit);
  // A page of a job's points matching `query`, oldest first, with the
  // attempt and row id of each (the id pages the next call).
  absl::StatusOr<MetricPage> ListMetricPage(const MetricPageQuery& query);

  // Appends the chunk's lines. Applies retention per (job, attempt, rank).
  // The chunk's rank is authoritative: each line is stored with it.
  // dropped_lines is not stored.
  absl::Status AppendLogs(const v1::LogChunk& chunk);
  // Log lines of one attempt, per rank in order, ranks ascending; `rank`
  // empty = every rank; tail_lines > 0 keeps only the last N per rank.
  // `attempt` is taken literally (resolving "0 = latest" is the caller's).
  absl::StatusOr<std::vector<v1::LogLine>> ListLogs(const std::string& job_id, int32_t attempt,
                                                    std::optional<int32_t> rank,
                                                    int64_t tail_lines);

  // A whole telemetry group in one call, for a thread other than the
  // loop's (the telemetry batcher's writer, telemetry_batcher.h): appends
  // each message's metric points or log lines, in order (other kinds are
  // skipped), records each worker's highest seq, and commits -- what
  // BeginGroup, AppendMetrics/AppendLogs... and CommitGroup(telemetry_seqs)
  // do, with the store's lock held throughout, so that no other caller's
  // write lands inside the transaction. A group opened by BeginGroup on
  // another thread is waited for. An append refused for a reason other
  // than the store (StateStore::IsWriteFailure) keeps nothing of itself and
  // the group goes on; a store failure rolls everything back and is
  // returned, as a failed commit is.
  absl::Status AppendGroup(const std::vector<const v1::WorkerMessage*>& msgs,
                           const std::vector<std::pair<std::string, int64_t>>& telemetry_seqs);

 private:
  friend class StateStore;
  explicit TelemetryTables(store_internal::StoreCore& core) : core_(core) {}
  store_internal::StoreCore& core_;
};

}  // namespace trainctl::coordinator
