#include "coordinator/store/pg_db.h"

#include <poll.h>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/status_macros.h"

#ifdef TRAINCTL_WITH_LIBPQ
#include <libpq-fe.h>
#endif

namespace trainctl::coordinator::store_internal {

#ifndef TRAINCTL_WITH_LIBPQ

bool PostgresBuiltIn() { return false; }

absl::StatusOr<std::string> PostgresDisplayName(const std::string&) {
  return std::string("postgresql");
}

absl::StatusOr<std::unique_ptr<SqlDb>> ConnectPostgres(const std::string&,
                                                       const std::string& display, const PgSession&,
                                                       PgLockHolder*) {
  return absl::FailedPreconditionError(absl::StrCat(
      "state store: open ", display,
      ": this trainctl-coordinator was built without libpq (PostgreSQL); use --store sqlite:PATH"));
}

#else  // TRAINCTL_WITH_LIBPQ

namespace {

// pg_try_advisory_lock key of the store ("TRCT", as SQLite's application_id).
constexpr int64_t kAdvisoryLockKey = 0x54524354;

std::string Trimmed(const char* message) {
  return std::string(absl::StripTrailingAsciiWhitespace(message != nullptr ? message : ""));
}

// A failed result (or none: the connection broke) as a Status.
absl::Status PgError(PGconn* conn, const PGresult* res, absl::string_view op,
                     absl::string_view display) {
  const char* state = res != nullptr ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : nullptr;
  const std::string sqlstate = state != nullptr ? state : "";
  std::string detail = Trimmed(res != nullptr ? PQresultErrorMessage(res) : "");
  if (detail.empty()) detail = Trimmed(PQerrorMessage(conn));
  const std::string message =
      absl::StrCat("state store: ", op, ": ", detail, " (", display,
                   sqlstate.empty() ? "" : absl::StrCat(", SQLSTATE ", sqlstate), ")");
  if (PQstatus(conn) == CONNECTION_BAD || sqlstate.empty()) {
    return absl::UnavailableError(absl::StrCat(message, "; the connection to the server is lost"));
  }
  const absl::string_view cls = absl::string_view(sqlstate).substr(0, 2);
  if (sqlstate == "23505") return absl::AlreadyExistsError(message);
  if (cls == "23") return absl::InvalidArgumentError(message);
  if (sqlstate == "53300") return absl::UnavailableError(message);  // too many connections
  if (cls == "53") return absl::ResourceExhaustedError(message);    // 53100 disk full, memory
  if (cls == "08" || cls == "57" || sqlstate == "40001" || sqlstate == "40P01" ||
      sqlstate == "55P03") {
    // Connection, shutdown, cancel, serialization, deadlock, lock timeout:
    // a retry may succeed.
    return absl::UnavailableError(message);
  }
  if (sqlstate == "XX001" || sqlstate == "XX002") return absl::DataLossError(message);
  if (cls == "42" && sqlstate == "42501") return absl::PermissionDeniedError(message);
  if (cls == "28") return absl::PermissionDeniedError(message);
  if (cls == "3D" || cls == "25") return absl::FailedPreconditionError(message);
  return absl::InternalError(message);
}

// SQLite's ?N (and bare ?) parameters as $N, outside quoted text.
std::string TranslateParams(absl::string_view sql, int* max_param) {
  std::string out;
  out.reserve(sql.size() + 8);
  int next = 1;
  *max_param = 0;
  char quote = 0;
  for (size_t i = 0; i < sql.size(); ++i) {
    const char c = sql[i];
    if (quote != 0) {
      out.push_back(c);
      if (c == quote) quote = 0;
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      out.push_back(c);
      continue;
    }
    if (c != '?') {
      out.push_back(c);
      continue;
    }
    size_t j = i + 1;
    int n = 0;
    while (j < sql.size() && sql[j] >= '0' && sql[j] <= '9') n = n * 10 + (sql[j++] - '0');
    if (j == i + 1) n = next;
    next = n + 1;
    if (n > *max_param) *max_param = n;
    absl::StrAppend(&out, "$", n);
    i = j - 1;
  }
  return out;
}

class PgDb;

class PgStatement final : public SqlStatement {
 public:
  PgStatement(PgDb* db, std::string name, std::string sql, int params, bool is_commit)
      : db_(db),
        name_(std::move(name)),
        sql_(std::move(sql)),
        values_(params),
        set_(params, false),
        binary_(params, 0),
        is_commit_(is_commit) {}
  ~PgStatement() override { Reset(); }

