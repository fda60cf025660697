// The state store's PostgreSQL backend (sql_db.h) through libpq: prepared
// statements (SQLite's ?N parameters become $N, prepared once per
// connection and again after a reconnect), text parameters except BYTEA
// blobs, binary results; SQLSTATEs as Status codes (state_store.h). The
// connection takes a session advisory lock on the database, so that one
// coordinator at a time writes to it (a second Open is Unavailable, as with
// SQLite's exclusive lock); a lost connection is re-established at the next
// use, the lock re-taken first; when another session holds it by then (a
// standby took over), the connection says so (LostLock) and stays unusable.
//
// Lease (`PgSession::lease`): every (re)connected session sets PostgreSQL's
// idle_session_timeout and idle_in_transaction_session_timeout to it, so a
// coordinator that stops talking (SIGSTOP, a hung host, a partition) loses
// its session -- and with it the advisory lock -- once silent that long; the
// store pings the session to stay alive while it is well (state_store.h).
//
// Threading: none of its own (see sql_db.h).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/store/sql_db.h"

namespace trainctl::coordinator::store_internal {

// Whether this binary was built with libpq.
bool PostgresBuiltIn();

// The server and database `conninfo` names, for messages and logs: never its
// password or other secrets ("postgresql://USER@HOST:PORT/DB").
// InvalidArgument when libpq cannot parse it.
absl::StatusOr<std::string> PostgresDisplayName(const std::string& conninfo);

// How a store connection's session behaves.
struct PgSession {
  // > 0: the session's idle timeouts (see above). PostgreSQL older than 14
  // has no idle_session_timeout: then only the in-transaction one is set
  // and a warning is logged.
  absl::Duration lease = absl::ZeroDuration();
};

// Who holds the store's lock, as the leader table says (epoch 0: no leader
// recorded yet).
struct PgLockHolder {
  int64_t epoch = 0;
  std::string address;
};

// Connects and takes the store's advisory lock. Unavailable (naming
// `display`) when the server cannot be reached or another coordinator holds
// the lock -- then `holder` (when given) gets the leader table's record, if
// there is one; FailedPrecondition when built without libpq.
absl::StatusOr<std::unique_ptr<SqlDb>> ConnectPostgres(const std::string& conninfo,
                                                       const std::string& display,
                                                       const PgSession& session = {},
                                                       PgLockHolder* holder = nullptr);

}  // namespace trainctl::coordinator::store_internal
