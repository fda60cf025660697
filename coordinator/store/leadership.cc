// A PostgreSQL store's leadership (docs/operator.md, "High availability"):
// the connection under the advisory lock, the leader epoch taken at open and
// checked by every write, and the lease ping that finds a deposition.
#include <algorithm>

#include <memory>
#include <string>
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/store/pg_db.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/store/state_store_impl.h"

namespace trainctl::coordinator {

using store_internal::Query;

absl::Status StoreCore::OpenPostgresLocked(const std::string& conninfo, StoreLeader* holder) {
  store_internal::PgLockHolder lock_holder;
  absl::StatusOr<std::unique_ptr<store_internal::SqlDb>> connected =
      store_internal::ConnectPostgres(
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

absl::Status StoreCore::TakeLeadership() {
  // One statement, so one transaction: the epoch and the address change
  // together. A write of the previous leader that still holds the leader
  // row (CheckEpoch's row lock) commits first; any later one fails its check.
  const std::string op = absl::StrCat("open ", path, ": take the leader epoch");
  Query q(db, stmts->take_leadership, op);
  q.Bind(1, options.leader_address).Bind(2, absl::ToUnixMillis(absl::Now()));
  TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row || q.Int(0) <= 0)
    return absl::InternalError(absl::StrCat("state store: ", op, ": no epoch returned"));
  leader_epoch = q.Int(0);
  NoteConfirmed(MonotonicNow());
  LogEvent(
      LogLevel::kInfo, "coordinator", "leader_epoch",
      {{"db", path}, {"epoch", absl::StrCat(leader_epoch)}, {"address", options.leader_address}});
  return absl::OkStatus();
}

absl::Status StoreCore::CheckEpoch(absl::string_view op) {
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

void StoreCore::NoteDeposition(const absl::Status& failed) {
  if (deposed.ok() && db != nullptr && db->LostLock()) deposed = failed;
  if (deposed.ok() || deposed_told) return;
  deposed_told = true;
  if (options.on_deposed) options.on_deposed(deposed);
}

void StoreCore::PingLoop() {
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
      deposed = absl::FailedPreconditionError(
          absl::StrCat("state store: lease ping: this coordinator (leader epoch ", leader_epoch,
                       ") was deposed by epoch ", q.Int(0), " (the active coordinator is at ",
                       q.Text(1), "); it writes nothing more"));
    }
    NoteDeposition(row.ok() ? absl::OkStatus() : row.status());
    if (!deposed.ok()) return;
  }
}

}  // namespace trainctl::coordinator
