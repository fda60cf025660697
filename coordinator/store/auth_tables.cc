// AuthTables (auth_tables.h): tokens (stored by the hash of their secret),
// worker-id -> token bindings, revoked worker certificates and owner
// numbers. Each write is one statement (its own transaction).
// Threading: every method takes the store's mutex (StoreCore::mu).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/store/auth_tables.h"
#include "coordinator/store/state_store_impl.h"

namespace trainctl::coordinator {

using store_internal::ParseBlob;
using store_internal::Query;

absl::Status AuthTables::PutToken(const v1::Token& token, const std::string& secret_hash) {
  if (token.id().empty())
    return absl::InvalidArgumentError("state store: PutToken: token has no id");
  const std::string blob = token.SerializeAsString();
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("PutToken('", token.id(), "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  return Query(s.db, s.stmts->put_token, op)
      .Bind(1, token.id())
      .Bind(2, secret_hash)
      .BindBlob(3, blob)
      .Run();
}

absl::StatusOr<std::vector<StoredToken>> AuthTables::LoadTokens() {
  StoreCore& s = core_;
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
      return absl::DataLossError(
          absl::StrCat("state store: tokens row '", id, "' holds token '", t.token.id(), "'"));
    }
    out.push_back(std::move(t));
  }
  return out;
}

absl::Status AuthTables::PutWorkerBinding(const std::string& worker_id,
                                          const std::string& token_id) {
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("PutWorkerBinding('", worker_id, "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  return Query(s.db, s.stmts->put_binding, op).Bind(1, worker_id).Bind(2, token_id).Run();
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> AuthTables::LoadWorkerBindings() {
  StoreCore& s = core_;
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

absl::Status AuthTables::PutRevokedWorker(const v1::RevokeWorkerResponse& revoked) {
  if (revoked.worker_id().empty()) {
    return absl::InvalidArgumentError("state store: PutRevokedWorker: no worker id");
  }
  const std::string blob = revoked.SerializeAsString();
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("PutRevokedWorker('", revoked.worker_id(), "')");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  return Query(s.db, s.stmts->put_revoked_worker, op)
      .Bind(1, revoked.worker_id())
      .BindBlob(2, blob)
      .Run();
}

absl::StatusOr<std::vector<v1::RevokeWorkerResponse>> AuthTables::LoadRevokedWorkers() {
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  std::vector<v1::RevokeWorkerResponse> out;
  Query q(s.db, s.stmts->load_revoked_workers, "LoadRevokedWorkers");
  while (true) {
    TRAINCTL_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    v1::RevokeWorkerResponse r;
    std::string id = q.Text(0);
    TRAINCTL_RETURN_IF_ERROR(
        ParseBlob(q.Blob(1), &r, absl::StrCat("revoked_workers row '", id, "'")));
    if (r.worker_id() != id) {
      return absl::DataLossError(absl::StrCat("state store: revoked_workers row '", id,
                                              "' holds worker '", r.worker_id(), "'"));
    }
    out.push_back(std::move(r));
  }
  return out;
}

absl::Status AuthTables::PutOwnerNumber(const std::string& owner, int64_t number) {
  if (number <= 0)
    return absl::InvalidArgumentError("state store: PutOwnerNumber: a number is >= 1");
  StoreCore& s = core_;
  absl::MutexLock lock(&s.mu);
  const std::string op = absl::StrCat("PutOwnerNumber('", owner, "', ", number, ")");
  TRAINCTL_RETURN_IF_ERROR(s.InjectedFault(op));
  // A taken owner or number is AlreadyExists (the UNIQUE constraints).
  return Query(s.db, s.stmts->put_owner_number, op).Bind(1, owner).Bind(2, number).Run();
}

absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> AuthTables::LoadOwnerNumbers() {
  StoreCore& s = core_;
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

}  // namespace trainctl::coordinator
