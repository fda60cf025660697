// JobsTable (jobs_table.h): the jobs table and each job's events (PutJob
// writes both in one transaction; events are kept to max_events_per_job).
// Threading: every method takes the store's mutex (StoreCore::mu).
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/store/jobs_table.h"
#include "coordinator/store/state_store_impl.h"

namespace trainctl::coordinator {

using store_internal::Query;
using store_internal::ReadBlobRows;
using store_internal::SqlLimit;

absl::Status JobsTable::PutJob(const v1::Job& job, int64_t submit_seq,
                               const std::vector<v1::Event>& events) {
  if (job.id().empty()) return absl::InvalidArgumentError("state store: PutJob: job has no id");
  const std::string op = absl::StrCat("PutJob('", job.id(), "')");
  std::vector<std::pair<int64_t, std::string>> event_rows;
  event_rows.reserve(events.size());
  for (const v1::Event& event : events) {
    if (!event.job_id().empty() && event.job_id() != job.id()) {
      return absl::InvalidArgumentError(absl::StrCat("state store: ", op, ": event ", event.seq(),
                                                     " belongs to job '", event.job_id(), "'"));
    }
    v1::Event stored = event;
    stored.set_job_id(job.id());
    event_rows.emplace_back(event.seq(), stored.SerializeAsString());
  }
  const std::string job_blob = job.SerializeAsString();

  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  const StoreCore::Retained<std::string> event_table{&s.event_counts,
                                                     job.id(),
                                                     &s.stmts->count_events,
                                                     &s.stmts->trim_events,
                                                     1,
                                                     [&](Query& q) { q.Bind(1, job.id()); },
                                                     s.options.max_events_per_job};
  return s.AppendRetained(
      op, event_table, static_cast<int64_t>(event_rows.size()),
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) -> absl::Status {
        TRAINCTL_RETURN_IF_ERROR(Query(s.db, s.stmts->upsert_job, op)
                                     .Bind(1, job.id())
                                     .Bind(2, submit_seq)
                                     .Bind(3, static_cast<int64_t>(job.state()))
                                     .BindBlob(4, job_blob)
                                     .Bind(5, s.leader_epoch)
                                     .Bind(6, job.spec().command().code().digest())
                                     .Run());
        for (const auto& [seq, blob] : event_rows) {
          TRAINCTL_RETURN_IF_ERROR(
              Query(s.db, s.stmts->insert_event, absl::StrCat(op, ": insert event ", seq))
                  .Bind(1, job.id())
                  .Bind(2, seq)
                  .BindBlob(3, blob)
                  .Bind(4, s.leader_epoch)
                  .Run());
        }
        return absl::OkStatus();
      });
}

absl::StatusOr<std::vector<v1::Event>> JobsTable::ListEvents(const std::string& job_id,
                                                             int64_t after_seq, int64_t limit) {
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  std::vector<v1::Event> events;
  Query q(s.db, s.stmts->list_events, absl::StrCat("ListEvents('", job_id, "')"));
  q.Bind(1, job_id).Bind(2, after_seq).Bind(3, SqlLimit(limit));
  TRAINCTL_RETURN_IF_ERROR(ReadBlobRows(q, 1, events, [&](const Query& row) {
    return absl::StrCat("events row ('", job_id, "', ", row.Int(0), ")");
  }));
  return events;
}

}  // namespace trainctl::coordinator
