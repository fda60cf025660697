// The store's private core, owned by StateStore and shared by the table
// classes it hands out (jobs_table.h, telemetry_tables.h, workers_table.h,
// auth_tables.h, queue_tables.h, usage_table.h, code_archives_table.h):
// the one connection, its prepared statements, the lock, the leader epoch
// that fences every write, the cached row counts for retention, and the
// transaction helpers. Implemented by state_store.cc (open, schema,
// snapshot, groups), leadership.cc, statements.cc and telemetry_tables.cc
// (the queued telemetry rows). Not part of the store's API.
//
// Threading: every field below `mu` is guarded by it; every method is
// called with it held. Every table method takes `mu` for its whole call, so
// the tables are as thread-safe as one StateStore was.
#pragma once

#include <array>
#include <atomic>
#include <functional>
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
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/store/sql_db.h"
#include "coordinator/store/state_store.h"

struct sqlite3;

namespace trainctl::coordinator {
namespace store_internal {

struct StoreCore {
  using Statement = store_internal::Statement;
  using Query = store_internal::Query;
  using LogKey = std::tuple<std::string, int32_t, int32_t>;  // (job, attempt, rank)

  StoreCore(std::string path, StoreOptions options) : path(std::move(path)), options(options) {}
  ~StoreCore() {
    stop_ping.Notify();
    if (pinger.joinable()) pinger.join();
    absl::MutexLock lock(&mu);
    stmts.reset();
    // SQLite: checkpoints the WAL into the database and removes it.
    db = nullptr;
    conn.reset();
  }

