#include "coordinator/store/state_store.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "absl/time/clock.h"

namespace trainctl::coordinator {
namespace {

// Marks a database as trainctl's (PRAGMA application_id, "TRCT"), so that
// another program's SQLite file is refused instead of being written into.
constexpr int32_t kApplicationId = 0x54524354;

// Schema migrations: kMigrations[i] takes the schema from version i to i + 1,
// in the same transaction that bumps user_version. Append a step to add a
// version; never edit a released one.
constexpr const char* kMigrations[] = {
    // 0 -> 1: the initial schema.
    R"sql(
      CREATE TABLE jobs (
        id         TEXT PRIMARY KEY NOT NULL,
        submit_seq INTEGER NOT NULL,   -- FIFO order; kept from the first write
        state      INTEGER NOT NULL,   -- v1.JobState, for queries without parsing
        blob       BLOB NOT NULL       -- v1.Job
      );
      CREATE INDEX jobs_by_submit_seq ON jobs (submit_seq);

      CREATE TABLE events (
        job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
        seq    INTEGER NOT NULL,
        blob   BLOB NOT NULL,          -- v1.Event
        PRIMARY KEY (job_id, seq)
      ) WITHOUT ROWID;

      CREATE TABLE metrics (
        id      INTEGER PRIMARY KEY AUTOINCREMENT,  -- arrival order
        job_id  TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        rank    INTEGER NOT NULL,
        blob    BLOB NOT NULL          -- v1.MetricPoint
      );
      CREATE INDEX metrics_by_job ON metrics (job_id, id);

      CREATE TABLE logs (
        id      INTEGER PRIMARY KEY AUTOINCREMENT,  -- arrival order
        job_id  TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        rank    INTEGER NOT NULL,
        blob    BLOB NOT NULL          -- v1.LogLine
      );
      CREATE INDEX logs_by_rank ON logs (job_id, attempt, rank, id);

      CREATE TABLE workers (
        id   TEXT PRIMARY KEY NOT NULL,
        blob BLOB NOT NULL             -- v1.Worker
      );
    )sql",
    // 1 -> 2: the highest telemetry seq applied per worker (at-least-once
    // telemetry: a resend after a coordinator restart is deduplicated).
    R"sql(
      CREATE TABLE telemetry_seqs (
        worker_id TEXT PRIMARY KEY NOT NULL,
        seq       INTEGER NOT NULL     -- highest WorkerMessage.seq applied
      ) WITHOUT ROWID;
    )sql",
    // 2 -> 3: bearer tokens (only a SHA-256 of each secret) and which token
    // first registered each worker id (a worker id belongs to one token).
    R"sql(
      CREATE TABLE tokens (
        id          TEXT PRIMARY KEY NOT NULL,
        secret_hash TEXT NOT NULL,     -- lowercase hex SHA-256 of the secret
        blob        BLOB NOT NULL      -- v1.Token
      ) WITHOUT ROWID;
      CREATE TABLE worker_bindings (
        worker_id TEXT PRIMARY KEY NOT NULL,
        token_id  TEXT NOT NULL
      ) WITHOUT ROWID;
    )sql",
};
constexpr int kSchemaVersion = static_cast<int>(sizeof(kMigrations) / sizeof(kMigrations[0]));

// Busy timeouts. Open waits briefly: in exclusive locking mode a database
// that stays locked belongs to another live coordinator, and waiting longer
// cannot help. Afterwards the lock is ours and the timeout is a safety net.
constexpr int kOpenBusyTimeoutMs = 500;
constexpr int kBusyTimeoutMs = 5000;

// Maps an SQLite result code to a Status that names the operation.
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

// An existing file at `path` with nothing in it (0 bytes, or SQLite without
// tables): a wrong --db, not a new cluster -- starting empty there would
// silently forget the real database's jobs.
absl::Status EmptyFileError(absl::string_view path) {
  return absl::FailedPreconditionError(absl::StrCat(
      "state store: open ", path, ": the file exists but is not a trainctl database (it is ",
      "empty); a new database needs a path that does not exist yet: point --db at the "
      "existing trainctl database, or remove this file to start a new one"));
}

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

// Limit for LIMIT clauses: <= 0 means no limit (SQLite's -1).
int64_t SqlLimit(int64_t limit) { return limit > 0 ? limit : -1; }

}  // namespace

struct StateStore::Impl {
  using LogKey = std::tuple<std::string, int32_t, int32_t>;  // (job, attempt, rank)

  Impl(std::string path, StoreOptions options) : path(std::move(path)), options(options) {}
  ~Impl() {
    absl::MutexLock lock(&mu);
    stmts.reset();
    // Checkpoints the WAL into the database and removes it.
    sqlite3_close_v2(db);
  }

