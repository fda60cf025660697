// QueueTables (queue_tables.h): the queues jobs are submitted to and the
// stored fair-share usage. Each write is one statement (its own
// transaction).
// Threading: every method takes the store's mutex (StoreCore::mu).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/store/queue_tables.h"
#include "coordinator/store/state_store_impl.h"

namespace trainctl::coordinator {

using store_internal::ParseBlob;
using store_internal::Query;

absl::Status QueueTables::PutQueue(const v1::Queue& queue) {
  if (queue.name().empty())
    return absl::InvalidArgumentError("state store: PutQueue: queue has no name");
  const std::string blob = queue.SerializeAsString();
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("PutQueue('", queue.name(), "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  return Query(s.db, s.stmts->put_queue, op).Bind(1, queue.name()).BindBlob(2, blob).Run();
}

absl::Status QueueTables::DeleteQueue(const std::string& name) {
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("DeleteQueue('", name, "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  return Query(s.db, s.stmts->delete_queue, op).Bind(1, name).Run();
}

absl::StatusOr<std::vector<v1::Queue>> QueueTables::LoadQueues() {
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  std::vector<v1::Queue> out;
  Query q(s.db, s.stmts->load_queues, "LoadQueues");
  while (true) {
    TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    v1::Queue queue;
    std::string name = q.Text(0);
    TRAINCTL_RETURN_IF_ERROR(ParseBlob(q.Blob(1), &queue, absl::StrCat("queues row '", name, "'")));
    if (queue.name() != name) {
      return absl::DataLossError(
          absl::StrCat("state store: queues row '", name, "' holds queue '", queue.name(), "'"));
    }
    out.push_back(std::move(queue));
  }
  return out;
}

absl::Status QueueTables::PutFairShare(const v1::FairShareSnapshot& usage) {
  const std::string blob = usage.SerializeAsString();
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  const std::string op = "PutFairShare";
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  return Query(s.db, s.stmts->put_fair_share, op).BindBlob(1, blob).Run();
}

absl::StatusOr<v1::FairShareSnapshot> QueueTables::LoadFairShare() {
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  v1::FairShareSnapshot out;
  Query q(s.db, s.stmts->load_fair_share, "LoadFairShare");
  TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
  if (row) TRAINCTL_RETURN_IF_ERROR(ParseBlob(q.Blob(0), &out, "fair_share row"));
  return out;
}

}  // namespace trainctl::coordinator
