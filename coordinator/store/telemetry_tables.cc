// TelemetryTables (telemetry_tables.h): what running jobs report -- metric
// points (kept to max_metric_points_per_job, downsampled before the oldest
// are deleted) and log lines (kept to max_log_lines_per_rank per attempt
// and rank). Inside a group (the telemetry batcher's group commit) appends
// are queued and written together, in order, by multi-row INSERTs
// (StoreCore::FlushPending, also here): one statement per row was one
// network round trip per row on PostgreSQL.
// Threading: every method takes the store's mutex (StoreCore::mu).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/store/state_store_impl.h"
#include "coordinator/store/telemetry_tables.h"

namespace trainctl::coordinator {

using store_internal::ParseBlob;
using store_internal::Query;
using store_internal::ReadBlobRows;
using store_internal::SqlLimit;

namespace {

// One row per point.
std::vector<StoreCore::PendingRow> MetricRows(const v1::MetricBatch& batch) {
  std::vector<StoreCore::PendingRow> rows;
  rows.reserve(batch.points_size());
  for (const v1::MetricPoint& point : batch.points()) {
    rows.push_back({batch.job_id(), batch.attempt(), point.rank(), point.SerializeAsString()});
  }
  return rows;
}

// One row per line. The chunk's rank is authoritative: every stored line
// carries it, so ListLogs over several ranks tells the lines apart.
std::vector<StoreCore::PendingRow> LogRows(const v1::LogChunk& chunk) {
  std::vector<StoreCore::PendingRow> rows;
  rows.reserve(chunk.lines_size());
  for (const v1::LogLine& line : chunk.lines()) {
    StoreCore::PendingRow& row = rows.emplace_back();
    row.job_id = chunk.job_id();
    row.attempt = chunk.attempt();
    row.rank = chunk.rank();
    if (line.rank() == chunk.rank()) {
      row.blob = line.SerializeAsString();
    } else {
      v1::LogLine stored = line;
      stored.set_rank(chunk.rank());
      row.blob = stored.SerializeAsString();
    }
  }
  return rows;
}

}  // namespace

absl::Status TelemetryTables::AppendMetrics(const v1::MetricBatch& batch) {
  if (batch.job_id().empty()) {
    return absl::InvalidArgumentError("state store: AppendMetrics: batch has no job_id");
  }
  if (batch.points().empty()) return absl::OkStatus();
  std::vector<StoreCore::PendingRow> rows = MetricRows(batch);
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  return s.AppendMetricsLocked(batch, std::move(rows));
}

absl::Status StoreCore::AppendMetricsLocked(const v1::MetricBatch& batch,
                                            std::vector<PendingRow> rows) {
  const std::string op = absl::StrCat("AppendMetrics('", batch.job_id(), "')");
  const Retained<std::string> metrics{&metric_counts,
                                      batch.job_id(),
                                      &stmts->count_metrics,
                                      &stmts->trim_metrics,
                                      1,
                                      [&](Query& q) { q.Bind(1, batch.job_id()); },
                                      options.max_metric_points_per_job};
  return AppendTelemetry(op, metrics, pending_metrics, std::move(rows), /*reduces=*/true,
                         // Over the bound: first downsample the oldest half (StoreOptions).
                         [&](int64_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
                           return DownsampleMetrics(batch.job_id(), count / 2, op);
                         });
}

absl::Status TelemetryTables::AppendLogs(const v1::LogChunk& chunk) {
  if (chunk.job_id().empty()) {
    return absl::InvalidArgumentError("state store: AppendLogs: chunk has no job_id");
  }
  if (chunk.lines().empty()) return absl::OkStatus();
  std::vector<StoreCore::PendingRow> rows = LogRows(chunk);
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  return s.AppendLogsLocked(chunk, std::move(rows));
}

absl::Status StoreCore::AppendLogsLocked(const v1::LogChunk& chunk, std::vector<PendingRow> rows) {
  const std::string op = absl::StrCat("AppendLogs('", chunk.job_id(), "', attempt ",
                                      chunk.attempt(), ", rank ", chunk.rank(), ")");
  const Retained<LogKey> logs{
      &log_counts,
      LogKey{chunk.job_id(), chunk.attempt(), chunk.rank()},
      &stmts->count_logs,
      &stmts->trim_logs,
      3,
      [&](Query& q) {
        q.Bind(1, chunk.job_id()).Bind(2, int64_t{chunk.attempt()}).Bind(3, int64_t{chunk.rank()});
      },
      options.max_log_lines_per_rank};
  return AppendTelemetry(op, logs, pending_logs, std::move(rows), /*reduces=*/false,
                         [](int64_t) -> absl::StatusOr<int64_t> { return 0; });
}

absl::Status TelemetryTables::AppendGroup(
    const std::vector<const v1::WorkerMessage*>& msgs,
    const std::vector<std::pair<std::string, int64_t>>& telemetry_seqs) {
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  // A group opened by BeginGroup spans calls (the loop's): this one waits
  // for its end rather than write inside it.
  s.mu.Await(absl::Condition(
      +[](StoreCore* core) ABSL_NO_THREAD_SAFETY_ANALYSIS { return !core->in_group; }, &s));
  TRAINCTL_RETURN_IF_ERROR(s.BeginGroupLocked());
  for (const v1::WorkerMessage* msg : msgs) {
    absl::Status appended;
    if (msg->has_metrics() && !msg->metrics().job_id().empty() &&
        !msg->metrics().points().empty()) {
      appended = s.AppendMetricsLocked(msg->metrics(), MetricRows(msg->metrics()));
    } else if (msg->has_logs() && !msg->logs().job_id().empty() && !msg->logs().lines().empty()) {
      appended = s.AppendLogsLocked(msg->logs(), LogRows(msg->logs()));
    }
    // As in a group of TelemetryLedger::ApplyBatch: an append that failed
    // for another reason than the store left nothing of itself behind
    // and the group goes on; a store failure ends it.
    if (StateStore::IsWriteFailure(appended)) {
      s.RollbackGroupLocked();
      return appended;
    }
  }
  return s.CommitGroupLocked(telemetry_seqs);
}

absl::Status StoreCore::FlushPending(absl::string_view op) {
  if (pending_metrics.empty() && pending_logs.empty()) return absl::OkStatus();
  const auto bind_row = [](const std::vector<PendingRow>& rows) {
    return [&rows](Query& q, int first, size_t i) {
      const PendingRow& row = rows[i];
      q.Bind(first, row.job_id)
          .Bind(first + 1, int64_t{row.attempt})
          .Bind(first + 2, int64_t{row.rank})
          .BindBlob(first + 3, row.blob);
    };
  };
  absl::Status status = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) -> absl::Status {
    TRAINCTL_RETURN_IF_ERROR(WriteChunked(stmts->insert_metrics, pending_metrics.rows.size(), 4,
                                          absl::StrCat(op, ": insert metrics"),
                                          bind_row(pending_metrics.rows)));
    TRAINCTL_RETURN_IF_ERROR(WriteChunked(stmts->insert_logs, pending_logs.rows.size(), 4,
                                          absl::StrCat(op, ": insert logs"),
                                          bind_row(pending_logs.rows)));
    const std::string retention = absl::StrCat(op, ": retention");
    for (const auto& [job_id, n] : pending_metrics.trims) {
      TRAINCTL_RETURN_IF_ERROR(
          Query(db, stmts->trim_metrics, retention).Bind(1, job_id).Bind(2, n).Run());
    }
    for (const auto& [key, n] : pending_logs.trims) {
      TRAINCTL_RETURN_IF_ERROR(Query(db, stmts->trim_logs, retention)
                                   .Bind(1, std::get<0>(key))
                                   .Bind(2, int64_t{std::get<1>(key)})
                                   .Bind(3, int64_t{std::get<2>(key)})
                                   .Bind(4, n)
                                   .Run());
    }
    return absl::OkStatus();
  }();
  ClearPending();
  if (!status.ok() && in_group) {
    // Rows of messages already applied are lost: the group must not commit.
    if (db->InTransaction())
      Query(db, stmts->rollback, absl::StrCat(op, ": rollback")).Run().IgnoreError();
    ClearCachedCounts();
  }
  return status;
}