  absl::Status OpenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status Exec(const char* sql, absl::string_view op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status Migrate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::StatusOr<int64_t> PragmaInt(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Downsamples the job's oldest `oldest` metric rows in place (see
  // StoreOptions); returns how many rows it deleted.
  absl::StatusOr<int64_t> DownsampleMetrics(const std::string& job_id, int64_t oldest,
                                            absl::string_view op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status PrepareStatements() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void RollbackGroupLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Runs `body` inside BEGIN IMMEDIATE ... COMMIT; rolls back when it or the
  // commit fails. Inside a group (BeginGroup) it is a savepoint instead: the
  // body is still all or nothing, and the group's COMMIT makes it durable. A
  // write asks the injected fault (if any) before its commit or release.
  template <typename Body>
  absl::Status InTransaction(absl::string_view op, Body body, bool write = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Unavailable when the test's write fault fails this write (see
  // StateStore::SetWriteFaultForTest); counts the write.
  absl::Status InjectedFault(absl::string_view op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!write_fault) return absl::OkStatus();
    if (!write_fault(++writes_since_fault, op)) return absl::OkStatus();
    return absl::UnavailableError(
        absl::StrCat("state store: ", op, ": injected write fault (test), rolled back"));
  }

  // Rows under `key` before this transaction's inserts, for retention.
  // Counts are cached so that an append costs one indexed delete of the
  // overflow instead of a count. Loaded lazily from the database (`bind`
  // binds the key to `count`); exact because this connection holds the
  // database's only lock (locking_mode=EXCLUSIVE), so nothing else changes
  // the tables. Call before inserting.
  template <typename Key, typename BindKey>
  absl::StatusOr<int64_t> RowsBefore(const absl::flat_hash_map<Key, int64_t>& cache,
                                     const Key& key, const Statement& count,
                                     absl::string_view op, BindKey bind)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    Query q(db, count, absl::StrCat(op, ": count rows"));
    bind(q);
    TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
    return row ? q.Int(0) : 0;
  }

  const std::string path;
  const StoreOptions options;

  absl::Mutex mu;
  sqlite3* db ABSL_GUARDED_BY(mu) = nullptr;
  // True when Open found no file at `path` (or it is ":memory:"): only then
  // may Migrate turn an empty database into a new trainctl one.
  bool created ABSL_GUARDED_BY(mu) = false;
  StateStore::WriteFault write_fault ABSL_GUARDED_BY(mu);
  int64_t writes_since_fault ABSL_GUARDED_BY(mu) = 0;

  struct Statements {
    Statement begin, commit, rollback;
    Statement savepoint, release, rollback_to;
    Statement put_telemetry_seq, load_telemetry_seqs;
    Statement upsert_job, insert_event, put_worker, delete_worker;
    Statement put_token, load_tokens, put_binding, load_bindings;
    Statement insert_metric, insert_log;
    Statement count_events, count_metrics, count_logs;
    Statement trim_events, trim_metrics, trim_logs;
    Statement load_jobs, max_event_seq, load_workers;
    Statement list_events, list_metrics, log_ranks, list_logs_rank;
    Statement oldest_metrics, delete_metric, page_metrics;
  };
  std::unique_ptr<Statements> stmts ABSL_GUARDED_BY(mu);

  // Cached row counts (see RowsBefore); an entry is dropped when a
  // transaction that touched it fails, and reloaded on next use.
  absl::flat_hash_map<std::string, int64_t> event_counts ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, int64_t> metric_counts ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<LogKey, int64_t> log_counts ABSL_GUARDED_BY(mu);

  // An open group transaction (BeginGroup .. CommitGroup/RollbackGroup), and
  // sqlite3_total_changes when it began (to tell whether it wrote anything).
  bool in_group ABSL_GUARDED_BY(mu) = false;
  // Every COMMIT's duration (atomics: read without the lock).
  LatencyHistogram commit_latency;
  void ObserveCommit(absl::string_view op, absl::Duration took) {
    commit_latency.Observe(took);
    if (options.slow_commit_ms > 0 && took > absl::Milliseconds(options.slow_commit_ms)) {
      LogEvent(LogLevel::kWarn, "coordinator", "slow_commit",
               {{"op", std::string(op)}, {"took", absl::FormatDuration(took)},
                {"threshold", absl::StrCat(options.slow_commit_ms, "ms")}});
    }
  }
  int64_t group_changes ABSL_GUARDED_BY(mu) = 0;
};

absl::Status StateStore::Impl::Exec(const char* sql, absl::string_view op) {
  char* error = nullptr;
  int rc = sqlite3_exec(db, sql, nullptr, nullptr, &error);
  if (rc == SQLITE_OK) return absl::OkStatus();
  absl::Status status = SqliteStatus(db, rc, op);
  sqlite3_free(error);
  return status;
}

absl::StatusOr<int64_t> StateStore::Impl::PragmaInt(const char* sql) {
  const std::string op = absl::StrCat("open ", path);
  Statement stmt;
  TRAINCTL_RETURN_IF_ERROR(stmt.Prepare(db, sql, op));
  Query q(db, stmt, absl::StrCat(op, ": ", sql));
  TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return absl::InternalError(absl::StrCat("state store: ", op, ": ", sql, ": no result"));
  return q.Int(0);
}

absl::Status StateStore::Impl::OpenLocked() {
  if (path == ":memory:") {
    created = true;
  } else {
    struct stat st;
    if (stat(path.c_str(), &st) == 0) {
      created = false;
      // Refused before SQLite touches it: enabling WAL would write a header
      // into the empty file. (A trainctl database never has 0 bytes: its
      // first Open writes the header with the WAL switch.)
      if (S_ISREG(st.st_mode) && st.st_size == 0) return EmptyFileError(path);
    } else if (errno == ENOENT) {
      created = true;
    } else {
      return absl::FailedPreconditionError(
          absl::StrCat("state store: open ", path, ": ", std::strerror(errno)));
    }
  }
  int rc = sqlite3_open_v2(path.c_str(), &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) return SqliteStatus(db, rc, absl::StrCat("open ", path));
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, kOpenBusyTimeoutMs);

  // Exclusive locking before WAL: the connection keeps the database locked
  // for its lifetime, so a second coordinator on the same file fails at Open
  // instead of interleaving writes; the WAL index then lives in heap memory
  // (no -shm file). journal_mode is the first statement that reads the file,
  // so a file that is not SQLite fails here with SQLITE_NOTADB.
  TRAINCTL_RETURN_IF_ERROR(Exec("PRAGMA locking_mode=EXCLUSIVE", absl::StrCat("open ", path)));
  {
    Statement stmt;
    const std::string op = absl::StrCat("open ", path, ": set WAL mode");
    TRAINCTL_RETURN_IF_ERROR(stmt.Prepare(db, "PRAGMA journal_mode=WAL", op));
    Query q(db, stmt, op);
    TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
    std::string mode = row ? q.Text(0) : "";
    // An in-memory database reports "memory": it has nothing to make durable.
    if (mode != "wal" && mode != "memory") {
      return absl::FailedPreconditionError(absl::StrCat(
          "state store: open ", path, ": cannot enable WAL mode (journal_mode is '", mode, "')"));
    }
  }
  // FULL: the WAL is synced at every commit, so an OK return is durable.
  TRAINCTL_RETURN_IF_ERROR(Exec("PRAGMA synchronous=FULL", absl::StrCat("open ", path)));
  TRAINCTL_RETURN_IF_ERROR(Exec("PRAGMA foreign_keys=ON", absl::StrCat("open ", path)));
  TRAINCTL_RETURN_IF_ERROR(Migrate());
  sqlite3_busy_timeout(db, kBusyTimeoutMs);
  return PrepareStatements();
}

absl::Status StateStore::Impl::Migrate() {
  const std::string op = absl::StrCat("open ", path, ": migrate schema");
  TRAINCTL_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE", op));
  absl::Status status = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) -> absl::Status {
    TRAINCTL_ASSIGN_OR_RETURN(int64_t app_id, PragmaInt("PRAGMA application_id"));
    TRAINCTL_ASSIGN_OR_RETURN(int64_t version, PragmaInt("PRAGMA user_version"));
    TRAINCTL_ASSIGN_OR_RETURN(int64_t objects, PragmaInt("SELECT COUNT(*) FROM sqlite_master"));
    const bool blank = app_id == 0 && version == 0 && objects == 0;
    if (blank && !created) {
      return EmptyFileError(path);
    }
    if (app_id != kApplicationId && !blank) {
      // Another program's database (or an older file without the marker).
      return absl::FailedPreconditionError(absl::StrCat(
          "state store: open ", path, ": not a trainctl database (application_id ", app_id,
          ", user_version ", version, ", ", objects, " schema objects); refusing to modify it"));
    }
    if (version > kSchemaVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat("state store: open ", path, ": schema version ", version,
                       " is newer than this binary knows (", kSchemaVersion,
                       "); run a newer trainctl-coordinator"));
    }
    if (version < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "state store: open ", path, ": invalid schema version ", version));
    }
    for (int64_t v = version; v < kSchemaVersion; ++v) {
      TRAINCTL_RETURN_IF_ERROR(
          Exec(kMigrations[v], absl::StrCat(op, " from version ", v, " to ", v + 1)));
    }
    if (version != kSchemaVersion) {
      TRAINCTL_RETURN_IF_ERROR(
          Exec(absl::StrCat("PRAGMA user_version=", kSchemaVersion).c_str(), op));
      TRAINCTL_RETURN_IF_ERROR(
          Exec(absl::StrCat("PRAGMA application_id=", kApplicationId).c_str(), op));
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    Exec("ROLLBACK", op).IgnoreError();
    return status;
  }
  status = Exec("COMMIT", op);
  if (!status.ok()) Exec("ROLLBACK", op).IgnoreError();
  return status;
}

