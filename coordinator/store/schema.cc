// The store's schema: its migrations, one per version (see schema.h).
#include "coordinator/store/schema.h"

namespace trainctl::coordinator::store_internal {
namespace {

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

}  // namespace

int SchemaVersion() { return kSchemaVersion; }

const char* MigrationSql(int version) {
  return version >= 0 && version < kSchemaVersion ? kMigrations[version] : nullptr;
}

}  // namespace trainctl::coordinator::store_internal
