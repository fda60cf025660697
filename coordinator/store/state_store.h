// The coordinator's durable state: jobs (with their attempts and rank
// assignments), events, metrics, log lines and workers, in one SQLite
// database in WAL mode (Open), or in a PostgreSQL database (OpenSpec with a
// postgresql:// URI; the same schema and transactions through libpq, see
// pg_db.h). What follows says SQLite; PostgreSQL's equivalents: durability
// is the server's commit, the lock is a session advisory lock, and its
// errors map the same way (SQLSTATE 23505 AlreadyExists, other 23xxx
// InvalidArgument, 53xxx ResourceExhausted, 08xxx and a lost connection
// Unavailable, XX001/XX002 DataLoss).
//
// Called by the coordinator's managers (JobManager, WorkerRegistry,
// MetricsHub) before they change memory or acknowledge anything: a write
// that returned OK is on disk (synchronous=FULL), so a coordinator killed
// with SIGKILL and restarted with LoadAll() loses nothing it acknowledged.
//
// Each table's methods live in a class of their own, handed out by the
// store: jobs() (jobs and events, jobs_table.h), telemetry() (metrics and
// logs, telemetry_tables.h), workers() (workers_table.h), auth() (tokens,
// worker bindings, revocations, owner numbers: auth_tables.h), queues()
// (queues and fair share, queue_tables.h), usage() (usage_table.h) and
// code_archives() (code_archives_table.h). They all share the store's one
// connection, lock, statement cache and leader fencing; they are references
// into the StateStore and live as long as it does. What spans tables stays
// here: open, schema, the start snapshot (LoadAll: one read transaction over
// jobs, events, workers and telemetry seqs), leadership, write health, the
// test's write fault, and groups (one transaction around writes to several
// tables: telemetry, jobs, usage and the telemetry seqs).
//
// Rows hold serialized trainctl.v1 protos plus the columns needed to query
// them; the schema is versioned with PRAGMA user_version and migrated
// forward on Open.
//
// Thread-safe: every method, the tables' too, takes one internal absl::Mutex
// (one connection).
// One StateStore per database file: the connection holds an exclusive lock
// on the file for its lifetime, so a second Open of the same file (another
// coordinator) fails with Unavailable.
//
// Errors name the operation. Unavailable: the database is locked (retry may
// help); AlreadyExists: an event seq already stored; DataLoss: a stored row
// does not parse, or the file is corrupt; InvalidArgument: an empty id;
// ResourceExhausted: disk full; Internal: other SQLite errors.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/file_env.h"
#include "common/prometheus.h"
#include "coordinator/store/auth_tables.h"
#include "coordinator/store/code_archives_table.h"
#include "coordinator/store/jobs_table.h"
#include "coordinator/store/queue_tables.h"
#include "coordinator/store/telemetry_tables.h"
#include "coordinator/store/usage_table.h"
#include "coordinator/store/workers_table.h"
#include "trainctl/v1/job.pb.h"
#include "trainctl/v1/worker_service.pb.h"

namespace trainctl::coordinator {

struct StoreOptions {
  // Retention, so a long job cannot fill the disk. A bound <= 0 means
  // unbounded. Metric points over the bound are first downsampled: the
  // oldest half of the job's points is cut into buckets of
  // kMetricBucketPoints consecutive train points of one (attempt, rank), and
  // each bucket keeps only its min-loss, max-loss and last point (real
  // points, in arrival order), so a long job keeps the shape of its whole
  // curve, coarser where older; epoch-end (eval) points are never
  // downsampled. Only when that is not enough are the oldest rows deleted.
  // Events and log lines beyond their bounds: the oldest are deleted.
  int64_t max_metric_points_per_job = 100000;
  int64_t max_log_lines_per_rank = 10000;
  int64_t max_events_per_job = 10000;
  // A COMMIT slower than this is logged (WARN slow_commit); <= 0: never.
  int64_t slow_commit_ms = 200;
  // Before anything is written to an existing file, `PRAGMA quick_check`
  // runs for at most this long: damage found refuses the open (the file
  // untouched); a check cut short by the bound is logged and the open goes
  // on. Zero: no check.
  absl::Duration integrity_check_timeout = absl::Seconds(30);
  // The file system's calls behind the check of the database file before
  // SQLite opens it (common/file_env.h): a test's FaultFileEnv fails them.
  // Null: the real ones.
  FileEnv* file_env = nullptr;