absl::Status StateStore::Impl::PrepareStatements() {
  stmts = std::make_unique<Statements>();
  Statements& s = *stmts;
  const std::pair<Statement*, const char*> all[] = {
      {&s.begin, "BEGIN IMMEDIATE"},
      {&s.commit, "COMMIT"},
      {&s.rollback, "ROLLBACK"},
      {&s.savepoint, "SAVEPOINT nested"},
      {&s.release, "RELEASE nested"},
      {&s.rollback_to, "ROLLBACK TO nested"},
      {&s.put_telemetry_seq,
       "INSERT INTO telemetry_seqs (worker_id, seq) VALUES (?1, ?2) "
       "ON CONFLICT (worker_id) DO UPDATE SET seq = MAX(seq, excluded.seq)"},
      {&s.load_telemetry_seqs, "SELECT worker_id, seq FROM telemetry_seqs ORDER BY worker_id"},
      {&s.upsert_job,
       "INSERT INTO jobs (id, submit_seq, state, blob) VALUES (?1, ?2, ?3, ?4) "
       "ON CONFLICT (id) DO UPDATE SET state = excluded.state, blob = excluded.blob"},
      {&s.insert_event, "INSERT INTO events (job_id, seq, blob) VALUES (?1, ?2, ?3)"},
      {&s.put_worker, "INSERT OR REPLACE INTO workers (id, blob) VALUES (?1, ?2)"},
      {&s.delete_worker, "DELETE FROM workers WHERE id = ?1"},
      {&s.put_token, "INSERT OR REPLACE INTO tokens (id, secret_hash, blob) VALUES (?1, ?2, ?3)"},
      {&s.load_tokens, "SELECT id, secret_hash, blob FROM tokens ORDER BY id"},
      {&s.put_binding, "INSERT OR IGNORE INTO worker_bindings (worker_id, token_id) VALUES (?1, ?2)"},
      {&s.load_bindings, "SELECT worker_id, token_id FROM worker_bindings ORDER BY worker_id"},
      {&s.insert_metric,
       "INSERT INTO metrics (job_id, attempt, rank, blob) VALUES (?1, ?2, ?3, ?4)"},
      {&s.insert_log, "INSERT INTO logs (job_id, attempt, rank, blob) VALUES (?1, ?2, ?3, ?4)"},
      {&s.count_events, "SELECT COUNT(*) FROM events WHERE job_id = ?1"},
      {&s.count_metrics, "SELECT COUNT(*) FROM metrics WHERE job_id = ?1"},
      {&s.count_logs, "SELECT COUNT(*) FROM logs WHERE job_id = ?1 AND attempt = ?2 AND rank = ?3"},
      {&s.trim_events,
       "DELETE FROM events WHERE job_id = ?1 AND seq IN "
       "(SELECT seq FROM events WHERE job_id = ?1 ORDER BY seq LIMIT ?2)"},
      {&s.trim_metrics,
       "DELETE FROM metrics WHERE id IN "
       "(SELECT id FROM metrics WHERE job_id = ?1 ORDER BY id LIMIT ?2)"},
      {&s.trim_logs,
       "DELETE FROM logs WHERE id IN (SELECT id FROM logs WHERE job_id = ?1 AND attempt = ?2 "
       "AND rank = ?3 ORDER BY id LIMIT ?4)"},
      {&s.load_jobs, "SELECT id, submit_seq, blob FROM jobs ORDER BY submit_seq, id"},
      {&s.max_event_seq, "SELECT COALESCE(MAX(seq), 0) FROM events WHERE job_id = ?1"},
      {&s.load_workers, "SELECT id, blob FROM workers ORDER BY id"},
      {&s.list_events,
       "SELECT seq, blob FROM events WHERE job_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3"},
      {&s.list_metrics,
       "SELECT id, blob FROM (SELECT id, blob FROM metrics WHERE job_id = ?1 "
       "ORDER BY id DESC LIMIT ?2) ORDER BY id"},
      {&s.oldest_metrics,
       "SELECT id, attempt, rank, blob FROM metrics WHERE job_id = ?1 ORDER BY id LIMIT ?2"},
      {&s.delete_metric, "DELETE FROM metrics WHERE id = ?1"},
      {&s.page_metrics,
       "SELECT id, attempt, blob FROM metrics WHERE job_id = ?1 AND id > ?2 "
       "AND (?3 < 0 OR rank = ?3) ORDER BY id"},
      {&s.log_ranks, "SELECT DISTINCT rank FROM logs WHERE job_id = ?1 AND attempt = ?2 ORDER BY rank"},
      {&s.list_logs_rank,
       "SELECT id, blob FROM (SELECT id, blob FROM logs WHERE job_id = ?1 AND attempt = ?2 "
       "AND rank = ?3 ORDER BY id DESC LIMIT ?4) ORDER BY id"},
  };
  const std::string op = absl::StrCat("open ", path, ": prepare");
  for (const auto& [stmt, sql] : all) TRAINCTL_RETURN_IF_ERROR(stmt->Prepare(db, sql, op));
  return absl::OkStatus();
}

