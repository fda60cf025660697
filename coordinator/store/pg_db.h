// The state store's PostgreSQL backend (sql_db.h) through libpq: prepared
// statements (SQLite's ?N parameters become $N, prepared once per
// connection and again after a reconnect), text parameters except BYTEA
// blobs, binary results; SQLSTATEs as Status codes (state_store.h). The
// connection takes a session advisory lock on the database, so that one
// coordinator at a time writes to it (a second Open is Unavailable, as with
// SQLite's exclusive lock); a lost connection is re-established at the next
// use, the lock re-taken first.
//
// Threading: none of its own (see sql_db.h).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/store/sql_db.h"

namespace trainctl::coordinator::store_internal {

// Whether this binary was built with libpq.
bool PostgresBuiltIn();

// The server and database `conninfo` names, for messages and logs: never its
// password or other secrets ("postgresql://USER@HOST:PORT/DB").
// InvalidArgument when libpq cannot parse it.
absl::StatusOr<std::string> PostgresDisplayName(const std::string& conninfo);

// Connects and takes the store's advisory lock. Unavailable (naming
// `display`) when the server cannot be reached or another coordinator holds
// the lock; FailedPrecondition when built without libpq.
absl::StatusOr<std::unique_ptr<SqlDb>> ConnectPostgres(const std::string& conninfo,
                                                       const std::string& display);

}  // namespace trainctl::coordinator::store_internal
