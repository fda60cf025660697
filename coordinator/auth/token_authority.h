// Who is calling, and may they: the coordinator's bearer tokens.
//
// Holds every token (role, expiry, revocation; only the SHA-256 of each
// secret) in memory, backed by the state store, plus the bootstrap admin
// secret from --admin-token-file (never stored: rotate it by changing the
// file and restarting). Authenticate() turns an `authorization` header into
// a Principal or says why not; Authorize() checks a Principal's role for a
// call. Worker ids are bound to the token that first registered them, so no
// other token can take a worker's id (BindWorker).
//
// Called by the gRPC services (service_support.cc, auth_service.cc) from any
// thread. Also holds the revoked worker certificates (RevokeWorkerCert),
// which WorkerService checks at every Session open and message. Thread-safe: one absl::Mutex guards
// the maps; store writes happen under it (the store never calls back), so memory follows the disk.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "coordinator/store/state_store.h"
#include "trainctl/v1/auth.pb.h"

namespace trainctl::coordinator {

// The caller of an RPC, as its token says.
struct Principal {
  // The token's id ("admin-file" for the bootstrap admin secret).
  std::string token_id;
  // The token's name (shown as a job's owner).
  std::string name;
  v1::Role role = v1::ROLE_UNSPECIFIED;
  // The addresses the admin authorised for the worker holding the token
  // (Token.addresses; join and worker tokens). A worker's rendezvous reports
  // may name these; a joined worker's certificate names only these.
  std::vector<std::string> addresses = {};
  // The queues a submitter or admin token may submit to (Token.queues); the
  // first is where a job naming none goes. Empty: any queue.
  std::vector<std::string> queues = {};
};

// A host name or IP address a worker may be reached at: at most 253
// characters of [A-Za-z0-9.:_-] (join token --address, JoinRequest).
bool ValidWorkerAddress(absl::string_view address);

// "admin", "submitter", "viewer", "worker", "join".
std::string RoleName(v1::Role role);
// The inverse; InvalidArgument naming the choices.
absl::StatusOr<v1::Role> ParseRole(absl::string_view name);

class TokenAuthority {
 public:
  // The id the bootstrap admin secret (--admin-token-file) goes by.
  static constexpr char kBootstrapAdminId[] = "admin-file";
  // A join token's lifetime when its request gives none.
  static constexpr absl::Duration kDefaultJoinTtl = absl::Hours(24);
  // The token id a certificate worker's id is bound to ("cert:" + id), so
  // that no token worker can take an id a certificate was issued for.
  static std::string CertBinding(const std::string& worker_id) { return "cert:" + worker_id; }
  // At most this many authorised addresses per token.
  static constexpr int kMaxTokenAddresses = 16;
  // Serials remembered per worker id for RevokeWorkerCert's record.
  static constexpr size_t kMaxSerialsSeen = 8;

  TokenAuthority(StateStore* store, const Clock* clock) : store_(store), clock_(clock) {}

  // Loads tokens and worker bindings from the store.
  absl::Status Load();
  // The bootstrap admin secret; "" disables it.
  void SetBootstrapAdmin(const std::string& secret);

  // The principal of an `authorization` header value ("Bearer <secret>").
  // Unauthenticated, saying which: missing, malformed, unknown, revoked,
  // expired, or an already used one-time token.
  absl::StatusOr<Principal> Authenticate(absl::string_view authorization) const;
  // OK when `who` has one of `roles`; PermissionDenied naming the call, the
  // roles it needs and the caller's.
  static absl::Status Authorize(const Principal& who, absl::string_view call,
                                absl::Span<const v1::Role> roles);

  // Whether the token `who` was authenticated with still holds: OK, or
  // Unauthenticated (revoked, expired, no longer known) saying which. What a
  // long call (a stream, a worker's session) re-checks while it lasts
  // (LiveCalls). The bootstrap admin and certificate workers ("cert:" ids,
  // not tokens) are OK here: neither is revoked through this authority.
  absl::Status StillValid(const Principal& who) const;
  // Calls `fn(token_id)` after each revocation (from the revoking thread,
  // outside the lock), so that live calls of that token end at once rather
  // than at their next periodic check. Set before the first Revoke.
  void OnRevoke(std::function<void(const std::string& token_id)> fn) { on_revoke_ = std::move(fn); }

  // Admin calls. InvalidArgument for a bad name, role or ttl. Join tokens
  // are made one-time, with kDefaultJoinTtl when ttl is zero.
  absl::StatusOr<v1::CreateTokenResponse> Create(const v1::CreateTokenRequest& req,
                                                 const Principal& by);
  std::vector<v1::Token> List(bool include_revoked) const;
  // Idempotent; NotFound for an unknown id.
  absl::StatusOr<v1::Token> Revoke(const std::string& id);

  // Marks one-time token `token_id` used, on disk then in memory;
  // Unauthenticated when it already was (so of two concurrent uses exactly
  // one succeeds), InvalidArgument when it is not one-time.
  absl::Status ConsumeOneTime(const std::string& token_id);
  // Whether `worker_id` is bound to a token or a certificate.
  bool WorkerBound(const std::string& worker_id) const;

  // Binds `worker_id` to `who`'s token when unbound; PermissionDenied when
  // it already belongs to another token.
  absl::Status BindWorker(const std::string& worker_id, const Principal& who);
  // PermissionDenied when `worker_id` is bound to a token other than `who`'s.
  absl::Status CheckWorker(const std::string& worker_id, const Principal& who) const;

  // --- worker certificates ---------------------------------------------------
  // Revocation is by worker id (a certificate's CN): ids are never reused
  // (Join refuses known ids), so revoking the id revokes every certificate
  // issued for it, including a hand-made `worker-cert` this coordinator never
  // saw. The serials seen for the id are recorded with it as well.

  // Records that a session presented certificate `serial` for `worker_id`
  // (memory only: what RevokeWorkerCert lists).
  void NoteCertSerial(const std::string& worker_id, const std::string& serial);
  // Revokes, on disk then in memory; idempotent (newly_revoked false).
  // InvalidArgument for an empty id.
  absl::StatusOr<v1::RevokeWorkerResponse> RevokeWorkerCert(const std::string& worker_id);
  // PermissionDenied, saying when, when the certificate (`worker_id` = its
  // CN, `serial` its serial) was revoked; OK otherwise.
  absl::Status CheckCert(const std::string& worker_id, const std::string& serial) const;

 private:
  StateStore* const store_;
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, StoredToken> tokens_ ABSL_GUARDED_BY(mu_);
  // worker id -> token id.
  absl::flat_hash_map<std::string, std::string> bindings_ ABSL_GUARDED_BY(mu_);
  // Revoked worker ids -> their record; revoked serials -> worker id.
  absl::flat_hash_map<std::string, v1::RevokeWorkerResponse> revoked_workers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> revoked_serials_ ABSL_GUARDED_BY(mu_);
  // Serials seen per worker id (bounded by kMaxSerialsSeen per id).
  absl::flat_hash_map<std::string, std::vector<std::string>> seen_serials_ ABSL_GUARDED_BY(mu_);
  // SHA-256 hex of the bootstrap admin secret; "" when none.
  std::string admin_hash_ ABSL_GUARDED_BY(mu_);
  // Set once before serving (OnRevoke); read after each Revoke.
  std::function<void(const std::string&)> on_revoke_;
};

}  // namespace trainctl::coordinator
