#include "coordinator/store/state_store.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "absl/time/clock.h"

#include "absl/strings/match.h"
#include "coordinator/store/pg_db.h"
#include "coordinator/store/sqlite_db.h"
#include "coordinator/store/state_store_impl.h"

namespace trainctl::coordinator {

using store_internal::Query;
using store_internal::SqliteDb;
using store_internal::SqliteStatus;
using store_internal::Statement;
using store_internal::ParseBlob;

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
    // 3 -> 4: revoked worker certificates (trainctl worker revoke), checked
    // at every Session open and message.
    R"sql(
      CREATE TABLE revoked_workers (
        worker_id TEXT PRIMARY KEY NOT NULL,
        blob      BLOB NOT NULL        -- v1.RevokeWorkerResponse
      ) WITHOUT ROWID;
    )sql",
    // 4 -> 5: each job owner's number (StartRanks.owner_number): a worker
    // with --rank-uids runs an owner's ranks as its own uid, the same on
    // every host. A number is never given to another owner.
    R"sql(
      CREATE TABLE owner_numbers (
        owner  TEXT PRIMARY KEY NOT NULL,
        number INTEGER NOT NULL UNIQUE
      ) WITHOUT ROWID;
    )sql",
    // 5 -> 6: queues (docs/queues.md), defined by an admin.
    R"sql(
      CREATE TABLE queues (
        name TEXT PRIMARY KEY NOT NULL,
        blob BLOB NOT NULL             -- v1.Queue
      ) WITHOUT ROWID;
    )sql",
    // 6 -> 7: the leader record of active/standby coordinators on
    // PostgreSQL (one row: the epoch, incremented by each coordinator that
    // becomes active, and where it is reached), and on jobs and events the
    // epoch of the coordinator that wrote the row: the proof that a deposed
    // coordinator wrote nothing. SQLite has the columns too (epoch 0).
    R"sql(
      CREATE TABLE leader (
        id       INTEGER PRIMARY KEY NOT NULL CHECK (id = 1),
        epoch    INTEGER NOT NULL,
        address  TEXT NOT NULL,        -- HOST:PORT (--advertise-address)
        since_ms INTEGER NOT NULL      -- when it became active (Unix ms)
      );
      ALTER TABLE jobs ADD COLUMN leader_epoch INTEGER NOT NULL DEFAULT 0;
      ALTER TABLE events ADD COLUMN leader_epoch INTEGER NOT NULL DEFAULT 0;
    )sql",
    // 7 -> 8: code archives (CommandSpec.code, stored by digest), and on
    // jobs the digest each job's spec names ('' for none): an archive no job
    // names is deleted after a grace (DeleteUnreferencedCode).
    R"sql(
      CREATE TABLE code_archives (
        digest      TEXT PRIMARY KEY NOT NULL,  -- "sha256:<64 hex>"
        size        INTEGER NOT NULL,
        uploaded_ms INTEGER NOT NULL,           -- Unix ms of the last upload
        blob        BLOB NOT NULL               -- the ustar archive
      );
      ALTER TABLE jobs ADD COLUMN code_digest TEXT NOT NULL DEFAULT '';
      CREATE INDEX jobs_by_code_digest ON jobs (code_digest);
    )sql",
    // 8 -> 9: fair-share usage (docs/queues.md): one row holding every
    // queue's and owner's decayed usage, rewritten every few seconds, so a
    // restart or a standby taking over keeps the shares.
    R"sql(
      CREATE TABLE fair_share (
        id   INTEGER PRIMARY KEY NOT NULL CHECK (id = 1),
        blob BLOB NOT NULL             -- v1.FairShareSnapshot
      );
    )sql",
    // 9 -> 10: accounting (`trainctl usage --by attempt`, usage_table.cc):
    // one row per ended attempt, written once its last rank exited; kept
    // when the job is gone (a site bills from it).
    R"sql(
      CREATE TABLE attempt_usage (
        job_id   TEXT NOT NULL,
        attempt  INTEGER NOT NULL,
        owner    TEXT NOT NULL,
        queue    TEXT NOT NULL,
        start_ms INTEGER NOT NULL,     -- Unix ms of the placement
        end_ms   INTEGER NOT NULL,     -- Unix ms the last rank exited
        blob     BLOB NOT NULL,        -- v1.AttemptUsage
        PRIMARY KEY (job_id, attempt)
      ) WITHOUT ROWID;
      CREATE INDEX attempt_usage_by_end ON attempt_usage (end_ms);
    )sql",
};
constexpr int kSchemaVersion = static_cast<int>(sizeof(kMigrations) / sizeof(kMigrations[0]));

