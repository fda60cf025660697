#include "coordinator/store/sqlite_query.h"

namespace trainctl::coordinator::store_internal {

absl::Status SqliteStatus(sqlite3* db, int rc, absl::string_view op) {
  std::string detail = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  std::string message = absl::StrCat("state store: ", op, ": ", detail, " (sqlite code ", rc, ")");
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(
          absl::StrCat(message, "; is another coordinator using this database?"));
    case SQLITE_NOTADB:
      return absl::FailedPreconditionError(
          absl::StrCat(message, "; the file is not an SQLite (trainctl) database"));
    case SQLITE_CORRUPT:
      return absl::DataLossError(message);
    case SQLITE_FULL:
      return absl::ResourceExhaustedError(message);
    case SQLITE_IOERR:
      // A failed read or write of the file (ENOSPC in some paths, EIO, a
      // network file system): a retry may cure it, so telemetry waits.
      return absl::UnavailableError(message);
    case SQLITE_CONSTRAINT:
      if (rc == SQLITE_CONSTRAINT_PRIMARYKEY || rc == SQLITE_CONSTRAINT_UNIQUE) {
        return absl::AlreadyExistsError(message);
      }
      return absl::InvalidArgumentError(message);
    case SQLITE_CANTOPEN:
      return absl::FailedPreconditionError(message);
    case SQLITE_PERM:
    case SQLITE_READONLY:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace trainctl::coordinator::store_internal
