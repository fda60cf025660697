// The state store's thin layer over SQLite's C API: SQLite result codes as
// Status values naming the operation, a prepared statement that finalizes
// itself, one use of it (bind, step, read columns; reset on scope exit),
// and the parse of a stored proto blob (DataLoss when it does not parse).
//
// Threading: none of its own; callers hold the StateStore's mutex, which
// owns the connection.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace trainctl::coordinator::store_internal {

// Maps an SQLite result code to a Status that names the operation.
absl::Status SqliteStatus(sqlite3* db, int rc, absl::string_view op);

// A prepared statement, finalized on destruction.
class Statement {
 public:
  Statement() = default;
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  // `op` names the caller in the error; the SQL text is added to it.
  absl::Status Prepare(sqlite3* db, const char* sql, absl::string_view op = "prepare") {
    int rc = sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt_, nullptr);
    if (rc != SQLITE_OK) return SqliteStatus(db, rc, absl::StrCat(op, " \"", sql, "\""));
    return absl::OkStatus();
  }
  sqlite3_stmt* get() const { return stmt_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

// One use of a prepared statement: bind, step, read columns; resets the
// statement and clears its bindings when it goes out of scope, so that no
// statement keeps a read transaction open between calls.
class Query {
 public:
  Query(sqlite3* db, const Statement& stmt, absl::string_view op)
      : db_(db), stmt_(stmt.get()), op_(op) {}
  ~Query() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  Query(const Query&) = delete;
  Query& operator=(const Query&) = delete;

  Query& Bind(int index, int64_t value) {
    Check(sqlite3_bind_int64(stmt_, index, value));
    return *this;
  }
  Query& Bind(int index, absl::string_view text) {
    Check(sqlite3_bind_text64(stmt_, index, text.data(), text.size(), SQLITE_TRANSIENT,
                              SQLITE_UTF8));
    return *this;
  }
  Query& BindBlob(int index, absl::string_view bytes) {
    Check(sqlite3_bind_blob64(stmt_, index, bytes.data(), bytes.size(), SQLITE_TRANSIENT));
    return *this;
  }

  // True when a row is available, false when done.
  absl::StatusOr<bool> Step() {
    TRAINCTL_RETURN_IF_ERROR(bind_status_);
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqliteStatus(db_, rc, op_);
  }
  // Runs a statement that returns no rows.
  absl::Status Run() {
    TRAINCTL_ASSIGN_OR_RETURN(bool row, Step());
    if (row) return absl::InternalError(absl::StrCat("state store: ", op_, ": unexpected row"));
    return absl::OkStatus();
  }

  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  std::string Text(int col) const {
    const unsigned char* text = sqlite3_column_text(stmt_, col);
    return text == nullptr ? std::string()
                           : std::string(reinterpret_cast<const char*>(text),
                                         static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }
  absl::string_view Blob(int col) const {
    const void* data = sqlite3_column_blob(stmt_, col);
    int size = sqlite3_column_bytes(stmt_, col);
    return data == nullptr ? absl::string_view()
                           : absl::string_view(static_cast<const char*>(data),
                                               static_cast<size_t>(size));
  }

 private:
  void Check(int rc) {
    if (rc != SQLITE_OK && bind_status_.ok()) bind_status_ = SqliteStatus(db_, rc, op_);
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  std::string op_;
  absl::Status bind_status_;
};

// Parses a blob column into `msg`; a row that does not parse is reported as
// DataLoss naming the table and key rather than crashing or being skipped.
template <typename Message>
absl::Status ParseBlob(absl::string_view blob, Message* msg, absl::string_view where) {
  if (!msg->ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
    return absl::DataLossError(absl::StrCat("state store: ", where, ": stored blob (",
                                            blob.size(), " bytes) does not parse as ",
                                            msg->GetTypeName()));
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

// Limit for LIMIT clauses: <= 0 means no limit (SQLite's -1).
inline int64_t SqlLimit(int64_t limit) { return limit > 0 ? limit : -1; }

}  // namespace trainctl::coordinator::store_internal