  absl::Status BindInt(int index, int64_t value) override {
    return Set(index, absl::StrCat(value), false);
  }
  absl::Status BindText(int index, absl::string_view text) override {
    return Set(index, std::string(text), false);
  }
  absl::Status BindBlob(int index, absl::string_view bytes) override {
    return Set(index, std::string(bytes), true);
  }
  absl::StatusOr<bool> Step(absl::string_view op) override;
  int64_t Int(int col) const override {
    if (res_ == nullptr || PQgetisnull(res_, row_, col)) return 0;
    const auto* p = reinterpret_cast<const unsigned char*>(PQgetvalue(res_, row_, col));
    const int len = PQgetlength(res_, row_, col);
    uint64_t v = 0;
    for (int i = 0; i < len; ++i) v = (v << 8) | p[i];
    // Sign-extend int2/int4 (binary results are big-endian two's complement).
    if (len > 0 && len < 8 && (p[0] & 0x80) != 0) v |= ~uint64_t{0} << (8 * len);
    return static_cast<int64_t>(v);
  }
  std::string Text(int col) const override { return std::string(Blob(col)); }
  absl::string_view Blob(int col) const override {
    if (res_ == nullptr || PQgetisnull(res_, row_, col)) return {};
    return absl::string_view(PQgetvalue(res_, row_, col),
                             static_cast<size_t>(PQgetlength(res_, row_, col)));
  }
  void Reset() override {
    if (res_ != nullptr) PQclear(res_);
    res_ = nullptr;
    row_ = -1;
    for (size_t i = 0; i < values_.size(); ++i) {
      values_[i].clear();
      set_[i] = false;
      binary_[i] = 0;
    }
  }

 private:
  absl::Status Set(int index, std::string value, bool binary) {
    if (index < 1 || index > static_cast<int>(values_.size())) {
      return absl::InternalError(absl::StrCat("bind parameter ", index, ": out of range (",
                                              values_.size(), " parameters)"));
    }
    values_[index - 1] = std::move(value);
    set_[index - 1] = true;
    binary_[index - 1] = binary ? 1 : 0;
    return absl::OkStatus();
  }

  PgDb* db_;
  const std::string name_;
  const std::string sql_;
  std::vector<std::string> values_;
  std::vector<bool> set_;
  std::vector<int> binary_;
  const bool is_commit_;
  int64_t prepared_epoch_ = -1;  // the connection epoch it was prepared in
  PGresult* res_ = nullptr;
  int row_ = -1;
};

class PgDb final : public SqlDb {
 public:
  PgDb(PGconn* conn, std::string display, PgSession session)
      : conn_(conn), display_(std::move(display)), session_(session) {}
  ~PgDb() override {
    if (conn_ == nullptr) return;
    ReleaseLock();
    PQfinish(conn_);
  }
  PgDb(const PgDb&) = delete;
  PgDb& operator=(const PgDb&) = delete;

  SqlBackend backend() const override { return SqlBackend::kPostgres; }
  absl::StatusOr<std::unique_ptr<SqlStatement>> Prepare(const char* sql,
                                                        absl::string_view op) override {
    int params = 0;
    std::string text = TranslateParams(sql, &params);
    const bool is_commit = absl::string_view(sql) == "COMMIT";
    (void)op;  // prepared at first use, when the connection is known good
    return std::unique_ptr<SqlStatement>(new PgStatement(
        this, absl::StrCat("trainctl_", next_name_++), std::move(text), params, is_commit));
  }
  absl::Status Exec(const std::string& sql, absl::string_view op) override {
    TRAINCTL_RETURN_IF_ERROR(EnsureConnected(op));
    PGresult* res = PQexec(conn_, sql.c_str());
    const ExecStatusType st = res != nullptr ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    absl::Status status = absl::OkStatus();
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) status = PgError(conn_, res, op, display_);
    PQclear(res);
    return status;
  }
  bool InTransaction() override {
    const PGTransactionStatusType t = PQtransactionStatus(conn_);
    return t == PQTRANS_INTRANS || t == PQTRANS_INERROR || t == PQTRANS_ACTIVE;
  }
  int64_t TotalChanges() override { return total_changes_; }
  int64_t ConnectionEpoch() const override { return epoch_; }
  bool LostLock() const override { return lost_lock_; }
  const char* BeginSql() const override { return "BEGIN"; }
  std::string SchemaSql(absl::string_view ddl) const override {
    std::string s(ddl);
    s = absl::StrReplaceAll(s, {{"INTEGER PRIMARY KEY AUTOINCREMENT",
                                 "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"}});
    // Byte order for text keys, as SQLite's (ORDER BY id is part of the API).
    s = absl::StrReplaceAll(s, {{"INTEGER", "BIGINT"},
                                {"BLOB", "BYTEA"},
                                {"TEXT", "TEXT COLLATE \"C\""},
                                {") WITHOUT ROWID;", ");"}});
    return s;
  }
  absl::StatusOr<DbIdentity> ReadIdentity(absl::string_view op) override {
    DbIdentity id;
    TRAINCTL_ASSIGN_OR_RETURN(
        id.objects,
        QueryInt("SELECT COUNT(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
                 "ON n.oid = c.relnamespace WHERE n.nspname = current_schema() "
                 "AND c.relkind IN ('r', 'i', 'S', 'v', 'p')",
                 op));
    TRAINCTL_ASSIGN_OR_RETURN(int64_t marked,
                              QueryInt("SELECT COUNT(*) FROM pg_catalog.pg_class c JOIN "
                                       "pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                                       "WHERE n.nspname = current_schema() "
                                       "AND c.relname = 'trainctl_schema'",
                                       op));
    if (marked == 0) return id;
    TRAINCTL_ASSIGN_OR_RETURN(
        id.app_id, QueryInt("SELECT COALESCE(MAX(application_id), 0) FROM trainctl_schema", op));
    TRAINCTL_ASSIGN_OR_RETURN(
        id.version, QueryInt("SELECT COALESCE(MAX(version), 0) FROM trainctl_schema", op));
    return id;
  }
  absl::Status WriteIdentity(int64_t app_id, int64_t version, absl::string_view op) override {
    return Exec(
        absl::StrCat("CREATE TABLE IF NOT EXISTS trainctl_schema (application_id BIGINT NOT NULL, "
                     "version BIGINT NOT NULL); DELETE FROM trainctl_schema; "
                     "INSERT INTO trainctl_schema (application_id, version) VALUES (",
                     app_id, ", ", version, ")"),
        op);
  }