  // SQLite: opens the file at `path`.
  absl::Status OpenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // PostgreSQL: connects with `conninfo` (`path` names it without secrets).
  // `holder`: see StateStore::OpenSpec.
  absl::Status OpenPostgresLocked(const std::string& conninfo, StoreLeader* holder)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status Exec(const char* sql, absl::string_view op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status Migrate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Refuses a file that is not a trainctl database of a version this binary
  // knows (the pragmas' values); OK otherwise.
  absl::Status IdentityError(int64_t app_id, int64_t version, int64_t objects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status CheckExistingFile(sqlite3* raw) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Downsamples the job's oldest `oldest` metric rows in place (see
  // StoreOptions); returns how many rows it deleted.
  absl::StatusOr<int64_t> DownsampleMetrics(const std::string& job_id, int64_t oldest,
                                            absl::string_view op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status PrepareStatements() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // --- leader epoch (PostgreSQL; see StoreOptions) ---------------------------
  // Increments the stored epoch, records options.leader_address; sets
  // leader_epoch.
  absl::Status TakeLeadership() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Inside a write transaction: FailedPrecondition (and `deposed` set) when
  // the stored epoch is not leader_epoch. Locks the leader row to the commit.
  absl::Status CheckEpoch(absl::string_view op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // After a failed operation: a connection that lost its lock deposes the
  // store; then, once, on_deposed.
  void NoteDeposition(const absl::Status& failed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  bool fenced() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return db->backend() == store_internal::SqlBackend::kPostgres && leader_epoch > 0;
  }
  // The lease ping's thread body (PostgreSQL with a lease).
  void PingLoop();
  // The server answered a statement of this session sent at `sent`
  // (monotonic) that proved the leader epoch still this store's: the
  // session, and so the lock, is held until at least sent + leader_lease.
  void NoteConfirmed(absl::Time sent) {
    const int64_t ns = absl::ToUnixNanos(sent);
    int64_t seen = confirmed_ns.load(std::memory_order_relaxed);
    while (ns > seen && !confirmed_ns.compare_exchange_weak(seen, ns, std::memory_order_relaxed)) {
    }
  }
  // Monotonic nanoseconds of the newest NoteConfirmed (lock-free: health
  // checks and the loop read it while a write holds `mu`); `leased`: a
  // PostgreSQL store with a lease, the only kind that can lose its lock
  // without knowing.
  std::atomic<int64_t> confirmed_ns{0};
  bool leased = false;
  // StateStore::BeginGroup / CommitGroup / RollbackGroup with `mu` held
  // (TelemetryTables::AppendGroup runs a whole group under one hold).
  absl::Status BeginGroupLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status CommitGroupLocked(const std::vector<std::pair<std::string, int64_t>>& telemetry_seqs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void RollbackGroupLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Runs `body` inside BEGIN IMMEDIATE (SQLite) or BEGIN ... COMMIT; rolls back when it or the
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
  // database's only lock (SQLite: locking_mode=EXCLUSIVE; PostgreSQL: the
  // store's advisory lock), so nothing else changes the tables. Call before inserting.
  template <typename Key, typename BindKey>
  absl::StatusOr<int64_t> RowsBefore(const absl::flat_hash_map<Key, int64_t>& cache, const Key& key,
                                     const Statement& count, absl::string_view op, BindKey bind)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    Query q(db, count, absl::StrCat(op, ": count rows"));
    bind(q);
    TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
    return row ? q.Int(0) : 0;
  }

  // A table whose rows under one key are kept to a bound: the cached count
  // of its rows under `key`, the statements that count them and trim the
  // oldest (trim binds the key, then how many rows to delete), and how the
  // key is bound (`key_params` parameters).
  template <typename Key>
  struct Retained {
    absl::flat_hash_map<Key, int64_t>* counts;
    Key key;
    const Statement* count;
    const Statement* trim;
    int key_params;
    std::function<void(Query&)> bind_key;
    int64_t max_rows;  // <= 0: unbounded
  };

  // One append of `added` rows under a bound, in one transaction: counts the
  // rows already there (RowsBefore), runs `insert`, and when the count is
  // over the bound lets `reduce(count)` remove rows its own way (it returns
  // how many it removed), then trims the oldest overflow. The cached count
  // follows the commit; a failed transaction drops it (reloaded next time).
  template <typename Key, typename Insert, typename Reduce>
  absl::Status AppendRetained(absl::string_view op, const Retained<Key>& table, int64_t added,
                              Insert insert, Reduce reduce) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  template <typename Key, typename Insert>
  absl::Status AppendRetained(absl::string_view op, const Retained<Key>& table, int64_t added,
                              Insert insert) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return AppendRetained(op, table, added, insert,
                          [](int64_t) -> absl::StatusOr<int64_t> { return 0; });
  }

  // --- telemetry rows written in bulk -------------------------------------
  // Multi-row statements come prepared for kChunkRows rows (largest first);
  // n rows take the largest chunks that fit, so any n costs at most
  // n / kChunkRows[0] + kChunkRows.size() - 1 statements. On PostgreSQL each
  // statement is a network round trip on the coordinator's loop: one per
  // row was what made a telemetry group fall behind (issue #29).
  static constexpr std::array<int, 7> kChunkRows = {64, 32, 16, 8, 4, 2, 1};
  using ChunkedStatement = std::array<Statement, kChunkRows.size()>;
  // Prepares `out` from `head` VALUES (?, ...) x rows `tail`, with
  // `params_per_row` parameters per row numbered ?1, ?2, ... across rows.
  absl::Status PrepareChunked(ChunkedStatement& out, absl::string_view head, int params_per_row,
                              absl::string_view tail, absl::string_view op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Runs `chunked` over rows [0, n): bind_row(q, first_param, i) binds row i's
  // parameters from first_param on. Rows go in order: ids follow it.
  template <typename BindRow>
  absl::Status WriteChunked(const ChunkedStatement& chunked, size_t n, int params_per_row,
                            absl::string_view op, BindRow bind_row)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    size_t done = 0;
    for (size_t c = 0; c < kChunkRows.size() && done < n; ++c) {
      const size_t rows = static_cast<size_t>(kChunkRows[c]);
      while (n - done >= rows) {
        Query q(db, chunked[c], op);
        for (size_t i = 0; i < rows; ++i)
          bind_row(q, static_cast<int>(i) * params_per_row + 1, done + i);
        TRAINCTL_RETURN_IF_ERROR(q.Run());
        done += rows;
      }
    }
    return absl::OkStatus();
  }

  // A metric point or log line waiting to be written (see PendingTable).
  struct PendingRow {
    std::string job_id;
    int32_t attempt = 0;
    int32_t rank = 0;
    std::string blob;
  };
  // Rows a group appended to one telemetry table that are not in the
  // database yet, and the retention those appends owe (rows to delete, the
  // oldest, per key, once `rows` are in). FlushPending writes both; until
  // then the group's appends cost no statement at all. Invariant: a key with
  // pending rows has a cached count (RowsBefore does not see pending rows).
  // Empty outside a group.
  template <typename Key>
  struct PendingTable {
    std::vector<PendingRow> rows;
    std::vector<std::pair<Key, int64_t>> trims;   // first-seen order
    absl::flat_hash_map<Key, size_t> trim_index;  // key -> position in `trims`
    bool empty() const { return rows.empty() && trims.empty(); }
    void Trim(const Key& key, int64_t n) {
      auto [it, fresh] = trim_index.try_emplace(key, trims.size());
      if (fresh) trims.emplace_back(key, 0);
      trims[it->second].second += n;
    }
    void Clear() {
      rows.clear();
      trims.clear();
      trim_index.clear();
    }
  };
  // Writes every pending row (multi-row INSERTs, in append order) and then
  // the deferred trims. Inside a group a failure rolls the whole group back
  // (the rows of messages already counted as applied are lost with it, so
  // nothing of the group may commit): the owner's CommitGroup then fails.
  absl::Status FlushPending(absl::string_view op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void ClearPending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    pending_metrics.Clear();
    pending_logs.Clear();
  }
  // TelemetryTables::AppendMetrics / AppendLogs of a non-empty batch or
  // chunk with a job id, `mu` held; `rows` are its serialized rows.
  absl::Status AppendMetricsLocked(const v1::MetricBatch& batch, std::vector<PendingRow> rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status AppendLogsLocked(const v1::LogChunk& chunk, std::vector<PendingRow> rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Appends `rows` to a telemetry table under its bound. Inside a group the
  // rows (and their trim) are only queued (PendingTable) -- unless the
  // append crosses the bound of a table that reduces its rows its own way
  // (`reduces`: metrics' downsampling reads them), which flushes and runs
  // the append as AppendRetained does. Outside a group: AppendRetained, the
  // rows written in chunks.
  template <typename Key, typename Reduce>
  absl::Status AppendTelemetry(absl::string_view op, const Retained<Key>& table,
                               PendingTable<Key>& pending, std::vector<PendingRow> rows,
                               bool reduces, Reduce reduce) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // SQLite: the file; PostgreSQL: the server and database, without secrets.
  const std::string path;
  const StoreOptions options;

  absl::Mutex mu;
  std::unique_ptr<store_internal::SqlDb> conn ABSL_GUARDED_BY(mu);
  store_internal::SqlDb* db ABSL_GUARDED_BY(mu) = nullptr;  // conn.get()
  // True when Open found no file at `path` (or it is ":memory:"): only then
  // may Migrate turn an empty database into a new trainctl one.
  bool created ABSL_GUARDED_BY(mu) = false;
  StateStore::WriteFault write_fault ABSL_GUARDED_BY(mu);
  // PostgreSQL: the epoch taken at open (0: SQLite, or not taken yet: no
  // fencing). Never changes afterwards.
  int64_t leader_epoch ABSL_GUARDED_BY(mu) = 0;
  // OK until the store is deposed; then why, for good (every write fails
  // with it). deposed_told: on_deposed was called.
  absl::Status deposed ABSL_GUARDED_BY(mu);
  bool deposed_told ABSL_GUARDED_BY(mu) = false;
  // The lease ping (PingLoop), stopped first by ~StoreCore.
  absl::Notification stop_ping;
  std::thread pinger;
  int64_t writes_since_fault ABSL_GUARDED_BY(mu) = 0;

  struct Statements {
    Statement begin, commit, rollback;
    Statement savepoint, release, rollback_to;
    Statement load_telemetry_seqs;
    ChunkedStatement put_telemetry_seqs;  // (worker_id, seq) per row
    Statement upsert_job, insert_event, put_worker, delete_worker;
    Statement put_token, load_tokens, put_binding, load_bindings;
    Statement put_revoked_worker, load_revoked_workers;
    Statement put_owner_number, load_owner_numbers;
    Statement put_queue, delete_queue, load_queues;
    Statement put_fair_share, load_fair_share;
    Statement put_attempt_usage, load_attempt_usage;
    Statement put_code, code_size, touch_code, read_code, delete_unreferenced_code;
    ChunkedStatement insert_metrics, insert_logs;  // (job_id, attempt, rank, blob) per row
    Statement count_events, count_metrics, count_logs;
    Statement trim_events, trim_metrics, trim_logs;
    Statement load_jobs, max_event_seq, load_workers;
    Statement list_events, list_metrics, log_ranks, list_logs_rank;
    Statement oldest_metrics, delete_metric, page_metrics;
    Statement take_leadership, check_epoch, read_epoch;
  };
  std::unique_ptr<Statements> stmts ABSL_GUARDED_BY(mu);

  // Cached row counts (see RowsBefore); an entry is dropped when a
  // transaction that touched it fails, and reloaded on next use.
  absl::flat_hash_map<std::string, int64_t> event_counts ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, int64_t> metric_counts ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<LogKey, int64_t> log_counts ABSL_GUARDED_BY(mu);
  PendingTable<std::string> pending_metrics ABSL_GUARDED_BY(mu);  // by job id
  PendingTable<LogKey> pending_logs ABSL_GUARDED_BY(mu);
  int64_t connection_epoch ABSL_GUARDED_BY(mu) = 0;
  void ClearCachedCounts() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    event_counts.clear();
    metric_counts.clear();
    log_counts.clear();
  }

  // An open group transaction (BeginGroup .. CommitGroup/RollbackGroup), and
  // SqlDb::TotalChanges when it began (to tell whether it wrote anything).
  bool in_group ABSL_GUARDED_BY(mu) = false;
  // Every COMMIT's duration (atomics: read without the lock).
  LatencyHistogram commit_latency;
  void ObserveCommit(absl::string_view op, absl::Duration took) {
    commit_latency.Observe(took);
    if (options.slow_commit_ms > 0 && took > absl::Milliseconds(options.slow_commit_ms)) {
      LogEvent(LogLevel::kWarn, "coordinator", "slow_commit",
               {{"op", std::string(op)},
                {"took", absl::FormatDuration(took)},
                {"threshold", absl::StrCat(options.slow_commit_ms, "ms")}});
    }
  }
  int64_t group_changes ABSL_GUARDED_BY(mu) = 0;

  // Write health (StateStore::write_health). Its own lock: /metrics and
  // ListWorkers read it while a write may hold `mu`.
  mutable absl::Mutex health_mu;
  StateStore::WriteHealth health ABSL_GUARDED_BY(health_mu);
  absl::Time health_logged ABSL_GUARDED_BY(health_mu);
  int64_t failed_in_run ABSL_GUARDED_BY(health_mu) = 0;  // this run of failures
  int64_t failed_since_log ABSL_GUARDED_BY(health_mu) = 0;
  // A write's outcome: OK for a commit that wrote, else its error (errors
  // that say the caller was wrong, not the store, do not count).
  void NoteWrite(absl::string_view op, const absl::Status& s);
};

// Clang's analysis cannot tell that a body's `s.mu` is this `mu` (callers
// still must hold it: see the declaration), hence no analysis inside.
template <typename Body>
absl::Status StoreCore::InTransaction(absl::string_view op, Body body,
                                      bool write) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (write && !deposed.ok()) return deposed;
  if (in_group) {
    // (BeginGroup checked the epoch, with the row lock held to the commit.)
    if (!db->InTransaction()) {
      // The backend rolled the group back after an error (or lost it): nothing may be written
      // outside it until the owner ends it.
      return absl::UnavailableError(
          absl::StrCat("state store: ", op, ": the enclosing transaction was rolled back"));
    }
    TRAINCTL_RETURN_IF_ERROR(Query(db, stmts->savepoint, absl::StrCat(op, ": savepoint")).Run());
    absl::Status status = body();
    if (status.ok() && write) status = InjectedFault(op);
    if (!status.ok() && write) NoteWrite(op, status);
    if (!status.ok() && db->InTransaction()) {
      Query(db, stmts->rollback_to, absl::StrCat(op, ": rollback to savepoint"))
          .Run()
          .IgnoreError();
    }
    if (db->InTransaction()) {
      absl::Status released = Query(db, stmts->release, absl::StrCat(op, ": release")).Run();
      if (status.ok()) status = released;
    }
    if (!status.ok()) NoteDeposition(status);
    return status;
  }
  if (db->ConnectionEpoch() != connection_epoch) {
    // A new connection (PostgreSQL): the cached counts may be stale.
    ClearCachedCounts();
    connection_epoch = db->ConnectionEpoch();
  }
  absl::Status status = Query(db, stmts->begin, absl::StrCat(op, ": begin")).Run();
  if (!status.ok()) {
    // A write whose BEGIN fails (a lost server) failed as much as one whose
    // commit does: the store is failing (store_failing).
    if (write) NoteWrite(op, status);
    NoteDeposition(status);
    return status;
  }
  if (write && fenced()) status = CheckEpoch(op);
  if (status.ok()) status = body();
  if (status.ok() && write) status = InjectedFault(op);
  if (status.ok()) {
    const absl::Time start = absl::Now();
    status = Query(db, stmts->commit, absl::StrCat(op, ": commit")).Run();
    ObserveCommit(op, absl::Now() - start);
    if (write) NoteWrite(op, status);
    if (status.ok()) return status;
  } else if (write) {
    NoteWrite(op, status);
  }
  // After some errors the backend has already rolled back; then there is no
  // transaction to end and ROLLBACK's own error says nothing new.
  if (db->InTransaction()) {
    Query(db, stmts->rollback, absl::StrCat(op, ": rollback")).Run().IgnoreError();
  }
  NoteDeposition(status);
  return status;
}

// As InTransaction: the analysis cannot follow `mu` into the body.
template <typename Key, typename Insert, typename Reduce>
absl::Status StoreCore::AppendRetained(absl::string_view op, const Retained<Key>& table,
                                       int64_t added, Insert insert,
                                       Reduce reduce) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const bool bounded = table.max_rows > 0 && added > 0;
  std::optional<int64_t> new_count;
  // (The body calls `insert` and `reduce`, which their callers annotate with
  // their own name for `mu`: the analysis is off here too.)
  absl::Status status = InTransaction(op, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::Status {
    int64_t count = 0;
    if (bounded) {
      TRAINCTL_ASSIGN_OR_RETURN(
          count, RowsBefore(*table.counts, table.key, *table.count, op, table.bind_key));
    }
    TRAINCTL_RETURN_IF_ERROR(insert());
    if (!bounded) return absl::OkStatus();
    count += added;
    if (count > table.max_rows) {
      TRAINCTL_ASSIGN_OR_RETURN(int64_t removed, reduce(count));
      count -= removed;
    }
    if (count > table.max_rows) {
      Query trim(db, *table.trim, absl::StrCat(op, ": retention"));
      table.bind_key(trim);
      TRAINCTL_RETURN_IF_ERROR(trim.Bind(table.key_params + 1, count - table.max_rows).Run());
      count = table.max_rows;
    }
    new_count = count;
    return absl::OkStatus();
  });
  if (status.ok() && new_count.has_value()) {
    (*table.counts)[table.key] = *new_count;
  } else if (!status.ok()) {
    table.counts->erase(table.key);
  }
  return status;
}

// As AppendRetained: the analysis cannot follow `mu` into the callbacks.
template <typename Key, typename Reduce>
absl::Status StoreCore::AppendTelemetry(absl::string_view op, const Retained<Key>& table,
                                        PendingTable<Key>& pending, std::vector<PendingRow> rows,
                                        bool reduces,
                                        Reduce reduce) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const int64_t added = static_cast<int64_t>(rows.size());
  const bool bounded = table.max_rows > 0 && added > 0;
  if (in_group) {
    if (!deposed.ok()) return deposed;
    if (!db->InTransaction()) {
      return absl::UnavailableError(
          absl::StrCat("state store: ", op, ": the enclosing transaction was rolled back"));
    }
    int64_t count = 0;
    if (bounded) {
      absl::StatusOr<int64_t> before =
          RowsBefore(*table.counts, table.key, *table.count, op, table.bind_key);
      if (!before.ok()) {
        NoteWrite(op, before.status());
        NoteDeposition(before.status());
        return before.status();
      }
      count = *before;
    }
    if (!(reduces && bounded && count + added > table.max_rows)) {
      // Queued: all or nothing, like the savepoint it replaces, by undoing
      // the queue (nothing of it reached the database).
      if (absl::Status fault = InjectedFault(op); !fault.ok()) {
        NoteWrite(op, fault);
        return fault;
      }
      for (PendingRow& row : rows) pending.rows.push_back(std::move(row));
      if (bounded) {
        count += added;
        if (count > table.max_rows) {
          pending.Trim(table.key, count - table.max_rows);
          count = table.max_rows;
        }
        (*table.counts)[table.key] = count;
      }
      return absl::OkStatus();
    }
    // Over the bound of a table that reads its rows to reduce them: the
    // group's queue goes first, then this append as below (a savepoint).
    if (absl::Status flushed = FlushPending(op); !flushed.ok()) {
      NoteWrite(op, flushed);
      NoteDeposition(flushed);
      return flushed;
    }
  }
  return AppendRetained(
      op, table, added,
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::Status {
        for (PendingRow& row : rows) pending.rows.push_back(std::move(row));
        return FlushPending(op);
      },
      reduce);
}

}  // namespace store_internal

// The store's files name it without the namespace.
using store_internal::StoreCore;

}  // namespace trainctl::coordinator