// Clang's analysis cannot tell that a body's `s.mu` is this `mu` (callers
// still must hold it: see the declaration), hence no analysis inside.
template <typename Body>
absl::Status StateStore::Impl::InTransaction(absl::string_view op, Body body, bool write)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (in_group) {
    if (sqlite3_get_autocommit(db)) {
      // SQLite rolled the group back after an error: nothing may be written
      // outside it until the owner ends it.
      return absl::UnavailableError(
          absl::StrCat("state store: ", op, ": the enclosing transaction was rolled back"));
    }
    TRAINCTL_RETURN_IF_ERROR(Query(db, stmts->savepoint, absl::StrCat(op, ": savepoint")).Run());
    absl::Status status = body();
    if (status.ok() && write) status = InjectedFault(op);
    if (!status.ok() && !sqlite3_get_autocommit(db)) {
      Query(db, stmts->rollback_to, absl::StrCat(op, ": rollback to savepoint")).Run().IgnoreError();
    }
    if (!sqlite3_get_autocommit(db)) {
      absl::Status released = Query(db, stmts->release, absl::StrCat(op, ": release")).Run();
      if (status.ok()) status = released;
    }
    return status;
  }
  TRAINCTL_RETURN_IF_ERROR(Query(db, stmts->begin, absl::StrCat(op, ": begin")).Run());
  absl::Status status = body();
  if (status.ok() && write) status = InjectedFault(op);
  if (status.ok()) {
    const absl::Time start = absl::Now();
    status = Query(db, stmts->commit, absl::StrCat(op, ": commit")).Run();
    ObserveCommit(op, absl::Now() - start);
    if (status.ok()) return status;
  }
  // After some errors SQLite has already rolled back; then there is no
  // transaction to end and ROLLBACK's own error says nothing new.
  if (!sqlite3_get_autocommit(db)) {
    Query(db, stmts->rollback, absl::StrCat(op, ": rollback")).Run().IgnoreError();
  }
  return status;
}

