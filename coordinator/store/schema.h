// The store's schema, versioned (SQLite's user_version, or the identity row
// on PostgreSQL): a migration per version, applied in order at open, in the
// transaction that records the new version. Internal to coordinator/store.
#pragma once

#include <cstdint>

namespace trainctl::coordinator::store_internal {

// Marks a database as trainctl's (PRAGMA application_id, "TRCT"), so that
// another program's SQLite file is refused instead of being written into.
inline constexpr int32_t kApplicationId = 0x54524354;

// The version this build writes: the number of migrations.
int SchemaVersion();

// The SQL that takes the schema from `version` to version + 1 (as SQLite
// writes it; SqlDb::SchemaSql adapts it); nullptr outside 0..SchemaVersion()-1.
const char* MigrationSql(int version);

}  // namespace trainctl::coordinator::store_internal