// Busy timeouts. Open waits briefly: in exclusive locking mode a database
// that stays locked belongs to another live coordinator, and waiting longer
// cannot help. Afterwards the lock is ours and the timeout is a safety net.
constexpr int kOpenBusyTimeoutMs = 500;
constexpr int kBusyTimeoutMs = 5000;

// An existing file at `path` with nothing in it (0 bytes, or SQLite without
// tables): a wrong --db, not a new cluster -- starting empty there would
// silently forget the real database's jobs.
absl::Status EmptyFileError(absl::string_view path) {
  return absl::FailedPreconditionError(absl::StrCat(
      "state store: open ", path, ": the file exists but is not a trainctl database (it is ",
      "empty); a new database needs a path that does not exist yet: point --db at the "
      "existing trainctl database, or remove this file to start a new one"));
}

}  // namespace

absl::Status StateStore::Impl::Exec(const char* sql, absl::string_view op) {
  return db->Exec(sql, op);
}

absl::Status StateStore::Impl::OpenLocked() {
  if (path == ":memory:") {
    created = true;
  } else {
    struct stat st;
    if (FileEnv::Or(options.file_env)->StatAt(AT_FDCWD, path, &st) == 0) {
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
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  // The connection is owned from here on, even when the open failed.
  conn = std::make_unique<SqliteDb>(raw);
  db = conn.get();
  if (rc != SQLITE_OK) return SqliteStatus(raw, rc, absl::StrCat("open ", path));
  sqlite3_extended_result_codes(raw, 1);
  sqlite3_busy_timeout(raw, kOpenBusyTimeoutMs);

  // Exclusive locking before WAL: the connection keeps the database locked
  // for its lifetime, so a second coordinator on the same file fails at Open
  // instead of interleaving writes; the WAL index then lives in heap memory
  // (no -shm file). journal_mode is the first statement that reads the file,
  // so a file that is not SQLite fails here with SQLITE_NOTADB.
  TRAINCTL_RETURN_IF_ERROR(Exec("PRAGMA locking_mode=EXCLUSIVE", absl::StrCat("open ", path)));
  if (!created) TRAINCTL_RETURN_IF_ERROR(CheckExistingFile(raw));
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
  sqlite3_busy_timeout(raw, kBusyTimeoutMs);
  return PrepareStatements();
}

absl::Status StateStore::Impl::IdentityError(int64_t app_id, int64_t version, int64_t objects) {
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
    return absl::FailedPreconditionError(
        absl::StrCat("state store: open ", path, ": invalid schema version ", version));
  }
  return absl::OkStatus();
}

// Before anything is written to an existing file (the WAL switch rewrites
// its header): is it ours, and is it whole? Refused files stay as they were.
absl::Status StateStore::Impl::CheckExistingFile(sqlite3* raw) {
  TRAINCTL_ASSIGN_OR_RETURN(store_internal::DbIdentity id,
                            db->ReadIdentity(absl::StrCat("open ", path)));
  TRAINCTL_RETURN_IF_ERROR(IdentityError(id.app_id, id.version, id.objects));
  if (options.integrity_check_timeout <= absl::ZeroDuration()) return absl::OkStatus();
  // quick_check reads every page (O(size)); bounded so that a huge database
  // does not hold up a restart: past the bound it is interrupted, said, and
  // the open goes on unchecked.
  const absl::Time start = absl::Now();
  struct Bound {
    absl::Time deadline;
    bool hit = false;
  } bound{start + options.integrity_check_timeout};
  sqlite3_progress_handler(
      raw, 10000,
      [](void* p) -> int {
        auto* b = static_cast<Bound*>(p);
        b->hit = b->hit || absl::Now() > b->deadline;
        return b->hit ? 1 : 0;
      },
      &bound);
  std::vector<std::string> problems;
  int rc = SQLITE_OK;
  {
    sqlite3_stmt* raw_stmt = nullptr;
    rc = sqlite3_prepare_v3(raw, "PRAGMA quick_check(20)", -1, 0, &raw_stmt, nullptr);
    if (rc != SQLITE_OK) {
      sqlite3_progress_handler(raw, 0, nullptr, nullptr);
      sqlite3_finalize(raw_stmt);
      return SqliteStatus(raw, rc,
                          absl::StrCat("open ", path, ": quick_check prepare \"PRAGMA quick_check(20)\""));
    }
    while ((rc = sqlite3_step(raw_stmt)) == SQLITE_ROW) {
      const unsigned char* text = sqlite3_column_text(raw_stmt, 0);
      std::string line = text != nullptr ? reinterpret_cast<const char*>(text) : "";
      if (line != "ok") problems.push_back(std::move(line));
    }
    sqlite3_finalize(raw_stmt);
  }
  sqlite3_progress_handler(raw, 0, nullptr, nullptr);
  if (bound.hit) {
    LogEvent(
        LogLevel::kWarn, "coordinator", "db_check_cut_short",
        {{"db", path},
         {"after", absl::FormatDuration(absl::Now() - start)},
         {"hint",
          "raise --db-check-timeout-s, or check it offline: sqlite3 DB 'PRAGMA integrity_check'"}});
    return absl::OkStatus();
  }
  if (rc != SQLITE_DONE && problems.empty()) {
    return SqliteStatus(raw, rc, absl::StrCat("open ", path, ": quick_check"));
  }
  if (!problems.empty()) {
    return absl::DataLossError(absl::StrCat(
        "state store: open ", path,
        ": the database is damaged (PRAGMA quick_check: ", absl::StrJoin(problems, "; "),
        "); refusing to start on it (the file is left as it was): restore a backup "
        "(docs/operator.md), or "
        "move it aside to start a new cluster"));
  }
  return absl::OkStatus();
}

absl::Status StateStore::Impl::Migrate() {
  const std::string op = absl::StrCat("open ", path, ": migrate schema");
  TRAINCTL_RETURN_IF_ERROR(Exec(db->BeginSql(), op));
  absl::Status status = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) -> absl::Status {
    TRAINCTL_ASSIGN_OR_RETURN(store_internal::DbIdentity id,
                              db->ReadIdentity(absl::StrCat("open ", path)));
    TRAINCTL_RETURN_IF_ERROR(IdentityError(id.app_id, id.version, id.objects));
    for (int64_t v = id.version; v < kSchemaVersion; ++v) {
      TRAINCTL_RETURN_IF_ERROR(db->Exec(db->SchemaSql(kMigrations[v]),
                                        absl::StrCat(op, " from version ", v, " to ", v + 1)));
    }
    if (id.version != kSchemaVersion) {
      TRAINCTL_RETURN_IF_ERROR(db->WriteIdentity(kApplicationId, kSchemaVersion, op));
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
  // A statement's SQL, and PostgreSQL's where it differs (upserts, MAX of two
  // values, LIMIT -1 for "no limit", an alias for a subquery, typed
  // parameters); SQLite's is used as written.
  struct Sql {
    Statement* stmt;
    const char* sqlite;
    const char* postgres = nullptr;
  };
  const Sql all[] = {
      {&s.begin, "BEGIN IMMEDIATE", "BEGIN"},
      {&s.commit, "COMMIT"},
      {&s.rollback, "ROLLBACK"},
      {&s.savepoint, "SAVEPOINT nested"},
      {&s.release, "RELEASE nested"},
      {&s.rollback_to, "ROLLBACK TO nested"},
      {&s.load_telemetry_seqs, "SELECT worker_id, seq FROM telemetry_seqs ORDER BY worker_id"},
      {&s.upsert_job,
       "INSERT INTO jobs (id, submit_seq, state, blob, leader_epoch, code_digest) "
       "VALUES (?1, ?2, ?3, ?4, ?5, ?6) "
       "ON CONFLICT (id) DO UPDATE SET state = excluded.state, blob = excluded.blob, "
       "leader_epoch = excluded.leader_epoch, code_digest = excluded.code_digest"},
      {&s.insert_event,
       "INSERT INTO events (job_id, seq, blob, leader_epoch) VALUES (?1, ?2, ?3, ?4)"},
      {&s.put_worker, "INSERT OR REPLACE INTO workers (id, blob) VALUES (?1, ?2)",
       "INSERT INTO workers (id, blob) VALUES (?1, ?2) "
       "ON CONFLICT (id) DO UPDATE SET blob = excluded.blob"},
      {&s.delete_worker, "DELETE FROM workers WHERE id = ?1"},
      {&s.put_token, "INSERT OR REPLACE INTO tokens (id, secret_hash, blob) VALUES (?1, ?2, ?3)",
       "INSERT INTO tokens (id, secret_hash, blob) VALUES (?1, ?2, ?3) ON CONFLICT (id) "
       "DO UPDATE SET secret_hash = excluded.secret_hash, blob = excluded.blob"},
      {&s.load_tokens, "SELECT id, secret_hash, blob FROM tokens ORDER BY id"},
      {&s.put_binding, "INSERT OR IGNORE INTO worker_bindings (worker_id, token_id) VALUES (?1, ?2)",
       "INSERT INTO worker_bindings (worker_id, token_id) VALUES (?1, ?2) "
       "ON CONFLICT (worker_id) DO NOTHING"},
      {&s.load_bindings, "SELECT worker_id, token_id FROM worker_bindings ORDER BY worker_id"},
      {&s.put_revoked_worker, "INSERT OR REPLACE INTO revoked_workers (worker_id, blob) VALUES (?1, ?2)",
       "INSERT INTO revoked_workers (worker_id, blob) VALUES (?1, ?2) "
       "ON CONFLICT (worker_id) DO UPDATE SET blob = excluded.blob"},
      {&s.load_revoked_workers, "SELECT worker_id, blob FROM revoked_workers ORDER BY worker_id"},
      {&s.put_owner_number, "INSERT INTO owner_numbers (owner, number) VALUES (?1, ?2)"},
      {&s.load_owner_numbers, "SELECT owner, number FROM owner_numbers ORDER BY number"},
      {&s.put_queue, "INSERT OR REPLACE INTO queues (name, blob) VALUES (?1, ?2)",
       "INSERT INTO queues (name, blob) VALUES (?1, ?2) "
       "ON CONFLICT (name) DO UPDATE SET blob = excluded.blob"},
      {&s.delete_queue, "DELETE FROM queues WHERE name = ?1"},
      {&s.load_queues, "SELECT name, blob FROM queues ORDER BY name"},
      {&s.put_fair_share, "INSERT OR REPLACE INTO fair_share (id, blob) VALUES (1, ?1)",
       "INSERT INTO fair_share (id, blob) VALUES (1, ?1) ON CONFLICT (id) DO UPDATE SET blob = excluded.blob"},
      {&s.load_fair_share, "SELECT blob FROM fair_share WHERE id = 1"},
      {&s.put_attempt_usage,
       "INSERT INTO attempt_usage (job_id, attempt, owner, queue, start_ms, end_ms, blob) "
       "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (job_id, attempt) DO UPDATE SET "
       "owner = excluded.owner, queue = excluded.queue, start_ms = excluded.start_ms, "
       "end_ms = excluded.end_ms, blob = excluded.blob"},
      {&s.load_attempt_usage,
       "SELECT job_id, attempt, blob FROM attempt_usage WHERE end_ms > ?1 AND start_ms < ?2 "
       "ORDER BY start_ms, job_id, attempt"},
      {&s.put_code,
       "INSERT INTO code_archives (digest, size, uploaded_ms, blob) VALUES (?1, ?2, ?3, ?4) "
       "ON CONFLICT (digest) DO UPDATE SET uploaded_ms = excluded.uploaded_ms"},
      {&s.code_size, "SELECT size FROM code_archives WHERE digest = ?1"},
      {&s.touch_code, "UPDATE code_archives SET uploaded_ms = ?2 WHERE digest = ?1"},
      {&s.read_code, "SELECT size, substr(blob, ?2, ?3) FROM code_archives WHERE digest = ?1",
       "SELECT size, substring(blob FROM ?2::INTEGER FOR ?3::INTEGER) FROM code_archives WHERE digest = ?1"},
      {&s.delete_unreferenced_code,
       "DELETE FROM code_archives WHERE uploaded_ms < ?1 AND NOT EXISTS "
       "(SELECT 1 FROM jobs WHERE jobs.code_digest = code_archives.digest)"},
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
       "SELECT seq, blob FROM events WHERE job_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
       "SELECT seq, blob FROM events WHERE job_id = ?1 AND seq > ?2 ORDER BY seq "
       "LIMIT NULLIF(?3::BIGINT, -1)"},
      {&s.list_metrics,
       "SELECT id, blob FROM (SELECT id, blob FROM metrics WHERE job_id = ?1 "
       "ORDER BY id DESC LIMIT ?2) ORDER BY id",
       "SELECT id, blob FROM (SELECT id, blob FROM metrics WHERE job_id = ?1 "
       "ORDER BY id DESC LIMIT NULLIF(?2::BIGINT, -1)) AS newest ORDER BY id"},
      {&s.oldest_metrics,
       "SELECT id, attempt, rank, blob FROM metrics WHERE job_id = ?1 ORDER BY id LIMIT ?2"},
      {&s.delete_metric, "DELETE FROM metrics WHERE id = ?1"},
      {&s.page_metrics,
       "SELECT id, attempt, blob FROM metrics WHERE job_id = ?1 AND id > ?2 "
       "AND (?3 < 0 OR rank = ?3) ORDER BY id",
       "SELECT id, attempt, blob FROM metrics WHERE job_id = ?1 AND id > ?2 "
       "AND (?3::BIGINT < 0 OR rank = ?3::BIGINT) ORDER BY id"},
      {&s.log_ranks, "SELECT DISTINCT rank FROM logs WHERE job_id = ?1 AND attempt = ?2 ORDER BY rank"},
      {&s.list_logs_rank,
       "SELECT id, blob FROM (SELECT id, blob FROM logs WHERE job_id = ?1 AND attempt = ?2 "
       "AND rank = ?3 ORDER BY id DESC LIMIT ?4) ORDER BY id",
       "SELECT id, blob FROM (SELECT id, blob FROM logs WHERE job_id = ?1 AND attempt = ?2 "
       "AND rank = ?3 ORDER BY id DESC LIMIT NULLIF(?4::BIGINT, -1)) AS newest ORDER BY id"},
      // (PostgreSQL only: SQLite's coordinator is alone by its file lock.)
      {&s.take_leadership,
       "INSERT INTO leader (id, epoch, address, since_ms) VALUES (1, 1, ?1, ?2) "
       "ON CONFLICT (id) DO UPDATE SET epoch = leader.epoch + 1, address = excluded.address, "
       "since_ms = excluded.since_ms RETURNING epoch"},
      {&s.check_epoch, "SELECT epoch, address FROM leader WHERE id = 1",
       "SELECT epoch, address FROM leader WHERE id = 1 FOR SHARE"},
      {&s.read_epoch, "SELECT epoch, address FROM leader WHERE id = 1"},
  };
  const std::string op = absl::StrCat("open ", path, ": prepare");
  const bool postgres = db->backend() == store_internal::SqlBackend::kPostgres;
  for (const Sql& sql : all) {
    const char* text = postgres && sql.postgres != nullptr ? sql.postgres : sql.sqlite;
    TRAINCTL_RETURN_IF_ERROR(sql.stmt->Prepare(db, text, op));
  }
  // Multi-row statements (kChunkRows). A worker appears once per upsert
  // (CommitGroup merges), as PostgreSQL's ON CONFLICT requires.
  TRAINCTL_RETURN_IF_ERROR(PrepareChunked(s.insert_metrics, "INSERT INTO metrics (job_id, attempt, rank, blob)", 4, "", op));
  TRAINCTL_RETURN_IF_ERROR(PrepareChunked(s.insert_logs, "INSERT INTO logs (job_id, attempt, rank, blob)", 4, "", op));
  return PrepareChunked(
      s.put_telemetry_seqs, "INSERT INTO telemetry_seqs (worker_id, seq)", 2,
      postgres ? " ON CONFLICT (worker_id) DO UPDATE SET seq = GREATEST(telemetry_seqs.seq, excluded.seq)"
               : " ON CONFLICT (worker_id) DO UPDATE SET seq = MAX(seq, excluded.seq)",
      op);
}

absl::Status StateStore::Impl::PrepareChunked(ChunkedStatement& out, absl::string_view head,
                                              int params_per_row, absl::string_view tail,
                                              absl::string_view op) {
  for (size_t c = 0; c < kChunkRows.size(); ++c) {
    std::string sql = absl::StrCat(head, " VALUES ");
    int param = 1;
    for (int row = 0; row < kChunkRows[c]; ++row) {
      absl::StrAppend(&sql, row == 0 ? "(" : ", (");
      for (int i = 0; i < params_per_row; ++i) absl::StrAppend(&sql, i == 0 ? "?" : ", ?", param++);
      absl::StrAppend(&sql, ")");
    }
    absl::StrAppend(&sql, tail);
    TRAINCTL_RETURN_IF_ERROR(out[c].Prepare(db, sql.c_str(), op));
  }
  return absl::OkStatus();
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

absl::Status StateStore::Impl::OpenPostgresLocked(const std::string& conninfo,
                                                  StoreLeader* holder) {
  store_internal::PgLockHolder lock_holder;
  absl::StatusOr<std::unique_ptr<store_internal::SqlDb>> connected = store_internal::ConnectPostgres(
      conninfo, path, store_internal::PgSession{options.leader_lease}, &lock_holder);
  if (!connected.ok()) {
    if (holder != nullptr) *holder = StoreLeader{lock_holder.epoch, lock_holder.address};
    return connected.status();
  }
  conn = std::move(*connected);
  db = conn.get();
  // The database is given by the operator (CREATE DATABASE): an empty one
  // becomes a new trainctl store; one with other tables is refused.
  created = true;
  TRAINCTL_RETURN_IF_ERROR(Migrate());
  connection_epoch = db->ConnectionEpoch();
  TRAINCTL_RETURN_IF_ERROR(PrepareStatements());
  return TakeLeadership();
}

absl::Status StateStore::Impl::TakeLeadership() {
  // One statement, so one transaction: the epoch and the address change
  // together. A write of the previous leader that still holds the leader
  // row (CheckEpoch's row lock) commits first; any later one fails its check.
  const std::string op = absl::StrCat("open ", path, ": take the leader epoch");
  Query q(db, stmts->take_leadership, op);
  q.Bind(1, options.leader_address).Bind(2, absl::ToUnixMillis(absl::Now()));
  TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row || q.Int(0) <= 0) return absl::InternalError(absl::StrCat("state store: ", op, ": no epoch returned"));
  leader_epoch = q.Int(0);
  NoteConfirmed(MonotonicNow());
  LogEvent(LogLevel::kInfo, "coordinator", "leader_epoch",
           {{"db", path}, {"epoch", absl::StrCat(leader_epoch)}, {"address", options.leader_address}});
  return absl::OkStatus();
}

absl::Status StateStore::Impl::CheckEpoch(absl::string_view op) {
  const absl::Time sent = MonotonicNow();
  Query q(db, stmts->check_epoch, absl::StrCat(op, ": check the leader epoch"));
  TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
  const int64_t stored = row ? q.Int(0) : 0;
  if (stored == leader_epoch) {
    NoteConfirmed(sent);
    return absl::OkStatus();
  }
  deposed = absl::FailedPreconditionError(absl::StrCat(
      "state store: ", op, ": this coordinator (leader epoch ", leader_epoch,
      ") was deposed by epoch ", stored,
      row ? absl::StrCat(" (the active coordinator is at ", q.Text(1), ")") : std::string(),
      "; it writes nothing more"));
  return deposed;
}

void StateStore::Impl::NoteDeposition(const absl::Status& failed) {
  if (deposed.ok() && db != nullptr && db->LostLock()) deposed = failed;
  if (deposed.ok() || deposed_told) return;
  deposed_told = true;
  if (options.on_deposed) options.on_deposed(deposed);
}

void StateStore::Impl::PingLoop() {
  const absl::Duration every = std::max(options.leader_lease / 4, absl::Milliseconds(50));
  while (!stop_ping.WaitForNotificationWithTimeout(every)) {
    absl::MutexLock lock(&mu);
    if (!deposed.ok()) return;
    // Inside an open group this runs in its transaction: harmless (a failed
    // one only answers with an error), and it keeps that session busy too.
    const absl::Time sent = MonotonicNow();
    Query q(db, stmts->read_epoch, "lease ping");
    absl::StatusOr<bool> row = q.Step();
    if (row.ok() && *row && q.Int(0) == leader_epoch) NoteConfirmed(sent);
    if (!row.ok()) NoteWrite("lease ping", row.status());
    if (row.ok() && *row && q.Int(0) != leader_epoch) {
      deposed = absl::FailedPreconditionError(absl::StrCat(
          "state store: lease ping: this coordinator (leader epoch ", leader_epoch,
          ") was deposed by epoch ", q.Int(0), " (the active coordinator is at ", q.Text(1),
          "); it writes nothing more"));
    }
    NoteDeposition(row.ok() ? absl::OkStatus() : row.status());
    if (!deposed.ok()) return;
  }
}

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::OpenSpec(const std::string& spec,
                                                                 StoreOptions options,
                                                                 StoreLeader* holder) {
  constexpr absl::string_view kSqlite = "sqlite:";
  if (absl::StartsWith(spec, kSqlite)) return Open(spec.substr(kSqlite.size()), options);
  if (absl::StartsWith(spec, "postgresql://") || absl::StartsWith(spec, "postgres://")) {
    TRAINCTL_ASSIGN_OR_RETURN(std::string display, store_internal::PostgresDisplayName(spec));
    auto impl = std::make_unique<Impl>(display, options);
    {
      absl::MutexLock lock(&impl->mu);
      TRAINCTL_RETURN_IF_ERROR(impl->OpenPostgresLocked(spec, holder));
    }
    if (options.leader_lease > absl::ZeroDuration()) {
      impl->leased = true;
      impl->pinger = std::thread([p = impl.get()] { p->PingLoop(); });
    }
    return std::unique_ptr<StateStore>(new StateStore(std::move(impl)));
  }
  return absl::InvalidArgumentError(
      "state store: the store is 'sqlite:PATH' or a PostgreSQL connection URI "
      "('postgresql://USER@HOST:PORT/DB?sslmode=...'); the given one is neither");
}

std::string StateStore::DescribeSpec(const std::string& spec) {
  constexpr absl::string_view kSqlite = "sqlite:";
  if (absl::StartsWith(spec, kSqlite)) return spec.substr(kSqlite.size());
  if (absl::StartsWith(spec, "postgresql://") || absl::StartsWith(spec, "postgres://")) {
    absl::StatusOr<std::string> display = store_internal::PostgresDisplayName(spec);
    return display.ok() ? *display : "postgresql://(connection string does not parse)";
  }
  return "(not a store)";
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

const LatencyHistogram& StateStore::commit_latency() const { return impl_->commit_latency; }

int64_t StateStore::leader_epoch() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->leader_epoch;
}

bool StateStore::lease_confirmed() const {
  if (!impl_->leased) return true;
  const absl::Time confirmed = absl::FromUnixNanos(impl_->confirmed_ns.load(std::memory_order_relaxed));
  return MonotonicNow() - confirmed < impl_->options.leader_lease;
}

absl::Status StateStore::deposed() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->deposed;
}

