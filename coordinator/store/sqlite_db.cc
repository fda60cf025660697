#include "coordinator/store/sqlite_db.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace trainctl::coordinator::store_internal {
namespace {

absl::Status SqliteCodeStatus(int rc, const std::string& message) {
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

class SqliteStatement final : public SqlStatement {
 public:
  SqliteStatement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  ~SqliteStatement() override { sqlite3_finalize(stmt_); }

  absl::Status BindInt(int index, int64_t value) override {
    return Check(sqlite3_bind_int64(stmt_, index, value), index);
  }
  absl::Status BindText(int index, absl::string_view text) override {
    return Check(
        sqlite3_bind_text64(stmt_, index, text.data(), text.size(), SQLITE_TRANSIENT, SQLITE_UTF8),
        index);
  }
  absl::Status BindBlob(int index, absl::string_view bytes) override {
    return Check(sqlite3_bind_blob64(stmt_, index, bytes.data(), bytes.size(), SQLITE_TRANSIENT),
                 index);
  }
  absl::StatusOr<bool> Step(absl::string_view op) override {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqliteStatus(db_, rc, op);
  }
  int64_t Int(int col) const override { return sqlite3_column_int64(stmt_, col); }
  std::string Text(int col) const override {
    const unsigned char* text = sqlite3_column_text(stmt_, col);
    return text == nullptr ? std::string()
                           : std::string(reinterpret_cast<const char*>(text),
                                         static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }
  absl::string_view Blob(int col) const override {
    const void* data = sqlite3_column_blob(stmt_, col);
    int size = sqlite3_column_bytes(stmt_, col);
    return data == nullptr
               ? absl::string_view()
               : absl::string_view(static_cast<const char*>(data), static_cast<size_t>(size));
  }
  void Reset() override {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

 private:
  absl::Status Check(int rc, int index) {
    if (rc == SQLITE_OK) return absl::OkStatus();
    return SqliteCodeStatus(rc, absl::StrCat("bind parameter ", index, ": ", sqlite3_errmsg(db_),
                                             " (sqlite code ", rc, ")"));
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_;
};

}  // namespace

absl::Status SqliteStatus(sqlite3* db, int rc, absl::string_view op) {
  std::string detail = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  return SqliteCodeStatus(
      rc, absl::StrCat("state store: ", op, ": ", detail, " (sqlite code ", rc, ")"));
}

absl::StatusOr<std::unique_ptr<SqlStatement>> SqliteDb::Prepare(const char* sql,
                                                                absl::string_view op) {
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(stmt);
    return SqliteStatus(db_, rc, absl::StrCat(op, " \"", sql, "\""));
  }
  return std::unique_ptr<SqlStatement>(new SqliteStatement(db_, stmt));
}

absl::Status SqliteDb::Exec(const std::string& sql, absl::string_view op) {
  char* error = nullptr;
  int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error);
  if (rc == SQLITE_OK) return absl::OkStatus();
  absl::Status status = SqliteStatus(db_, rc, op);
  sqlite3_free(error);
  return status;
}

absl::StatusOr<int64_t> SqliteDb::PragmaInt(const char* sql, absl::string_view op) {
  TRAINCTL_ASSIGN_OR_RETURN(std::unique_ptr<SqlStatement> stmt, Prepare(sql, op));
  const std::string step_op = absl::StrCat(op, ": ", sql);
  TRAINCTL_ASSIGN_OR_RETURN(bool row, stmt->Step(step_op));
  if (!row) return absl::InternalError(absl::StrCat("state store: ", op, ": ", sql, ": no result"));
  return stmt->Int(0);
}

absl::StatusOr<DbIdentity> SqliteDb::ReadIdentity(absl::string_view op) {
  DbIdentity id;
  TRAINCTL_ASSIGN_OR_RETURN(id.app_id, PragmaInt("PRAGMA application_id", op));
  TRAINCTL_ASSIGN_OR_RETURN(id.version, PragmaInt("PRAGMA user_version", op));
  TRAINCTL_ASSIGN_OR_RETURN(id.objects, PragmaInt("SELECT COUNT(*) FROM sqlite_master", op));
  return id;
}

absl::Status SqliteDb::WriteIdentity(int64_t app_id, int64_t version, absl::string_view op) {
  TRAINCTL_RETURN_IF_ERROR(Exec(absl::StrCat("PRAGMA user_version=", version), op));
  return Exec(absl::StrCat("PRAGMA application_id=", app_id), op);
}

}  // namespace trainctl::coordinator::store_internal