// ---------------------------------------------------------------------------

StateStore::StateStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StateStore::~StateStore() = default;

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const std::string& path,
                                                             StoreOptions options) {
  if (path.empty()) {
    return absl::InvalidArgumentError("state store: empty database path (use \":memory:\")");
  }
  auto impl = std::make_unique<Impl>(path, options);
  {
    absl::MutexLock lock(&impl->mu);
    TRAINCTL_RETURN_IF_ERROR(impl->OpenLocked());
  }
  return std::unique_ptr<StateStore>(new StateStore(std::move(impl)));
}

absl::StatusOr<StoreSnapshot> StateStore::LoadAll() {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  StoreSnapshot snapshot;
  // One read transaction, so the snapshot is consistent even if a future
  // version reads with several statements while another connection writes.
  absl::Status status = s.InTransaction("LoadAll", [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    {
      Query q(s.db, s.stmts->load_jobs, "LoadAll: read jobs");
      while (true) {
        TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
        if (!row) break;
        std::string id = q.Text(0);
        v1::Job job;
        TRAINCTL_RETURN_IF_ERROR(ParseBlob(q.Blob(2), &job, absl::StrCat("jobs row '", id, "'")));
        if (job.id() != id) {
          return absl::DataLossError(absl::StrCat("state store: jobs row '", id,
                                                  "' holds job '", job.id(), "'"));
        }
        snapshot.jobs.push_back(std::move(job));
        snapshot.submit_seqs.push_back(q.Int(1));
      }
    }
    for (const v1::Job& job : snapshot.jobs) {
      Query q(s.db, s.stmts->max_event_seq, absl::StrCat("LoadAll: last event of '", job.id(), "'"));
      q.Bind(1, job.id());
      TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
      snapshot.last_event_seqs.push_back(row ? q.Int(0) : 0);
    }
    Query q(s.db, s.stmts->load_workers, "LoadAll: read workers");
    while (true) {
      TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) break;
      std::string id = q.Text(0);
      v1::Worker worker;
      TRAINCTL_RETURN_IF_ERROR(
          ParseBlob(q.Blob(1), &worker, absl::StrCat("workers row '", id, "'")));
      if (worker.id() != id) {
        return absl::DataLossError(absl::StrCat("state store: workers row '", id,
                                                "' holds worker '", worker.id(), "'"));
      }
      snapshot.workers.push_back(std::move(worker));
    }
    Query t(s.db, s.stmts->load_telemetry_seqs, "LoadAll: read telemetry seqs");
    while (true) {
      TRAINCTL_ASSIGN_OR_RETURN(bool row, t.Step());
      if (!row) break;
      snapshot.telemetry_seqs.emplace_back(t.Text(0), t.Int(1));
    }
    return absl::OkStatus();
  }, /*write=*/false);
  if (!status.ok()) return status;
  return snapshot;
}

absl::Status StateStore::PutJob(const v1::Job& job, int64_t submit_seq,
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

  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  const int64_t max_events = s.options.max_events_per_job;
  std::optional<int64_t> new_count;
  absl::Status status = s.InTransaction(op, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    int64_t count = 0;
    const bool trim = max_events > 0 && !event_rows.empty();
    if (trim) {
      TRAINCTL_ASSIGN_OR_RETURN(count, s.RowsBefore(s.event_counts, job.id(),
                                                    s.stmts->count_events, op,
                                                    [&](Query& q) { q.Bind(1, job.id()); }));
    }
    TRAINCTL_RETURN_IF_ERROR(Query(s.db, s.stmts->upsert_job, op)
                                 .Bind(1, job.id())
                                 .Bind(2, submit_seq)
                                 .Bind(3, static_cast<int64_t>(job.state()))
                                 .BindBlob(4, job_blob)
                                 .Run());
    for (const auto& [seq, blob] : event_rows) {
      TRAINCTL_RETURN_IF_ERROR(Query(s.db, s.stmts->insert_event,
                                     absl::StrCat(op, ": insert event ", seq))
                                   .Bind(1, job.id())
                                   .Bind(2, seq)
                                   .BindBlob(3, blob)
                                   .Run());
    }
    if (!trim) return absl::OkStatus();
    count += static_cast<int64_t>(event_rows.size());
    if (count > max_events) {
      TRAINCTL_RETURN_IF_ERROR(Query(s.db, s.stmts->trim_events, absl::StrCat(op, ": retention"))
                                   .Bind(1, job.id())
                                   .Bind(2, count - max_events)
                                   .Run());
      count = max_events;
    }
    new_count = count;
    return absl::OkStatus();
  });
  if (status.ok() && new_count.has_value()) {
    s.event_counts[job.id()] = *new_count;
  } else if (!status.ok()) {
    s.event_counts.erase(job.id());
  }
  return status;
}