  // Reconnects a broken connection (and re-takes the lock, then sets the
  // session's lease); Unavailable when that fails. Once another session
  // holds the lock (LostLock), FailedPrecondition, for good.
  absl::Status EnsureConnected(absl::string_view op) {
    if (lost_lock_) return LostLockError(op);
    if (PQstatus(conn_) == CONNECTION_OK && locked_) return absl::OkStatus();
    if (PQstatus(conn_) != CONNECTION_OK) {
      locked_ = false;
      PQreset(conn_);
      if (PQstatus(conn_) != CONNECTION_OK) {
        return absl::UnavailableError(absl::StrCat("state store: ", op, ": cannot reconnect to ",
                                                   display_, ": ", Trimmed(PQerrorMessage(conn_))));
      }
      ++epoch_;  // prepared statements and cached counts are gone
    }
    bool held_by_other = false;
    absl::Status locked = TakeLock(op, &held_by_other);
    if (held_by_other && ever_locked_) {
      // The session that held the lock is gone and another coordinator has
      // it now: this one was deposed while it could not talk to the server.
      lost_lock_ = true;
      taken_by_ = ReadHolder();
      PQfinish(conn_);
      conn_ = nullptr;
      return LostLockError(op);
    }
    TRAINCTL_RETURN_IF_ERROR(locked);
    return AfterLock(op);
  }
  // The lock is this session's: from now on a lock found held by another
  // session at a reconnect means deposition; and the session's lease.
  absl::Status AfterLock(absl::string_view op) {
    ever_locked_ = true;
    return ApplySession(op);
  }
  absl::Status TakeLock(absl::string_view op, bool* held_by_other) {
    const std::string sql = absl::StrCat("SELECT pg_try_advisory_lock(", kAdvisoryLockKey, ")");
    PGresult* res = PQexec(conn_, sql.c_str());
    absl::Status status = absl::OkStatus();
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
      status = PgError(conn_, res, absl::StrCat(op, ": take the store's advisory lock"), display_);
    } else if (std::strcmp(PQgetvalue(res, 0, 0), "t") != 0) {
      *held_by_other = true;
      status = absl::UnavailableError(
          absl::StrCat("state store: ", op, ": ", display_,
                       " is locked by another session (pg_try_advisory_lock(", kAdvisoryLockKey,
                       ")); is another coordinator using this database?"));
    } else {
      locked_ = true;
    }
    PQclear(res);
    return status;
  }
  // A clean close lets go of the store's lock before it returns. Left to
  // the server, the lock goes when the server notices the closed
  // connection, a moment after the close: an open right after it (a
  // restart, a reopen) could still find the lock held and fail. Best
  // effort, and bounded: waits for the server at most 2 s (a crashed
  // coordinator's lock goes with its connection, as before).
  void ReleaseLock() {
    if (!locked_ || PQstatus(conn_) != CONNECTION_OK) return;
    const std::string sql = absl::StrCat("SELECT pg_advisory_unlock(", kAdvisoryLockKey, ")");
    if (PQsendQuery(conn_, sql.c_str()) != 1) return;
    const absl::Time deadline = absl::Now() + absl::Seconds(2);
    while (PQconsumeInput(conn_) == 1) {
      if (PQisBusy(conn_) == 0) {
        while (PGresult* res = PQgetResult(conn_)) PQclear(res);
        locked_ = false;
        return;
      }
      const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      pollfd fd{PQsocket(conn_), POLLIN, 0};
      if (left_ms <= 0 || poll(&fd, 1, static_cast<int>(left_ms)) <= 0) return;
    }
  }
  // The leader table's record (best effort: a store without the table yet
  // says nothing).
  PgLockHolder ReadHolder() {
    PgLockHolder holder;
    PGresult* res = PQexec(conn_, "SELECT epoch, address FROM leader WHERE id = 1");
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1) {
      holder.epoch = std::strtoll(PQgetvalue(res, 0, 0), nullptr, 10);
      holder.address = PQgetvalue(res, 0, 1);
    }
    PQclear(res);
    return holder;
  }

  PGconn* conn() const { return conn_; }
  const std::string& display() const { return display_; }
  int64_t epoch() const { return epoch_; }
  void AddChanges(int64_t n) { total_changes_ += n; }

 private:
  absl::StatusOr<int64_t> QueryInt(const char* sql, absl::string_view op) {
    TRAINCTL_RETURN_IF_ERROR(EnsureConnected(op));
    PGresult* res = PQexec(conn_, sql);
    absl::StatusOr<int64_t> out;
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
      out = PgError(conn_, res, absl::StrCat(op, ": ", sql), display_);
    } else if (PQntuples(res) != 1) {
      out = absl::InternalError(absl::StrCat("state store: ", op, ": ", sql, ": no result"));
    } else {
      out = std::strtoll(PQgetvalue(res, 0, 0), nullptr, 10);
    }
    PQclear(res);
    return out;
  }

  absl::Status LostLockError(absl::string_view op) const {
    return absl::FailedPreconditionError(
        absl::StrCat("state store: ", op, ": this coordinator lost its session to ", display_,
                     " and another coordinator holds the store's lock now: it was deposed",
                     taken_by_.epoch > 0
                         ? absl::StrCat(" by epoch ", taken_by_.epoch,
                                        " (the active coordinator is at ", taken_by_.address, ")")
                         : std::string(),
                     "; it writes nothing more"));
  }
  // The session's lease (PgSession), set after every (re)connect.
  absl::Status ApplySession(absl::string_view op) {
    if (session_.lease <= absl::ZeroDuration()) return absl::OkStatus();
    const int64_t ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(session_.lease));
    std::string sql = absl::StrCat("SET idle_in_transaction_session_timeout = ", ms);
    if (PQserverVersion(conn_) >= 140000) {
      absl::StrAppend(&sql, "; SET idle_session_timeout = ", ms);
    } else if (!warned_old_server_) {
      warned_old_server_ = true;
      LogEvent(LogLevel::kWarn, "coordinator", "store_lease_unbounded",
               {{"db", display_},
                {"server_version", absl::StrCat(PQserverVersion(conn_))},
                {"why",
                 "PostgreSQL < 14 has no idle_session_timeout: a stopped coordinator keeps "
                 "the store's lock until its TCP connection dies"}});
    }
    PGresult* res = PQexec(conn_, sql.c_str());
    absl::Status status = absl::OkStatus();
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
      status = PgError(conn_, res, absl::StrCat(op, ": set the session's lease"), display_);
    }
    PQclear(res);
    return status;
  }

  PGconn* conn_;
  const std::string display_;
  const PgSession session_;
  bool ever_locked_ = false;
  bool lost_lock_ = false;
  PgLockHolder taken_by_;  // who holds the lock, once lost_lock_
  bool warned_old_server_ = false;
  int64_t total_changes_ = 0;
  int64_t epoch_ = 0;
  int64_t next_name_ = 0;
  bool locked_ = false;
};

