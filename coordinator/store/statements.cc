// The store's prepared statements: every table's SQL, SQLite's and
// PostgreSQL's where it differs (StoreCore::PrepareStatements).
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/store/state_store_impl.h"

namespace trainctl::coordinator {

absl::Status StoreCore::PrepareStatements() {
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
      {&s.put_binding,
       "INSERT OR IGNORE INTO worker_bindings (worker_id, token_id) VALUES (?1, ?2)",
       "INSERT INTO worker_bindings (worker_id, token_id) VALUES (?1, ?2) "
       "ON CONFLICT (worker_id) DO NOTHING"},
      {&s.load_bindings, "SELECT worker_id, token_id FROM worker_bindings ORDER BY worker_id"},
      {&s.put_revoked_worker,
       "INSERT OR REPLACE INTO revoked_workers (worker_id, blob) VALUES (?1, ?2)",
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
       "INSERT INTO fair_share (id, blob) VALUES (1, ?1) ON CONFLICT (id) DO UPDATE SET blob = "
       "excluded.blob"},
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
       "SELECT size, substring(blob FROM ?2::INTEGER FOR ?3::INTEGER) FROM code_archives WHERE "
       "digest = ?1"},
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
      {&s.log_ranks,
       "SELECT DISTINCT rank FROM logs WHERE job_id = ?1 AND attempt = ?2 ORDER BY rank"},
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
  TRAINCTL_RETURN_IF_ERROR(PrepareChunked(
      s.insert_metrics, "INSERT INTO metrics (job_id, attempt, rank, blob)", 4, "", op));
  TRAINCTL_RETURN_IF_ERROR(
      PrepareChunked(s.insert_logs, "INSERT INTO logs (job_id, attempt, rank, blob)", 4, "", op));
  return PrepareChunked(s.put_telemetry_seqs, "INSERT INTO telemetry_seqs (worker_id, seq)", 2,
                        postgres
                            ? " ON CONFLICT (worker_id) DO UPDATE SET seq = "
                              "GREATEST(telemetry_seqs.seq, excluded.seq)"
                            : " ON CONFLICT (worker_id) DO UPDATE SET seq = MAX(seq, excluded.seq)",
                        op);
}

absl::Status StoreCore::PrepareChunked(ChunkedStatement& out, absl::string_view head,
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

}  // namespace trainctl::coordinator