absl::StatusOr<std::vector<v1::Event>> StateStore::ListEvents(const std::string& job_id,
                                                              int64_t after_seq, int64_t limit) {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  std::vector<v1::Event> events;
  Query q(s.db, s.stmts->list_events, absl::StrCat("ListEvents('", job_id, "')"));
  q.Bind(1, job_id).Bind(2, after_seq).Bind(3, SqlLimit(limit));
  while (true) {
    TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    v1::Event& event = events.emplace_back();
    TRAINCTL_RETURN_IF_ERROR(ParseBlob(
        q.Blob(1), &event, absl::StrCat("events row ('", job_id, "', ", q.Int(0), ")")));
  }
  return events;
}

absl::Status StateStore::AppendMetrics(const v1::MetricBatch& batch) {
  if (batch.job_id().empty()) {
    return absl::InvalidArgumentError("state store: AppendMetrics: batch has no job_id");
  }
  if (batch.points().empty()) return absl::OkStatus();
  const std::string op = absl::StrCat("AppendMetrics('", batch.job_id(), "')");
  std::vector<std::string> blobs;
  blobs.reserve(batch.points_size());
  for (const v1::MetricPoint& point : batch.points()) blobs.push_back(point.SerializeAsString());

  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  const int64_t max_points = s.options.max_metric_points_per_job;
  std::optional<int64_t> new_count;
  absl::Status status = s.InTransaction(op, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    int64_t count = 0;
    if (max_points > 0) {
      TRAINCTL_ASSIGN_OR_RETURN(count, s.RowsBefore(s.metric_counts, batch.job_id(),
                                                    s.stmts->count_metrics, op,
                                                    [&](Query& q) { q.Bind(1, batch.job_id()); }));
    }
    for (int i = 0; i < batch.points_size(); ++i) {
      TRAINCTL_RETURN_IF_ERROR(Query(s.db, s.stmts->insert_metric, op)
                                   .Bind(1, batch.job_id())
                                   .Bind(2, int64_t{batch.attempt()})
                                   .Bind(3, int64_t{batch.points(i).rank()})
                                   .BindBlob(4, blobs[i])
                                   .Run());
    }
    if (max_points <= 0) return absl::OkStatus();
    count += batch.points_size();
    if (count > max_points) {
      TRAINCTL_ASSIGN_OR_RETURN(int64_t removed, s.DownsampleMetrics(batch.job_id(), count / 2, op));
      count -= removed;
    }
    if (count > max_points) {
      TRAINCTL_RETURN_IF_ERROR(Query(s.db, s.stmts->trim_metrics, absl::StrCat(op, ": retention"))
                                   .Bind(1, batch.job_id())
                                   .Bind(2, count - max_points)
                                   .Run());
      count = max_points;
    }
    new_count = count;
    return absl::OkStatus();
  });
  if (status.ok() && new_count.has_value()) {
    s.metric_counts[batch.job_id()] = *new_count;
  } else if (!status.ok()) {
    s.metric_counts.erase(batch.job_id());
  }
  return status;
}

absl::StatusOr<int64_t> StateStore::Impl::DownsampleMetrics(const std::string& job_id,
                                                            int64_t oldest, absl::string_view op) {
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
      TRAINCTL_RETURN_IF_ERROR(ParseBlob(q.Blob(3), &point, absl::StrCat("metrics row ", q.Int(0))));
      if (point.kind() != v1::MetricPoint::KIND_TRAIN) continue;
      series[{q.Int(1), q.Int(2)}].push_back(Row{q.Int(0), point.loss()});
    }
  }
  int64_t removed = 0;
  for (const auto& [key, rows] : series) {
    for (size_t start = 0; start + kMetricBucketPoints <= rows.size(); start += kMetricBucketPoints) {
      const size_t end = start + kMetricBucketPoints;
      size_t lo = start, hi = start;
      for (size_t i = start; i < end; ++i) {
        if (rows[i].loss < rows[lo].loss) lo = i;
        if (rows[i].loss > rows[hi].loss) hi = i;
      }
      for (size_t i = start; i < end; ++i) {
        if (i == lo || i == hi || i == end - 1) continue;
        TRAINCTL_RETURN_IF_ERROR(
            Query(db, stmts->delete_metric, absl::StrCat(op, ": downsample")).Bind(1, rows[i].id).Run());
        ++removed;
      }
    }
  }
  return removed;
}