StateStore::WriteHealth StateStore::write_health() const {
  absl::MutexLock lock(&impl_->health_mu);
  return impl_->health;
}

void StateStore::Impl::NoteWrite(absl::string_view op, const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
      return;  // the caller's mistake, not the store's
    default:
      break;
  }
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&health_mu);
  if (s.ok()) {
    if (!health.failing) return;
    LogEvent(LogLevel::kInfo, "coordinator", "store_recovered",
             {{"op", std::string(op)}, {"failed_writes", absl::StrCat(failed_in_run)},
              {"lasted", absl::FormatDuration(absl::Trunc(now - health.failing_since, absl::Milliseconds(1)))}});
    health.failing = false;
    health.failing_since = absl::InfinitePast();
    failed_in_run = 0;
    failed_since_log = 0;
    return;
  }
  ++health.failed_writes;
  ++failed_in_run;
  ++failed_since_log;
  health.last_error = std::string(s.message());
  if (!health.failing) {
    health.failing = true;
    health.failing_since = now;
    health_logged = now;
    failed_since_log = 0;
    LogEvent(LogLevel::kError, "coordinator", "store_failing",
             {{"op", std::string(op)}, {"error", health.last_error},
              {"then", "workers stay connected and their telemetry waits unacknowledged; job changes are "
                       "retried; logged again every 30 s while it lasts"}});
    return;
  }
  if (now - health_logged >= absl::Seconds(30)) {
    LogEvent(LogLevel::kWarn, "coordinator", "store_still_failing",
             {{"failed_writes", absl::StrCat(failed_since_log)},
              {"for", absl::FormatDuration(absl::Trunc(now - health.failing_since, absl::Seconds(1)))},
              {"error", health.last_error}});
    health_logged = now;
    failed_since_log = 0;
  }
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
  if (!s.deposed.ok()) return s.deposed;
  absl::Status begun = Query(s.db, s.stmts->begin, "BeginGroup: begin").Run();
  // The epoch is checked once for the whole group: its row lock is held
  // to the group's commit.
  if (begun.ok() && s.fenced()) begun = s.CheckEpoch("BeginGroup");
  if (!begun.ok()) {
    if (s.db->InTransaction()) Query(s.db, s.stmts->rollback, "BeginGroup: rollback").Run().IgnoreError();
    // A group is opened to write: a BEGIN that fails (a lost server) is a
    // failing store (store_failing), as a failed commit is.
    s.NoteWrite("BeginGroup", begun);
    s.NoteDeposition(begun);
    return begun;
  }
  if (s.db->ConnectionEpoch() != s.connection_epoch) {
    // BEGIN reconnected (PostgreSQL): the group's appends must not trust
    // counts cached on the lost connection (as InTransaction).
    s.ClearCachedCounts();
    s.connection_epoch = s.db->ConnectionEpoch();
  }
  s.in_group = true;
  s.group_changes = s.db->TotalChanges();
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
  bool wrote = false;
  // The group's queued telemetry rows first (a failure rolls it back).
  if (s.db->InTransaction()) status = s.FlushPending(op);
  if (!status.ok()) {
    // (FlushPending rolled the group back.)
  } else if (!s.db->InTransaction()) {
    status = absl::UnavailableError(absl::StrCat("state store: ", op, ": the transaction was rolled back"));
  } else if (s.db->TotalChanges() != s.group_changes) {
    // Only a group that wrote something records its seqs: one that changed
    // nothing costs no disk write (see the header).
    wrote = true;
    // Each worker once, with its highest seq, in first-seen order.
    std::vector<std::pair<std::string, int64_t>> seqs;
    absl::flat_hash_map<std::string, size_t> index;
    for (const auto& [worker_id, seq] : telemetry_seqs) {
      auto [it, fresh] = index.try_emplace(worker_id, seqs.size());
      if (fresh) seqs.emplace_back(worker_id, seq);
      seqs[it->second].second = std::max(seqs[it->second].second, seq);
    }
    status = s.WriteChunked(s.stmts->put_telemetry_seqs, seqs.size(), 2, op,
                            [&seqs](Query& q, int first, size_t i) {
                              q.Bind(first, seqs[i].first).Bind(first + 1, seqs[i].second);
                            });
  }
  // The test's write fault may fail the commit itself (a disk that fills
  // at COMMIT): everything of the group is then rolled back below.
  if (status.ok() && wrote) status = s.InjectedFault(op);
  if (status.ok()) {
    const absl::Time start = absl::Now();
    status = Query(s.db, s.stmts->commit, absl::StrCat(op, ": commit")).Run();
    s.ObserveCommit(op, absl::Now() - start);
  }
  if (wrote || !status.ok()) s.NoteWrite(op, status);
  if (status.ok()) {
    s.in_group = false;
    return status;
  }
  s.RollbackGroupLocked();
  s.NoteDeposition(status);
  return status;
}

void StateStore::RollbackGroup() {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  if (s.in_group) s.RollbackGroupLocked();
}

void StateStore::Impl::RollbackGroupLocked() {
  if (db->InTransaction()) Query(db, stmts->rollback, "RollbackGroup").Run().IgnoreError();
  in_group = false;
  ClearPending();
  // Row counts cached by the group's appends may count rows that are gone.
  ClearCachedCounts();
}

}  // namespace trainctl::coordinator