absl::StatusOr<bool> PgStatement::Step(absl::string_view op) {
  if (res_ == nullptr) {
    TRAINCTL_RETURN_IF_ERROR(db_->EnsureConnected(op));
    PGconn* conn = db_->conn();
    if (prepared_epoch_ != db_->epoch()) {
      PGresult* prep =
          PQprepare(conn, name_.c_str(), sql_.c_str(), static_cast<int>(values_.size()), nullptr);
      if (PQresultStatus(prep) != PGRES_COMMAND_OK) {
        // (A multi-row statement is long: its start names it.)
        const absl::string_view head = absl::string_view(sql_).substr(0, 160);
        absl::Status s = PgError(
            conn, prep,
            absl::StrCat(op, ": prepare \"", head, head.size() < sql_.size() ? " ..." : "", "\""),
            db_->display());
        PQclear(prep);
        return s;
      }
      PQclear(prep);
      prepared_epoch_ = db_->epoch();
    }
    const size_t n = values_.size();
    std::vector<const char*> values(n);
    std::vector<int> lengths(n);
    for (size_t i = 0; i < n; ++i) {
      values[i] = set_[i] ? values_[i].data() : nullptr;  // unbound: NULL, as SQLite
      lengths[i] = static_cast<int>(values_[i].size());
    }
    const bool was_failed = PQtransactionStatus(conn) == PQTRANS_INERROR;
    res_ = PQexecPrepared(conn, name_.c_str(), static_cast<int>(n), values.data(), lengths.data(),
                          binary_.data(), /*resultFormat=*/1);
    const ExecStatusType st = res_ != nullptr ? PQresultStatus(res_) : PGRES_FATAL_ERROR;
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
      absl::Status s = PgError(conn, res_, op, db_->display());
      PQclear(res_);
      res_ = nullptr;
      return s;
    }
    if (is_commit_ && (was_failed || std::strcmp(PQcmdStatus(res_), "ROLLBACK") == 0)) {
      // COMMIT of a failed transaction ends it with a rollback.
      PQclear(res_);
      res_ = nullptr;
      return absl::AbortedError(absl::StrCat("state store: ", op, ": ", db_->display(),
                                             " rolled the transaction back instead of committing"));
    }
    db_->AddChanges(std::atoll(PQcmdTuples(res_)));
    row_ = -1;
  }
  ++row_;
  return row_ < PQntuples(res_);
}

}  // namespace

