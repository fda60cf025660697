// The state store's SQLite backend (sql_db.h): the connection and its
// prepared statements over SQLite's C API, and SQLite result codes as
// Status values naming the operation.
//
// Threading: none of its own (see sql_db.h).
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/store/sql_db.h"

namespace trainctl::coordinator::store_internal {

// Maps an SQLite result code to a Status that names the operation.
absl::Status SqliteStatus(sqlite3* db, int rc, absl::string_view op);

// Owns an open sqlite3 connection (closed on destruction, after every
// statement prepared from it is gone).
class SqliteDb final : public SqlDb {
 public:
  explicit SqliteDb(sqlite3* db) : db_(db) {}
  ~SqliteDb() override { sqlite3_close_v2(db_); }
  SqliteDb(const SqliteDb&) = delete;
  SqliteDb& operator=(const SqliteDb&) = delete;

  // The raw connection, for what only SQLite has (pragmas, quick_check).
  sqlite3* raw() const { return db_; }

  SqlBackend backend() const override { return SqlBackend::kSqlite; }
  absl::StatusOr<std::unique_ptr<SqlStatement>> Prepare(const char* sql,
                                                        absl::string_view op) override;
  absl::Status Exec(const std::string& sql, absl::string_view op) override;
  bool InTransaction() override { return !sqlite3_get_autocommit(db_); }
  int64_t TotalChanges() override { return sqlite3_total_changes64(db_); }
  const char* BeginSql() const override { return "BEGIN IMMEDIATE"; }
  std::string SchemaSql(absl::string_view sqlite_ddl) const override {
    return std::string(sqlite_ddl);
  }
  absl::StatusOr<DbIdentity> ReadIdentity(absl::string_view op) override;
  absl::Status WriteIdentity(int64_t app_id, int64_t version, absl::string_view op) override;

 private:
  absl::StatusOr<int64_t> PragmaInt(const char* sql, absl::string_view op);

  sqlite3* db_;
};

}  // namespace trainctl::coordinator::store_internal