const LatencyHistogram& StateStore::commit_latency() const { return impl_->commit_latency; }

absl::StatusOr<MetricPage> StateStore::ListMetricPage(const MetricPageQuery& query) {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  MetricPage page;
  int64_t bytes = 0;
  Query q(s.db, s.stmts->page_metrics, absl::StrCat("ListMetricPage('", query.job_id, "')"));
  q.Bind(1, query.job_id).Bind(2, query.after_id).Bind(3, int64_t{query.rank.value_or(-1)});
  while (true) {
    TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    StoredMetricPoint stored{q.Int(0), static_cast<int32_t>(q.Int(1)), {}};
    absl::string_view blob = q.Blob(2);
    TRAINCTL_RETURN_IF_ERROR(ParseBlob(blob, &stored.point, absl::StrCat("metrics row ", stored.id)));
    if (query.kind != v1::MetricPoint::KIND_UNSPECIFIED && stored.point.kind() != query.kind) continue;
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

absl::StatusOr<std::vector<v1::MetricPoint>> StateStore::ListMetrics(const std::string& job_id,
                                                                     int64_t limit) {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  std::vector<v1::MetricPoint> points;
  Query q(s.db, s.stmts->list_metrics, absl::StrCat("ListMetrics('", job_id, "')"));
  q.Bind(1, job_id).Bind(2, SqlLimit(limit));
  while (true) {
    TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    v1::MetricPoint& point = points.emplace_back();
    TRAINCTL_RETURN_IF_ERROR(ParseBlob(q.Blob(1), &point, absl::StrCat("metrics row ", q.Int(0))));
  }
  return points;
}

absl::Status StateStore::AppendLogs(const v1::LogChunk& chunk) {
  if (chunk.job_id().empty()) {
    return absl::InvalidArgumentError("state store: AppendLogs: chunk has no job_id");
  }
  if (chunk.lines().empty()) return absl::OkStatus();
  const std::string op =
      absl::StrCat("AppendLogs('", chunk.job_id(), "', attempt ", chunk.attempt(), ", rank ",
                   chunk.rank(), ")");
  // The chunk's rank is authoritative: every stored line carries it, so
  // ListLogs over several ranks tells the lines apart.
  std::vector<std::string> blobs;
  blobs.reserve(chunk.lines_size());
  for (const v1::LogLine& line : chunk.lines()) {
    if (line.rank() == chunk.rank()) {
      blobs.push_back(line.SerializeAsString());
    } else {
      v1::LogLine stored = line;
      stored.set_rank(chunk.rank());
      blobs.push_back(stored.SerializeAsString());
    }
  }

  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  const int64_t max_lines = s.options.max_log_lines_per_rank;
  const Impl::LogKey key{chunk.job_id(), chunk.attempt(), chunk.rank()};
  std::optional<int64_t> new_count;
  absl::Status status = s.InTransaction(op, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    int64_t count = 0;
    if (max_lines > 0) {
      TRAINCTL_ASSIGN_OR_RETURN(count, s.RowsBefore(s.log_counts, key, s.stmts->count_logs, op,
                                                    [&](Query& q) {
                                                      q.Bind(1, chunk.job_id())
                                                          .Bind(2, int64_t{chunk.attempt()})
                                                          .Bind(3, int64_t{chunk.rank()});
                                                    }));
    }
    for (const std::string& blob : blobs) {
      TRAINCTL_RETURN_IF_ERROR(Query(s.db, s.stmts->insert_log, op)
                                   .Bind(1, chunk.job_id())
                                   .Bind(2, int64_t{chunk.attempt()})
                                   .Bind(3, int64_t{chunk.rank()})
                                   .BindBlob(4, blob)
                                   .Run());
    }
    if (max_lines <= 0) return absl::OkStatus();
    count += chunk.lines_size();
    if (count > max_lines) {
      TRAINCTL_RETURN_IF_ERROR(Query(s.db, s.stmts->trim_logs, absl::StrCat(op, ": retention"))
                                   .Bind(1, chunk.job_id())
                                   .Bind(2, int64_t{chunk.attempt()})
                                   .Bind(3, int64_t{chunk.rank()})
                                   .Bind(4, count - max_lines)
                                   .Run());
      count = max_lines;
    }
    new_count = count;
    return absl::OkStatus();
  });
  if (status.ok() && new_count.has_value()) {
    s.log_counts[key] = *new_count;
  } else if (!status.ok()) {
    s.log_counts.erase(key);
  }
  return status;
}

absl::StatusOr<std::vector<v1::LogLine>> StateStore::ListLogs(const std::string& job_id,
                                                              int32_t attempt,
                                                              std::optional<int32_t> rank,
                                                              int64_t tail_lines) {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("ListLogs('", job_id, "', attempt ", attempt, ")");
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
    while (true) {
      TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) break;
      v1::LogLine& line = lines.emplace_back();
      TRAINCTL_RETURN_IF_ERROR(ParseBlob(q.Blob(1), &line, absl::StrCat("logs row ", q.Int(0))));
    }
  }
  return lines;
}

