// StateStore: who belongs to the cluster -- the workers table, tokens
// (stored by the hash of their secret), worker-id -> token bindings, and the
// queues jobs are submitted to.
// Each write is one statement (its own transaction). Threading: see
// state_store.h (every method takes the store's mutex).
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/store/state_store.h"
#include "coordinator/store/state_store_impl.h"

namespace trainctl::coordinator {

using store_internal::ParseBlob;
using store_internal::Query;

absl::Status StateStore::PutWorker(const v1::Worker& worker) {
  if (worker.id().empty()) {
    return absl::InvalidArgumentError("state store: PutWorker: worker has no id");
  }
  const std::string blob = worker.SerializeAsString();
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("PutWorker('", worker.id(), "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  // A single statement is its own transaction.
  return Query(s.db, s.stmts->put_worker, op)
      .Bind(1, worker.id())
      .BindBlob(2, blob)
      .Run();
}

absl::Status StateStore::DeleteWorker(const std::string& id) {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("DeleteWorker('", id, "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  return Query(s.db, s.stmts->delete_worker, op).Bind(1, id).Run();
}

absl::Status StateStore::PutToken(const v1::Token& token, const std::string& secret_hash) {
  if (token.id().empty()) return absl::InvalidArgumentError("state store: PutToken: token has no id");
  const std::string blob = token.SerializeAsString();
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("PutToken('", token.id(), "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  return Query(s.db, s.stmts->put_token, op).Bind(1, token.id()).Bind(2, secret_hash).BindBlob(3, blob).Run();
}

absl::StatusOr<std::vector<StoredToken>> StateStore::LoadTokens() {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  std::vector<StoredToken> out;
  Query q(s.db, s.stmts->load_tokens, "LoadTokens");
  while (true) {
    TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    StoredToken t;
    std::string id = q.Text(0);
    t.secret_hash = q.Text(1);
    TRAINCTL_RETURN_IF_ERROR(ParseBlob(q.Blob(2), &t.token, absl::StrCat("tokens row '", id, "'")));
    if (t.token.id() != id) {
      return absl::DataLossError(absl::StrCat("state store: tokens row '", id, "' holds token '",
                                              t.token.id(), "'"));
    }
    out.push_back(std::move(t));
  }
  return out;
}

absl::Status StateStore::PutWorkerBinding(const std::string& worker_id, const std::string& token_id) {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("PutWorkerBinding('", worker_id, "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  return Query(s.db, s.stmts->put_binding, op).Bind(1, worker_id).Bind(2, token_id).Run();
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> StateStore::LoadWorkerBindings() {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  std::vector<std::pair<std::string, std::string>> out;
  Query q(s.db, s.stmts->load_bindings, "LoadWorkerBindings");
  while (true) {
    TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    out.emplace_back(q.Text(0), q.Text(1));
  }
  return out;
}

absl::Status StateStore::PutRevokedWorker(const v1::RevokeWorkerResponse& revoked) {
  if (revoked.worker_id().empty()) {
    return absl::InvalidArgumentError("state store: PutRevokedWorker: no worker id");
  }
  const std::string blob = revoked.SerializeAsString();
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("PutRevokedWorker('", revoked.worker_id(), "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  return Query(s.db, s.stmts->put_revoked_worker, op).Bind(1, revoked.worker_id()).BindBlob(2, blob).Run();
}

absl::StatusOr<std::vector<v1::RevokeWorkerResponse>> StateStore::LoadRevokedWorkers() {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  std::vector<v1::RevokeWorkerResponse> out;
  Query q(s.db, s.stmts->load_revoked_workers, "LoadRevokedWorkers");
  while (true) {
    TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    v1::RevokeWorkerResponse r;
    std::string id = q.Text(0);
    TRAINCTL_RETURN_IF_ERROR(ParseBlob(q.Blob(1), &r, absl::StrCat("revoked_workers row '", id, "'")));
    if (r.worker_id() != id) {
      return absl::DataLossError(absl::StrCat("state store: revoked_workers row '", id, "' holds worker '",
                                              r.worker_id(), "'"));
    }
    out.push_back(std::move(r));
  }
  return out;
}

absl::Status StateStore::PutOwnerNumber(const std::string& owner, int64_t number) {
  if (number <= 0) return absl::InvalidArgumentError("state store: PutOwnerNumber: a number is >= 1");
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("PutOwnerNumber('", owner, "', ", number, ")");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  // A taken owner or number is AlreadyExists (the UNIQUE constraints).
  return Query(s.db, s.stmts->put_owner_number, op).Bind(1, owner).Bind(2, number).Run();
}

absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> StateStore::LoadOwnerNumbers() {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  std::vector<std::pair<std::string, int64_t>> out;
  Query q(s.db, s.stmts->load_owner_numbers, "LoadOwnerNumbers");
  while (true) {
    TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    out.emplace_back(q.Text(0), q.Int(1));
  }
  return out;
}

absl::Status StateStore::PutQueue(const v1::Queue& queue) {
  if (queue.name().empty()) return absl::InvalidArgumentError("state store: PutQueue: queue has no name");
  const std::string blob = queue.SerializeAsString();
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("PutQueue('", queue.name(), "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  return Query(s.db, s.stmts->put_queue, op).Bind(1, queue.name()).BindBlob(2, blob).Run();
}

absl::Status StateStore::DeleteQueue(const std::string& name) {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("DeleteQueue('", name, "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  return Query(s.db, s.stmts->delete_queue, op).Bind(1, name).Run();
}

absl::StatusOr<std::vector<v1::Queue>> StateStore::LoadQueues() {
  Impl& s = *impl_;
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
      return absl::DataLossError(absl::StrCat("state store: queues row '", name, "' holds queue '",
                                              queue.name(), "'"));
    }
    out.push_back(std::move(queue));
  }
  return out;
}

absl::Status StateStore::PutFairShare(const v1::FairShareSnapshot& usage) {
  const std::string blob = usage.SerializeAsString();
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  const std::string op = "PutFairShare";
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  return Query(s.db, s.stmts->put_fair_share, op).BindBlob(1, blob).Run();
}

absl::StatusOr<v1::FairShareSnapshot> StateStore::LoadFairShare() {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  v1::FairShareSnapshot out;
  Query q(s.db, s.stmts->load_fair_share, "LoadFairShare");
  TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
  if (row) TRAINCTL_RETURN_IF_ERROR(ParseBlob(q.Blob(0), &out, "fair_share row"));
  return out;
}

}  // namespace trainctl::coordinator
