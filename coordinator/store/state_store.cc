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
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status_macros.h"

#include "absl/strings/match.h"
#include "coordinator/store/pg_db.h"
#include "coordinator/store/schema.h"
#include "coordinator/store/sqlite_db.h"
#include "coordinator/store/state_store_impl.h"

namespace trainctl::coordinator {

using store_internal::ParseBlob;
using store_internal::Query;
using store_internal::SqliteDb;
using store_internal::SqliteStatus;
using store_internal::Statement;

namespace {

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

// A database whose pages do not read back: refused, said so, left as it was.
absl::Status DamagedError(absl::string_view path, absl::string_view why) {
  return absl::DataLossError(absl::StrCat("state store: open ", path, ": the database is damaged (",
                                          why,
                                          "); refusing to start on it (the file is left as it "
                                          "was): restore a backup (docs/operator.md), or "
                                          "move it aside to start a new cluster"));
}

}  // namespace

absl::Status StoreCore::Exec(const char* sql, absl::string_view op) { return db->Exec(sql, op); }

absl::Status StoreCore::OpenLocked() {
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
  int rc =
      sqlite3_open_v2(path.c_str(), &raw,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
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

absl::Status StoreCore::IdentityError(int64_t app_id, int64_t version, int64_t objects) {
  const bool blank = app_id == 0 && version == 0 && objects == 0;
  if (blank && !created) {
    return EmptyFileError(path);
  }
  if (app_id != store_internal::kApplicationId && !blank) {
    // Another program's database (or an older file without the marker).
    return absl::FailedPreconditionError(absl::StrCat(
        "state store: open ", path, ": not a trainctl database (application_id ", app_id,
        ", user_version ", version, ", ", objects, " schema objects); refusing to modify it"));
  }
  if (version > store_internal::SchemaVersion()) {
    return absl::FailedPreconditionError(
        absl::StrCat("state store: open ", path, ": schema version ", version,
                     " is newer than this binary knows (", store_internal::SchemaVersion(),
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
absl::Status StoreCore::CheckExistingFile(sqlite3* raw) {
  absl::StatusOr<store_internal::DbIdentity> id = db->ReadIdentity(absl::StrCat("open ", path));
  // A damaged page under the schema itself fails the first read, before
  // quick_check could say so (SQLITE_CORRUPT: DataLoss).
  if (absl::IsDataLoss(id.status())) return DamagedError(path, id.status().message());
  if (!id.ok()) return id.status();
  TRAINCTL_RETURN_IF_ERROR(IdentityError(id->app_id, id->version, id->objects));
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
      return SqliteStatus(
          raw, rc, absl::StrCat("open ", path, ": quick_check prepare \"PRAGMA quick_check(20)\""));
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
    return DamagedError(path, absl::StrCat("PRAGMA quick_check: ", absl::StrJoin(problems, "; ")));
  }
  return absl::OkStatus();
}

absl::Status StoreCore::Migrate() {
  const std::string op = absl::StrCat("open ", path, ": migrate schema");
  TRAINCTL_RETURN_IF_ERROR(Exec(db->BeginSql(), op));
  absl::Status status = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) -> absl::Status {
    TRAINCTL_ASSIGN_OR_RETURN(store_internal::DbIdentity id,
                              db->ReadIdentity(absl::StrCat("open ", path)));
    TRAINCTL_RETURN_IF_ERROR(IdentityError(id.app_id, id.version, id.objects));
    for (int64_t v = id.version; v < store_internal::SchemaVersion(); ++v) {
      TRAINCTL_RETURN_IF_ERROR(
          db->Exec(db->SchemaSql(store_internal::MigrationSql(static_cast<int>(v))),
                   absl::StrCat(op, " from version ", v, " to ", v + 1)));
    }
    if (id.version != store_internal::SchemaVersion()) {
      TRAINCTL_RETURN_IF_ERROR(
          db->WriteIdentity(store_internal::kApplicationId, store_internal::SchemaVersion(), op));
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

// ---------------------------------------------------------------------------

StateStore::StateStore(std::unique_ptr<StoreCore> core)
    : core_(std::move(core)),
      jobs_(*core_),
      telemetry_(*core_),
      workers_(*core_),
      auth_(*core_),
      queues_(*core_),
      usage_(*core_),
      code_archives_(*core_) {}
StateStore::~StateStore() = default;

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const std::string& path,
                                                             StoreOptions options) {
  if (path.empty()) {
    return absl::InvalidArgumentError("state store: empty database path (use \":memory:\")");
  }
  auto impl = std::make_unique<StoreCore>(path, options);
  {
    absl::MutexLock lock(&impl->mu);
    TRAINCTL_RETURN_IF_ERROR(impl->OpenLocked());
  }
  return std::unique_ptr<StateStore>(new StateStore(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::OpenSpec(const std::string& spec,
                                                                 StoreOptions options,
                                                                 StoreLeader* holder) {
  constexpr absl::string_view kSqlite = "sqlite:";
  if (absl::StartsWith(spec, kSqlite)) return Open(spec.substr(kSqlite.size()), options);
  if (absl::StartsWith(spec, "postgresql://") || absl::StartsWith(spec, "postgres://")) {
    TRAINCTL_ASSIGN_OR_RETURN(std::string display, store_internal::PostgresDisplayName(spec));
    auto impl = std::make_unique<StoreCore>(display, options);
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
  StoreCore& s = *core_;
  absl::MutexLock lock(&s.mu);
  StoreSnapshot snapshot;
  // One read transaction, so the snapshot is consistent even if a future
  // version reads with several statements while another connection writes.
  // It reads several tables (jobs, events, workers, telemetry seqs), which
  // is why it is the store's and not one table class's.
  absl::Status status = s.InTransaction(
      "LoadAll",
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
        {
          Query q(s.db, s.stmts->load_jobs, "LoadAll: read jobs");
          while (true) {
            TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
            if (!row) break;
            std::string id = q.Text(0);
            v1::Job job;
            TRAINCTL_RETURN_IF_ERROR(
                ParseBlob(q.Blob(2), &job, absl::StrCat("jobs row '", id, "'")));
            if (job.id() != id) {
              return absl::DataLossError(
                  absl::StrCat("state store: jobs row '", id, "' holds job '", job.id(), "'"));
            }
            snapshot.jobs.push_back(std::move(job));
            snapshot.submit_seqs.push_back(q.Int(1));
          }
        }
        for (const v1::Job& job : snapshot.jobs) {
          Query q(s.db, s.stmts->max_event_seq,
                  absl::StrCat("LoadAll: last event of '", job.id(), "'"));
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
      },
      /*write=*/false);
  if (!status.ok()) return status;
  return snapshot;
}

const LatencyHistogram& StateStore::commit_latency() const { return core_->commit_latency; }

int64_t StateStore::leader_epoch() const {
  absl::MutexLock lock(&core_->mu);
  return core_->leader_epoch;
}

bool StateStore::lease_confirmed() const {
  if (!core_->leased) return true;
  const absl::Time confirmed =
      absl::FromUnixNanos(core_->confirmed_ns.load(std::memory_order_relaxed));
  return MonotonicNow() - confirmed < core_->options.leader_lease;
}

absl::Status StateStore::deposed() const {
  absl::MutexLock lock(&core_->mu);
  return core_->deposed;
}

StateStore::WriteHealth StateStore::write_health() const {
  absl::MutexLock lock(&core_->health_mu);
  return core_->health;
}

void StoreCore::NoteWrite(absl::string_view op, const absl::Status& s) {
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
             {{"op", std::string(op)},
              {"failed_writes", absl::StrCat(failed_in_run)},
              {"lasted", absl::FormatDuration(
                             absl::Trunc(now - health.failing_since, absl::Milliseconds(1)))}});
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
             {{"op", std::string(op)},
              {"error", health.last_error},
              {"then",
               "workers stay connected and their telemetry waits unacknowledged; job changes are "
               "retried; logged again every 30 s while it lasts"}});
    return;
  }
  if (now - health_logged >= absl::Seconds(30)) {
    LogEvent(
        LogLevel::kWarn, "coordinator", "store_still_failing",
        {{"failed_writes", absl::StrCat(failed_since_log)},
         {"for", absl::FormatDuration(absl::Trunc(now - health.failing_since, absl::Seconds(1)))},
         {"error", health.last_error}});
    health_logged = now;
    failed_since_log = 0;
  }
}

void StateStore::SetWriteFaultForTest(WriteFault fail) {
  StoreCore& s = *core_;
  absl::MutexLock lock(&s.mu);
  s.write_fault = std::move(fail);
  s.writes_since_fault = 0;
}

absl::Status StateStore::BeginGroup() {
  StoreCore& s = *core_;
  absl::MutexLock lock(&s.mu);
  return s.BeginGroupLocked();
}

absl::Status StoreCore::BeginGroupLocked() {
  if (in_group)
    return absl::FailedPreconditionError("state store: BeginGroup: a group is already open");
  if (!deposed.ok()) return deposed;
  absl::Status begun = Query(db, stmts->begin, "BeginGroup: begin").Run();
  // The epoch is checked once for the whole group: its row lock is held
  // to the group's commit.
  if (begun.ok() && fenced()) begun = CheckEpoch("BeginGroup");
  if (!begun.ok()) {
    if (db->InTransaction()) Query(db, stmts->rollback, "BeginGroup: rollback").Run().IgnoreError();
    // A group is opened to write: a BEGIN that fails (a lost server) is a
    // failing store (store_failing), as a failed commit is.
    NoteWrite("BeginGroup", begun);
    NoteDeposition(begun);
    return begun;
  }
  if (db->ConnectionEpoch() != connection_epoch) {
    // BEGIN reconnected (PostgreSQL): the group's appends must not trust
    // counts cached on the lost connection (as InTransaction).
    ClearCachedCounts();
    connection_epoch = db->ConnectionEpoch();
  }
  in_group = true;
  group_changes = db->TotalChanges();
  return absl::OkStatus();
}

absl::Status StateStore::CommitGroup(const std::string& worker_id, int64_t telemetry_seq) {
  return CommitGroup(std::vector<std::pair<std::string, int64_t>>{{worker_id, telemetry_seq}});
}

absl::Status StateStore::CommitGroup(
    const std::vector<std::pair<std::string, int64_t>>& telemetry_seqs) {
  StoreCore& s = *core_;
  absl::MutexLock lock(&s.mu);
  return s.CommitGroupLocked(telemetry_seqs);
}

absl::Status StoreCore::CommitGroupLocked(
    const std::vector<std::pair<std::string, int64_t>>& telemetry_seqs) {
  if (!in_group) return absl::FailedPreconditionError("state store: CommitGroup: no open group");
  const std::string op = telemetry_seqs.size() == 1
                             ? absl::StrCat("CommitGroup('", telemetry_seqs[0].first, "', seq ",
                                            telemetry_seqs[0].second, ")")
                             : absl::StrCat("CommitGroup(", telemetry_seqs.size(), " workers)");
  absl::Status status;
  bool wrote = false;
  // The group's queued telemetry rows first (a failure rolls it back).
  if (db->InTransaction()) status = FlushPending(op);
  if (!status.ok()) {
    // (FlushPending rolled the group back.)
  } else if (!db->InTransaction()) {
    status = absl::UnavailableError(
        absl::StrCat("state store: ", op, ": the transaction was rolled back"));
  } else if (db->TotalChanges() != group_changes) {
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
    status = WriteChunked(stmts->put_telemetry_seqs, seqs.size(), 2, op,
                          [&seqs](Query& q, int first, size_t i) {
                            q.Bind(first, seqs[i].first).Bind(first + 1, seqs[i].second);
                          });
  }
  // The test's write fault may fail the commit itself (a disk that fills
  // at COMMIT): everything of the group is then rolled back below.
  if (status.ok() && wrote) status = InjectedFault(op);
  if (status.ok()) {
    const absl::Time start = absl::Now();
    status = Query(db, stmts->commit, absl::StrCat(op, ": commit")).Run();
    ObserveCommit(op, absl::Now() - start);
  }
  if (wrote || !status.ok()) NoteWrite(op, status);
  if (status.ok()) {
    in_group = false;
    return status;
  }
  RollbackGroupLocked();
  NoteDeposition(status);
  return status;
}

void StateStore::RollbackGroup() {
  StoreCore& s = *core_;
  absl::MutexLock lock(&s.mu);
  if (s.in_group) s.RollbackGroupLocked();
}

void StoreCore::RollbackGroupLocked() {
  if (db->InTransaction()) Query(db, stmts->rollback, "RollbackGroup").Run().IgnoreError();
  in_group = false;
  ClearPending();
  // Row counts cached by the group's appends may count rows that are gone.
  ClearCachedCounts();
}

}  // namespace trainctl::coordinator