bool PostgresBuiltIn() { return true; }

absl::StatusOr<std::string> PostgresDisplayName(const std::string& conninfo) {
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(conninfo.c_str(), &error);
  if (options == nullptr) {
    std::string message = Trimmed(error != nullptr ? error : "out of memory");
    PQfreemem(error);
    return absl::InvalidArgumentError(
        absl::StrCat("state store: cannot parse the PostgreSQL connection string: ", message));
  }
  std::string host, port, db, user;
  for (PQconninfoOption* o = options; o->keyword != nullptr; ++o) {
    if (o->val == nullptr) continue;
    const absl::string_view k = o->keyword;
    if (k == "host" || (k == "hostaddr" && host.empty())) host = o->val;
    if (k == "port") port = o->val;
    if (k == "dbname") db = o->val;
    if (k == "user") user = o->val;
  }
  PQconninfoFree(options);
  return absl::StrCat("postgresql://", user.empty() ? "" : absl::StrCat(user, "@"),
                      host.empty() ? "(default host)" : host, port.empty() ? "" : ":", port, "/",
                      db);
}

absl::StatusOr<std::unique_ptr<SqlDb>> ConnectPostgres(const std::string& conninfo,
                                                       const std::string& display,
                                                       const PgSession& session,
                                                       PgLockHolder* holder) {
  // Later keywords override earlier ones: the connection string decides.
  const char* keys[] = {"connect_timeout", "application_name", "dbname", nullptr};
  const char* values[] = {"10", "trainctl-coordinator", conninfo.c_str(), nullptr};
  PGconn* conn = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
  if (conn == nullptr) return absl::ResourceExhaustedError("state store: libpq: out of memory");
  auto db = std::make_unique<PgDb>(conn, display, session);
  PQsetNoticeProcessor(
      conn, [](void*, const char*) {}, nullptr);
  const std::string op = absl::StrCat("open ", display);
  if (PQstatus(conn) != CONNECTION_OK) {
    return absl::UnavailableError(
        absl::StrCat("state store: ", op, ": cannot connect: ", Trimmed(PQerrorMessage(conn))));
  }
  bool held_by_other = false;
  absl::Status locked = db->TakeLock(op, &held_by_other);
  if (held_by_other && holder != nullptr) *holder = db->ReadHolder();
  TRAINCTL_RETURN_IF_ERROR(locked);
  TRAINCTL_RETURN_IF_ERROR(db->AfterLock(op));
  TRAINCTL_RETURN_IF_ERROR(db->Exec("SET client_min_messages = warning", op));
  return std::unique_ptr<SqlDb>(std::move(db));
}

#endif  // TRAINCTL_WITH_LIBPQ

}  // namespace trainctl::coordinator::store_internal