absl::StatusOr<int64_t> StoreCore::DownsampleMetrics(const std::string& job_id, int64_t oldest,
                                                     absl::string_view op) {
  struct Row {
    int64_t id;
    double loss;
  };
  // Consecutive train points per (attempt, rank) among the oldest rows.
  std::map<std::pair<int64_t, int64_t>, std::vector<Row>> series;
  {
    Query q(db, stmts->oldest_metrics, absl::StrCat(op, ": downsample"));
    q.Bind(1, job_id).Bind(2, oldest);
    while (true) {
      TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) break;
      v1::MetricPoint point;
      TRAINCTL_RETURN_IF_ERROR(
          ParseBlob(q.Blob(3), &point, absl::StrCat("metrics row ", q.Int(0))));
      if (point.kind() != v1::MetricPoint::KIND_TRAIN) continue;
      series[{q.Int(1), q.Int(2)}].push_back(Row{q.Int(0), point.loss()});
    }
  }
  int64_t removed = 0;
  for (const auto& [key, rows] : series) {
    for (size_t start = 0; start + kMetricBucketPoints <= rows.size();
         start += kMetricBucketPoints) {
      const size_t end = start + kMetricBucketPoints;
      size_t lo = start, hi = start;
      for (size_t i = start; i < end; ++i) {
        if (rows[i].loss < rows[lo].loss) lo = i;
        if (rows[i].loss > rows[hi].loss) hi = i;
      }
      for (size_t i = start; i < end; ++i) {
        if (i == lo || i == hi || i == end - 1) continue;
        TRAINCTL_RETURN_IF_ERROR(Query(db, stmts->delete_metric, absl::StrCat(op, ": downsample"))
                                     .Bind(1, rows[i].id)
                                     .Run());
        ++removed;
      }
    }
  }
  return removed;
}