  // --- PostgreSQL: active and standby coordinators (docs/operator.md, "High
  // availability"). Each open that takes the store's lock increments the
  // leader epoch in the `leader` table and records `leader_address` there
  // (one statement); every write transaction then checks, inside itself,
  // that the stored epoch is still this store's (a row lock on the leader
  // row held to the commit, so an epoch bump by a new leader waits for it or
  // fails it). A mismatch, or a reconnect that finds the lock held by
  // another session, deposes the store: that write and every later one
  // fail with FailedPrecondition ("... deposed by epoch N"), and
  // `on_deposed` is called once. SQLite ignores all of this.
  //
  // HOST:PORT clients reach this coordinator at (standbys name it).
  std::string leader_address;
  // > 0: the session's lease (pg_db.h): a coordinator whose session stays
  // silent this long (stopped, hung, cut off) loses it and the lock; a
  // thread of the store pings it every lease/4 meanwhile.
  absl::Duration leader_lease = absl::ZeroDuration();
  // Called once when the store finds it was deposed, with the store's lock
  // held (so it must not call the store), on the thread that found it (a
  // writer, or the lease ping's). The coordinator re-executes itself here
  // (coordinator/main.cc): nothing of the deposed process acts further.
  std::function<void(const absl::Status&)> on_deposed;
};

// The leader table's record: who holds the store (PostgreSQL).
struct StoreLeader {
  int64_t epoch = 0;  // 0: none recorded
  std::string address;
};

// Everything needed to rebuild the coordinator's memory at start.
struct StoreSnapshot {
  // Every job with its attempts, in submission order (ascending submit_seq).
  std::vector<v1::Job> jobs;
  // submit_seq of each job in `jobs` (same order): FIFO order for the scheduler.
  std::vector<int64_t> submit_seqs;
  // Every worker ever registered.
  std::vector<v1::Worker> workers;
  // Highest event seq stored per job (0 when none), same order as `jobs`.
  std::vector<int64_t> last_event_seqs;
  // (worker id, highest telemetry seq applied) for every worker that had
  // sequenced telemetry committed (CommitGroup), ascending by id.
  std::vector<std::pair<std::string, int64_t>> telemetry_seqs;
};

class StateStore {
 public:
  // Opens the database at `path`, creating it when the path does not exist
  // yet; ":memory:" for tests. Only a path that does not exist becomes a new
  // database: an existing file that is not a trainctl database -- another
  // program's, garbage, or empty (0 bytes, e.g. left by `touch` or a failed
  // copy) -- is refused with FailedPrecondition naming the path, so a wrong
  // --db never starts an empty cluster silently. Also FailedPrecondition for
  // a newer schema than this binary knows; Unavailable when another
  // StateStore holds the file.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& path,
                                                          StoreOptions options = {});
  // Opens the store `spec` names: "sqlite:PATH" (Open(PATH)) or a PostgreSQL
  // connection URI ("postgresql://..." or "postgres://...", as libpq takes
  // it: TLS, a password file and the PG* environment work as in psql). On
  // PostgreSQL the database must exist; an empty one becomes a new store,
  // one with other tables is refused (FailedPrecondition). The connection
  // holds an advisory lock for its lifetime, so a second store on the same
  // database is Unavailable. Unavailable when the server cannot be reached
  // (the message names host and database, never a password);
  // InvalidArgument for a spec that is neither.
  // When another coordinator holds the lock, `holder` (if given) gets the
  // leader it recorded (StoreLeader; epoch 0 when none is recorded).
  static absl::StatusOr<std::unique_ptr<StateStore>> OpenSpec(const std::string& spec,
                                                              StoreOptions options = {},
                                                              StoreLeader* holder = nullptr);
  // `spec` for logs and messages: SQLite's path, or PostgreSQL's user, host,
  // port and database -- never a password.
  static std::string DescribeSpec(const std::string& spec);
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  // DataLoss, naming the row, when a stored job or worker does not parse.
  absl::StatusOr<StoreSnapshot> LoadAll();

  // PostgreSQL: the leader epoch this store took at open (also stored on
  // every jobs and events row it writes, column leader_epoch); 0 on SQLite.
  int64_t leader_epoch() const;
  // OK, or why the store was deposed (see StoreOptions). Thread-safe.
  absl::Status deposed() const;
  // PostgreSQL with a lease (StoreOptions::leader_lease): whether this
  // coordinator surely still holds the store's lock, i.e. the server
  // answered a lease ping (or a write's epoch check) sent less than a lease
  // ago on the monotonic clock. A process that was stopped (SIGSTOP, a long
  // stall) or cut off from the server past its lease may have been deposed
  // without knowing it yet: until a ping confirms the lock again it must
  // not act as the active coordinator (no health SERVING, no expiries, no
  // registrations: coordinator_server.h). Always true on SQLite and without
  // a lease. Thread-safe and lock-free (never waits for a write).
  bool lease_confirmed() const;

