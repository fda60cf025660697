// WorkersTable (workers_table.h): the workers table. Each write is one
// statement (its own transaction).
// Threading: every method takes the store's mutex (StoreCore::mu).
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/store/state_store_impl.h"
#include "coordinator/store/workers_table.h"

namespace trainctl::coordinator {

using store_internal::Query;

absl::Status WorkersTable::PutWorker(const v1::Worker& worker) {
  if (worker.id().empty()) {
    return absl::InvalidArgumentError("state store: PutWorker: worker has no id");
  }
  const std::string blob = worker.SerializeAsString();
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("PutWorker('", worker.id(), "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  // A single statement is its own transaction.
  return Query(s.db, s.stmts->put_worker, op).Bind(1, worker.id()).BindBlob(2, blob).Run();
}

absl::Status WorkersTable::DeleteWorker(const std::string& id) {
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("DeleteWorker('", id, "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  return Query(s.db, s.stmts->delete_worker, op).Bind(1, id).Run();
}

}  // namespace trainctl::coordinator