absl::StatusOr<MetricPage> TelemetryTables::ListMetricPage(const MetricPageQuery& query) {
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  // (Inside a group its queued rows are part of what this connection sees.)
  TRAINCTL_RETURN_IF_ERROR(s.FlushPending(absl::StrCat("ListMetricPage('", query.job_id, "')")));
  MetricPage page;
  int64_t bytes = 0;
  Query q(s.db, s.stmts->page_metrics, absl::StrCat("ListMetricPage('", query.job_id, "')"));
  q.Bind(1, query.job_id).Bind(2, query.after_id).Bind(3, int64_t{query.rank.value_or(-1)});
  while (true) {
    TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    StoredMetricPoint stored{q.Int(0), static_cast<int32_t>(q.Int(1)), {}};
    absl::string_view blob = q.Blob(2);
    TRAINCTL_RETURN_IF_ERROR(
        ParseBlob(blob, &stored.point, absl::StrCat("metrics row ", stored.id)));
    if (query.kind != v1::MetricPoint::KIND_UNSPECIFIED && stored.point.kind() != query.kind)
      continue;
    // Room for the point and its framing in the response.
    const int64_t size = static_cast<int64_t>(blob.size()) + 16;
    if (!page.points.empty() && bytes + size > query.max_bytes) {
      page.more = true;
      break;
    }
    bytes += size;
    page.points.push_back(std::move(stored));
  }
  return page;
}

absl::StatusOr<std::vector<v1::MetricPoint>> TelemetryTables::ListMetrics(const std::string& job_id,
                                                                          int64_t limit) {
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  TRAINCTL_RETURN_IF_ERROR(s.FlushPending(absl::StrCat("ListMetrics('", job_id, "')")));
  std::vector<v1::MetricPoint> points;
  Query q(s.db, s.stmts->list_metrics, absl::StrCat("ListMetrics('", job_id, "')"));
  q.Bind(1, job_id).Bind(2, SqlLimit(limit));
  TRAINCTL_RETURN_IF_ERROR(ReadBlobRows(
      q, 1, points, [](const Query& row) { return absl::StrCat("metrics row ", row.Int(0)); }));
  return points;
}

absl::StatusOr<std::vector<v1::LogLine>> TelemetryTables::ListLogs(const std::string& job_id,
                                                                   int32_t attempt,
                                                                   std::optional<int32_t> rank,
                                                                   int64_t tail_lines) {
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("ListLogs('", job_id, "', attempt ", attempt, ")");
  TRAINCTL_RETURN_IF_ERROR(s.FlushPending(op));
  std::vector<int32_t> ranks;
  if (rank.has_value()) {
    ranks.push_back(*rank);
  } else {
    Query q(s.db, s.stmts->log_ranks, op);
    q.Bind(1, job_id).Bind(2, int64_t{attempt});
    while (true) {
      TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) break;
      ranks.push_back(static_cast<int32_t>(q.Int(0)));
    }
  }
  std::vector<v1::LogLine> lines;
  for (int32_t r : ranks) {
    // Each rank is its own index range, so the tail is a bounded backward scan.
    Query q(s.db, s.stmts->list_logs_rank, op);
    q.Bind(1, job_id).Bind(2, int64_t{attempt}).Bind(3, int64_t{r}).Bind(4, SqlLimit(tail_lines));
    TRAINCTL_RETURN_IF_ERROR(ReadBlobRows(
        q, 1, lines, [](const Query& row) { return absl::StrCat("logs row ", row.Int(0)); }));
  }
  return lines;
}

}  // namespace trainctl::coordinator
