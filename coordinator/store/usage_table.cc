// UsageTable (usage_table.h): the accounting table (attempt_usage, schema
// version 10), one row per ended attempt with its whole billing record as a
// blob (v1.AttemptUsage) and the columns a window query needs (start and
// end in Unix ms). Written by the JobBook when an ended attempt's last rank
// exited (coordinator/jobs/attempt_usage.h); read by `trainctl usage`.
// Threading: every method takes the store's mutex (StoreCore::mu).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "coordinator/store/state_store_impl.h"
#include "coordinator/store/usage_table.h"

namespace trainctl::coordinator {

using store_internal::ParseBlob;
using store_internal::Query;

namespace {

int64_t MillisOf(const google::protobuf::Timestamp& t) {
  return t.seconds() * 1000 + t.nanos() / 1000000;
}

}  // namespace

absl::Status UsageTable::PutAttemptUsage(const v1::AttemptUsage& usage) {
  const std::string op =
      absl::StrCat("PutAttemptUsage('", usage.job_id(), "', ", usage.attempt(), ")");
  if (usage.job_id().empty())
    return absl::InvalidArgumentError(absl::StrCat("state store: ", op, ": no job_id"));
  if (usage.attempt() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("state store: ", op, ": attempt must be >= 1"));
  }
  if (!usage.has_start_time() || !usage.has_end_time()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state store: ", op, ": needs start_time and end_time"));
  }
  const std::string blob = usage.SerializeAsString();
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  return s.InTransaction(op, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    return Query(s.db, s.stmts->put_attempt_usage, op)
        .Bind(1, usage.job_id())
        .Bind(2, static_cast<int64_t>(usage.attempt()))
        .Bind(3, usage.owner())
        .Bind(4, usage.queue())
        .Bind(5, MillisOf(usage.start_time()))
        .Bind(6, MillisOf(usage.end_time()))
        .BindBlob(7, blob)
        .Run();
  });
}

absl::StatusOr<std::vector<v1::AttemptUsage>> UsageTable::LoadAttemptUsage(absl::Time since,
                                                                           absl::Time until) {
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  std::vector<v1::AttemptUsage> out;
  Query q(s.db, s.stmts->load_attempt_usage, "LoadAttemptUsage");
  q.Bind(1, absl::ToUnixMillis(since)).Bind(2, absl::ToUnixMillis(until));
  while (true) {
    TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    const std::string job_id = q.Text(0);
    const int64_t attempt = q.Int(1);
    const std::string what = absl::StrCat("attempt_usage row ('", job_id, "', ", attempt, ")");
    v1::AttemptUsage usage;
    TRAINCTL_RETURN_IF_ERROR(ParseBlob(q.Blob(2), &usage, what));
    if (usage.job_id() != job_id || usage.attempt() != attempt) {
      return absl::DataLossError(absl::StrCat("state store: ", what, " holds attempt ",
                                              usage.attempt(), " of job '", usage.job_id(), "'"));
    }
    out.push_back(std::move(usage));
  }
  return out;
}

}  // namespace trainctl::coordinator