  // How long each COMMIT took (the fsync of synchronous=FULL): the
  // coordinator's /metrics. Thread-safe to read at any time.
  const LatencyHistogram& commit_latency() const;

  // How the store's writes are going (docs/failures.md, "A full or failing
  // store"): failing from a write that failed until one commits again. The
  // store logs the start of a run of failures, then at most one line per
  // 30 s with the count, and the recovery. Thread-safe.
  struct WriteHealth {
    bool failing = false;
    absl::Time failing_since = absl::InfinitePast();  // wall clock, for people
    int64_t failed_writes = 0;                        // since the store opened
    std::string last_error;
  };
  WriteHealth write_health() const;
  // Whether `s` is what a failed store write returns (Unavailable or
  // ResourceExhausted): the store has logged it (see above), so a caller
  // that retries at its next tick need not log it again.
  static bool IsWriteFailure(const absl::Status& s) {
    return s.code() == absl::StatusCode::kUnavailable ||
           s.code() == absl::StatusCode::kResourceExhausted;
  }

  // Fault injection for tests (LevelDB's FaultInjectionTestEnv, in small):
  // `fail` is asked before each write of any table (PutJob, AppendMetrics,
  // AppendLogs, PutWorker, ..., and a group's CommitGroup when the group
  // wrote) commits, with the write's number (1, 2, ... counted from this
  // call) and its operation (e.g. "PutJob('j-1')",
  // "CommitGroup('w', seq 3)"). When it returns true the write is rolled
  // back and returns Unavailable, exactly as a failed commit would: nothing
  // of it is stored. An empty function ends the injection.
  // Reads never consult it. Thread-safe like every method; `fail` runs with
  // the store's lock held, so it must not call the store.
  using WriteFault = std::function<bool(int64_t write_no, absl::string_view op)>;
  void SetWriteFaultForTest(WriteFault fail);

  // --- groups: one transaction around several calls -----------------------
  // Applying one sequenced telemetry message (TelemetryLedger) may write
  // several times (metrics, then the job with an event). A group makes those
  // writes and the worker's applied seq one transaction, so a coordinator
  // killed at any point has either all of them or none, and a resend is
  // deduplicated exactly. Between BeginGroup and CommitGroup/RollbackGroup
  // every write method runs as a savepoint inside the group (still all or
  // nothing itself; durable only at CommitGroup).
  //
  // Groups are the store's, not a table's: a group's writes span tables, and
  // its atomicity is the one connection's transaction.
  //
  // A group spans calls: only one thread may use the store while it is open
  // (the coordinator's loop, where every store caller runs), except
  // TelemetryTables::AppendGroup (a whole group in one call, from the
  // telemetry batcher's writer thread), which waits for it to end.
  // FailedPrecondition when a group is already open.
  absl::Status BeginGroup();
  // Records `telemetry_seq` as `worker_id`'s highest applied seq (never
  // lowering it) when the group wrote anything, and commits. A group that
  // wrote nothing stores no seq and costs no disk write: its messages left
  // only memory state, which a restart does not have to deduplicate. On
  // failure the group is rolled back (and the error returned).
  absl::Status CommitGroup(const std::string& worker_id, int64_t telemetry_seq);
  // The same for a group that applied several workers' messages (group
  // commit): each worker's highest seq is recorded, then one commit.
  absl::Status CommitGroup(const std::vector<std::pair<std::string, int64_t>>& telemetry_seqs);
  // Discards everything written since BeginGroup. No-op without a group.
  void RollbackGroup();

  // --- the tables (see the top of this file) -------------------------------
  JobsTable& jobs() { return jobs_; }
  TelemetryTables& telemetry() { return telemetry_; }
  WorkersTable& workers() { return workers_; }
  AuthTables& auth() { return auth_; }
  QueueTables& queues() { return queues_; }
  UsageTable& usage() { return usage_; }
  CodeArchives& code_archives() { return code_archives_; }

 private:
  explicit StateStore(std::unique_ptr<store_internal::StoreCore> core);
  // Declared first: the tables hold references into it.
  std::unique_ptr<store_internal::StoreCore> core_;
  JobsTable jobs_;
  TelemetryTables telemetry_;
  WorkersTable workers_;
  AuthTables auth_;
  QueueTables queues_;
  UsageTable usage_;
  CodeArchives code_archives_;
};

}  // namespace trainctl::coordinator
