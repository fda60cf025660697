// The store's identity tables (StateStore::auth()): bearer tokens (stored
// by the hash of their secret, never the secret), which token each worker id
// belongs to, revoked worker certificates -- all the TokenAuthority's -- and
// the number each job owner runs its ranks under (OwnerNumbers;
// StartRanks.owner_number).
//
// Each write is one statement (its own transaction).
// Threading: every method takes the store's one lock (state_store.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainctl/v1/auth.pb.h"

namespace trainctl::coordinator {

class StateStore;
namespace store_internal {
struct StoreCore;
}  // namespace store_internal

// A bearer token as stored: the listed record and the SHA-256 (hex) of its
// secret. The secret itself is never stored.
struct StoredToken {
  v1::Token token;
  std::string secret_hash;
};

class AuthTables {
 public:
  AuthTables(const AuthTables&) = delete;
  AuthTables& operator=(const AuthTables&) = delete;

  // Inserts or replaces a token (by id) with the hash of its secret.
  absl::Status PutToken(const v1::Token& token, const std::string& secret_hash);
  // Every stored token, ascending by id. DataLoss naming the row when one
  // does not parse.
  absl::StatusOr<std::vector<StoredToken>> LoadTokens();
  // Records that `worker_id` belongs to `token_id`; a binding, once stored,
  // is never replaced (a second call for the same worker is a no-op).
  absl::Status PutWorkerBinding(const std::string& worker_id, const std::string& token_id);
  // (worker id, token id) for every binding, ascending by worker id.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> LoadWorkerBindings();
  // Inserts or replaces the revocation record of a worker's certificates.
  absl::Status PutRevokedWorker(const v1::RevokeWorkerResponse& revoked);
  // Every revocation record, ascending by worker id; DataLoss naming the row
  // when one does not parse.
  absl::StatusOr<std::vector<v1::RevokeWorkerResponse>> LoadRevokedWorkers();
  // Records `owner`'s number (StartRanks.owner_number). AlreadyExists when
  // the owner has one or another owner has that number: a number is given
  // once.
  absl::Status PutOwnerNumber(const std::string& owner, int64_t number);
  // (owner, number) for every owner, ascending by number.
  absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> LoadOwnerNumbers();

 private:
  friend class StateStore;
  explicit AuthTables(store_internal::StoreCore& core) : core_(core) {}
  store_internal::StoreCore& core_;
};

}  // namespace trainctl::coordinator
