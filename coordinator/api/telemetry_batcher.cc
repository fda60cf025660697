#include "coordinator/api/telemetry_batcher.h"

#include <algorithm>

#include "common/log.h"
#include "coordinator/store/state_store.h"

namespace trainctl::coordinator {

void TelemetryBatcher::Drain() {
  ctx_.loop->CheckInLoop("TelemetryBatcher");
  drain_posted_ = false;
  if (queue_.empty()) return;
  std::vector<Queued> queued = std::move(queue_);
  queue_.clear();
  std::vector<TelemetryLedger::Item> items;
  items.reserve(queued.size());
  for (const Queued& q : queued) {
    items.push_back({q.worker_id, q.msg.seq(),
                     [this, &q]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) -> absl::Status {
                       absl::Status s = q.msg.has_metrics()
                                            ? ctx_.ingest->OnMetrics(q.worker_id, q.msg.metrics())
                                            : ctx_.ingest->OnLogs(q.worker_id, q.msg.logs());
                       if (!s.ok() && s.code() != absl::StatusCode::kAborted &&
                           !StateStore::IsWriteFailure(s)) {
                         LogEvent(
                             LogLevel::kWarn, "coordinator", "report_refused",
                             {{"worker_id", q.worker_id}, {"error", std::string(s.message())}});
                       }
                       return s;
                     }});
  }
  TelemetryLedger::Result r = ctx_.telemetry->ApplyBatch(items);
  // One answer per session, after the commit.
  std::vector<TelemetrySession*> sessions;
  for (const Queued& q : queued) {
    if (std::find(sessions.begin(), sessions.end(), q.session) != sessions.end()) continue;
    sessions.push_back(q.session);
    if (r.outcome == TelemetryLedger::Outcome::kRetry) {
      std::vector<v1::WorkerMessage> mine;
      for (Queued& m : queued) {
        if (m.session == q.session) mine.push_back(std::move(m.msg));
      }
      q.session->TelemetryNotApplied(std::move(mine), r.status);
    } else {
      q.session->TelemetryApplied();
    }
  }
}

}  // namespace trainctl::coordinator
