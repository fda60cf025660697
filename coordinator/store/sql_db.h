// The state store's connection seam: one SQL connection (SqlDb) and its
// prepared statements (SqlStatement), implemented by SQLite (sqlite_db.cc)
// and PostgreSQL through libpq (pg_db.cc), so that the table code
// (jobs_table.cc, telemetry_tables.cc, workers_table.cc, auth_tables.cc, ...)
// is shared.
// Statements are written with SQLite's numbered parameters (?1, ?2, ...);
// a backend translates them. Dialect differences live in the backends
// (SchemaSql, ReadIdentity/WriteIdentity, BeginSql) or, for the few
// statements whose text differs, beside each other in PrepareStatements.
// Errors are Status values naming the operation (the codes are listed in
// state_store.h). Also: the parse of a stored proto blob (DataLoss when it
// does not parse).
//
// Threading: none of its own; callers hold the StateStore's mutex, which
// owns the connection.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace trainctl::coordinator::store_internal {

// One prepared statement of a connection. Bind* then Step until it returns
// false; Reset ends the use (and clears the bindings).
class SqlStatement {
 public:
  virtual ~SqlStatement() = default;
  virtual absl::Status BindInt(int index, int64_t value) = 0;
  virtual absl::Status BindText(int index, absl::string_view text) = 0;
  virtual absl::Status BindBlob(int index, absl::string_view bytes) = 0;
  // True when a row is available, false when done. `op` names the caller.
  virtual absl::StatusOr<bool> Step(absl::string_view op) = 0;
  virtual int64_t Int(int col) const = 0;
  virtual std::string Text(int col) const = 0;
  // Valid until the next Step or Reset.
  virtual absl::string_view Blob(int col) const = 0;
  virtual void Reset() = 0;
};

// What a database says about itself: trainctl's marker, the schema version,
// and how many schema objects (tables, indexes) it holds.
struct DbIdentity {
  int64_t app_id = 0;
  int64_t version = 0;
  int64_t objects = 0;
};

enum class SqlBackend { kSqlite, kPostgres };

// One connection.
class SqlDb {
 public:
  virtual ~SqlDb() = default;
  virtual SqlBackend backend() const = 0;
  // `sql` uses ?N parameters. `op` names the caller in the error.
  virtual absl::StatusOr<std::unique_ptr<SqlStatement>> Prepare(const char* sql,
                                                                absl::string_view op) = 0;
  // Runs one or more statements without parameters or results.
  virtual absl::Status Exec(const std::string& sql, absl::string_view op) = 0;
  // Whether a transaction is open. After some errors a backend has rolled
  // it back by itself (SQLite) or lost it (a dropped PostgreSQL connection).
  virtual bool InTransaction() = 0;
  // Rows changed by this connection since it opened (also by statements
  // later rolled back): tells whether a group wrote anything.
  virtual int64_t TotalChanges() = 0;
  // Counts re-established connections (PostgreSQL): what a lost connection
  // held (caches of row counts, a transaction) is gone.
  virtual int64_t ConnectionEpoch() const { return 0; }
  // PostgreSQL: true once a reconnect found the store's advisory lock held
  // by another session -- another coordinator took over while this one's
  // session was gone. Sticky: nothing may be written through it again.
  virtual bool LostLock() const { return false; }
  // The statement that opens a write transaction.
  virtual const char* BeginSql() const = 0;
  // The schema step `sqlite_ddl` (SQLite's dialect) in this backend's.
  virtual std::string SchemaSql(absl::string_view sqlite_ddl) const = 0;
  // Inside a transaction: the database's identity, and its update.
  virtual absl::StatusOr<DbIdentity> ReadIdentity(absl::string_view op) = 0;
  virtual absl::Status WriteIdentity(int64_t app_id, int64_t version, absl::string_view op) = 0;
};

// A prepared statement, owned by the store (finalized with it).
class Statement {
 public:
  absl::Status Prepare(SqlDb* db, const char* sql, absl::string_view op = "prepare") {
    TRAINCTL_ASSIGN_OR_RETURN(stmt_, db->Prepare(sql, op));
    return absl::OkStatus();
  }
  SqlStatement* get() const { return stmt_.get(); }

 private:
  std::unique_ptr<SqlStatement> stmt_;
};

// One use of a prepared statement: bind, step, read columns; resets the
// statement and clears its bindings when it goes out of scope, so that no
// statement keeps a read transaction open between calls.
class Query {
 public:
  Query(SqlDb* /*db*/, const Statement& stmt, absl::string_view op) : stmt_(stmt.get()), op_(op) {}
  ~Query() { stmt_->Reset(); }
  Query(const Query&) = delete;
  Query& operator=(const Query&) = delete;

  Query& Bind(int index, int64_t value) {
    Check(stmt_->BindInt(index, value));
    return *this;
  }
  Query& Bind(int index, absl::string_view text) {
    Check(stmt_->BindText(index, text));
    return *this;
  }
  Query& BindBlob(int index, absl::string_view bytes) {
    Check(stmt_->BindBlob(index, bytes));
    return *this;
  }

  // True when a row is available, false when done.
  absl::StatusOr<bool> Step() {
    TRAINCTL_RETURN_IF_ERROR(bind_status_);
    return stmt_->Step(op_);
  }
  // Runs a statement that returns no rows.
  absl::Status Run() {
    TRAINCTL_ASSIGN_OR_RETURN(bool row, Step());
    if (row) return absl::InternalError(absl::StrCat("state store: ", op_, ": unexpected row"));
    return absl::OkStatus();
  }

  int64_t Int(int col) const { return stmt_->Int(col); }
  std::string Text(int col) const { return stmt_->Text(col); }
  absl::string_view Blob(int col) const { return stmt_->Blob(col); }

 private:
  void Check(absl::Status s) {
    if (!s.ok() && bind_status_.ok()) {
      bind_status_ = absl::Status(s.code(), absl::StrCat("state store: ", op_, ": ", s.message()));
    }
  }

  SqlStatement* stmt_;
  std::string op_;
  absl::Status bind_status_;
};

// Parses a blob column into `msg`; a row that does not parse is reported as
// DataLoss naming the table and key rather than crashing or being skipped.
template <typename Message>
absl::Status ParseBlob(absl::string_view blob, Message* msg, absl::string_view where) {
  if (!msg->ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
    return absl::DataLossError(absl::StrCat("state store: ", where, ": stored blob (", blob.size(),
                                            " bytes) does not parse as ", msg->GetTypeName()));
  }
  return absl::OkStatus();
}

// Reads every remaining row of `q`, parsing column `blob_col` into a new
// element of `out`; `where(q)` names the row in the DataLoss error.
template <typename Message, typename Where>
absl::Status ReadBlobRows(Query& q, int blob_col, std::vector<Message>& out, Where where) {
  while (true) {
    TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) return absl::OkStatus();
    Message& msg = out.emplace_back();
    TRAINCTL_RETURN_IF_ERROR(ParseBlob(q.Blob(blob_col), &msg, where(q)));
  }
}

// Limit for LIMIT clauses: <= 0 means no limit (-1; PostgreSQL's statements
// turn it into NULL).
inline int64_t SqlLimit(int64_t limit) { return limit > 0 ? limit : -1; }

}  // namespace trainctl::coordinator::store_internal