absl::Status StateStore::PutWorker(const v1::Worker& worker) {
  if (worker.id().empty()) {
    return absl::InvalidArgumentError("state store: PutWorker: worker has no id");
  }
  const std::string blob = worker.SerializeAsString();
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("PutWorker('", worker.id(), "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  // A single statement is its own transaction.
  return Query(s.db, s.stmts->put_worker, op)
      .Bind(1, worker.id())
      .BindBlob(2, blob)
      .Run();
}

absl::Status StateStore::DeleteWorker(const std::string& id) {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("DeleteWorker('", id, "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  return Query(s.db, s.stmts->delete_worker, op).Bind(1, id).Run();
}

absl::Status StateStore::PutToken(const v1::Token& token, const std::string& secret_hash) {
  if (token.id().empty()) return absl::InvalidArgumentError("state store: PutToken: token has no id");
  const std::string blob = token.SerializeAsString();
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("PutToken('", token.id(), "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  return Query(s.db, s.stmts->put_token, op).Bind(1, token.id()).Bind(2, secret_hash).BindBlob(3, blob).Run();
}

absl::StatusOr<std::vector<StoredToken>> StateStore::LoadTokens() {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  std::vector<StoredToken> out;
  Query q(s.db, s.stmts->load_tokens, "LoadTokens");
  while (true) {
    TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    StoredToken t;
    std::string id = q.Text(0);
    t.secret_hash = q.Text(1);
    TRAINCTL_RETURN_IF_ERROR(ParseBlob(q.Blob(2), &t.token, absl::StrCat("tokens row '", id, "'")));
    if (t.token.id() != id) {
      return absl::DataLossError(absl::StrCat("state store: tokens row '", id, "' holds token '",
                                              t.token.id(), "'"));
    }
    out.push_back(std::move(t));
  }
  return out;
}

absl::Status StateStore::PutWorkerBinding(const std::string& worker_id, const std::string& token_id) {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("PutWorkerBinding('", worker_id, "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  return Query(s.db, s.stmts->put_binding, op).Bind(1, worker_id).Bind(2, token_id).Run();
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> StateStore::LoadWorkerBindings() {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  std::vector<std::pair<std::string, std::string>> out;
  Query q(s.db, s.stmts->load_bindings, "LoadWorkerBindings");
  while (true) {
    TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    out.emplace_back(q.Text(0), q.Text(1));
  }
  return out;
}

void StateStore::SetWriteFaultForTest(WriteFault fail) {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  s.write_fault = std::move(fail);
  s.writes_since_fault = 0;
}

absl::Status StateStore::BeginGroup() {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  if (s.in_group) return absl::FailedPreconditionError("state store: BeginGroup: a group is already open");
  TRAINCTL_RETURN_IF_ERROR(Query(s.db, s.stmts->begin, "BeginGroup: begin").Run());
  s.in_group = true;
  s.group_changes = sqlite3_total_changes64(s.db);
  return absl::OkStatus();
}

absl::Status StateStore::CommitGroup(const std::string& worker_id, int64_t telemetry_seq) {
  return CommitGroup(std::vector<std::pair<std::string, int64_t>>{{worker_id, telemetry_seq}});
}

absl::Status StateStore::CommitGroup(
    const std::vector<std::pair<std::string, int64_t>>& telemetry_seqs) {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  if (!s.in_group) return absl::FailedPreconditionError("state store: CommitGroup: no open group");
  const std::string op =
      telemetry_seqs.size() == 1
          ? absl::StrCat("CommitGroup('", telemetry_seqs[0].first, "', seq ", telemetry_seqs[0].second, ")")
          : absl::StrCat("CommitGroup(", telemetry_seqs.size(), " workers)");
  absl::Status status;
  if (sqlite3_get_autocommit(s.db)) {
    status = absl::UnavailableError(absl::StrCat("state store: ", op, ": the transaction was rolled back"));
  } else if (sqlite3_total_changes64(s.db) != s.group_changes) {
    // Only a group that wrote something records its seqs: one that changed
    // nothing costs no disk write (see the header).
    for (const auto& [worker_id, seq] : telemetry_seqs) {
      status = Query(s.db, s.stmts->put_telemetry_seq, op).Bind(1, worker_id).Bind(2, seq).Run();
      if (!status.ok()) break;
    }
  }
  if (status.ok()) {
    const absl::Time start = absl::Now();
    status = Query(s.db, s.stmts->commit, absl::StrCat(op, ": commit")).Run();
    s.ObserveCommit(op, absl::Now() - start);
  }
  if (status.ok()) {
    s.in_group = false;
    return status;
  }
  s.RollbackGroupLocked();
  return status;
}

void StateStore::RollbackGroup() {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  if (s.in_group) s.RollbackGroupLocked();
}

void StateStore::Impl::RollbackGroupLocked() {
  if (!sqlite3_get_autocommit(db)) Query(db, stmts->rollback, "RollbackGroup").Run().IgnoreError();
  in_group = false;
  // Row counts cached by the group's appends may count rows that are gone.
  event_counts.clear();
  metric_counts.clear();
  log_counts.clear();
}

}  // namespace trainctl::coordinator
