// CodeArchives (code_archives_table.h): the code archives of jobs
// (CommandSpec.code), one row per digest with the archive's bytes as one
// blob; what keeps a row is a job row naming its digest (jobs.code_digest,
// written by JobsTable::PutJob). Writes are transactions (InTransaction:
// fenced on PostgreSQL, counted in the write health).
// Threading: every method takes the store's mutex (StoreCore::mu).
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "coordinator/store/code_archives_table.h"
#include "coordinator/store/state_store_impl.h"

namespace trainctl::coordinator {

using store_internal::Query;

absl::Status CodeArchives::PutCode(const std::string& digest, absl::string_view bytes,
                                   absl::Time uploaded) {
  if (digest.empty()) return absl::InvalidArgumentError("state store: PutCode: no digest");
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("PutCode('", digest, "')");
  return s.InTransaction(op, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    return Query(s.db, s.stmts->put_code, op)
        .Bind(1, digest)
        .Bind(2, static_cast<int64_t>(bytes.size()))
        .Bind(3, absl::ToUnixMillis(uploaded))
        .BindBlob(4, bytes)
        .Run();
  });
}

absl::StatusOr<std::optional<int64_t>> CodeArchives::CodeSize(const std::string& digest) {
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  Query q(s.db, s.stmts->code_size, absl::StrCat("CodeSize('", digest, "')"));
  q.Bind(1, digest);
  TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::optional<int64_t>();
  return std::optional<int64_t>(q.Int(0));
}

absl::Status CodeArchives::TouchCode(const std::string& digest, absl::Time uploaded) {
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("TouchCode('", digest, "')");
  return s.InTransaction(op, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) -> absl::Status {
    const int64_t before = s.db->TotalChanges();
    TRAINCTL_RETURN_IF_ERROR(Query(s.db, s.stmts->touch_code, op)
                                 .Bind(1, digest)
                                 .Bind(2, absl::ToUnixMillis(uploaded))
                                 .Run());
    if (s.db->TotalChanges() == before) {
      return absl::NotFoundError(absl::StrCat("state store: ", op, ": no such code archive"));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::string> CodeArchives::ReadCode(const std::string& digest, int64_t offset,
                                                   int64_t max_bytes) {
  const std::string op = absl::StrCat("ReadCode('", digest, "', ", offset, ")");
  if (offset < 0 || max_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("state store: ", op, ": offset must be >= 0 and max_bytes >= 1"));
  }
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  Query q(s.db, s.stmts->read_code, op);
  // SQL counts bytes from 1.
  q.Bind(1, digest).Bind(2, offset + 1).Bind(3, max_bytes);
  TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("state store: ", op, ": no such code archive"));
  if (offset >= q.Int(0)) return std::string();
  return std::string(q.Blob(1));
}

absl::StatusOr<int64_t> CodeArchives::DeleteUnreferencedCode(absl::Time cutoff) {
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  const std::string op = "DeleteUnreferencedCode";
  int64_t deleted = 0;
  TRAINCTL_RETURN_IF_ERROR(
      s.InTransaction(op, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) -> absl::Status {
        const int64_t before = s.db->TotalChanges();
        TRAINCTL_RETURN_IF_ERROR(Query(s.db, s.stmts->delete_unreferenced_code, op)
                                     .Bind(1, absl::ToUnixMillis(cutoff))
                                     .Run());
        deleted = s.db->TotalChanges() - before;
        return absl::OkStatus();
      }));
  return deleted;
}

}  // namespace trainctl::coordinator
