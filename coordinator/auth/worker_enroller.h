// Worker TLS bootstrap: turns a join token and a worker's CSR into the
// worker's certificate, signed by the cluster CA (as kubelet's TLS
// bootstrap). The worker's key never leaves the worker.
//
// Join() checks the request (a weak key is refused), refuses ids the
// coordinator already knows (a registered worker, or an id bound to a token
// or an earlier certificate), signs a client-auth-only certificate whose
// names are only what the admin authorised with the join token (its
// addresses, never the worker's own choice), consumes the one-time token (a refused request leaves
// it usable; of two uses exactly one gets a certificate), and binds the id to the certificate, so
// that no token worker can take it.
//
// Called by AuthServiceImpl::Join on the coordinator's EventLoop (the
// registry is loop-only). Not thread-safe: runs on the loop.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/auth/pki.h"
#include "common/clock.h"
#include "coordinator/auth/token_authority.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/workers/worker_registry.h"
#include "trainctl/v1/auth.pb.h"

namespace trainctl::coordinator {

class WorkerEnroller {
 public:
  // `ca`: the cluster CA's key and certificate; an empty key disables Join
  // (FailedPrecondition: this coordinator cannot sign).
  WorkerEnroller(auth::KeyAndCert ca, TokenAuthority* tokens, WorkerRegistry* registry,
                 const Clock* clock, absl::Duration validity)
      : ca_(std::move(ca)),
        tokens_(tokens),
        registry_(registry),
        clock_(clock),
        validity_(validity) {}

  bool enabled() const { return !ca_.key_pem.empty(); }

  // `who`: the authenticated caller (must hold a join token: checked here
  // too). InvalidArgument naming the field; AlreadyExists for a known id;
  // Unauthenticated when the token was used meanwhile.
  absl::StatusOr<v1::JoinResponse> Join(const Principal& who, const v1::JoinRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // Renewal: a worker presenting its own certificate (mTLS, verified by the
  // handshake; the caller checked that it is not revoked) gets a new one for
  // a new key, with the same id and names (`sans`: the presented
  // certificate's host names and addresses, which the admin authorised
  // when it joined) and a full validity from now. `req.worker_id` must be
  // empty or the certificate's id; no token is used.
  absl::StatusOr<v1::JoinResponse> Renew(const std::string& worker_id,
                                         const std::vector<std::string>& sans,
                                         const v1::JoinRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

 private:
  // A client certificate for `id` naming `sans` and the worker URI, or
  // InvalidArgument naming csr_pem.
  absl::StatusOr<std::string> Sign(const std::string& id, std::vector<std::string> sans,
                                   const std::string& csr_pem) const;
  v1::JoinResponse Reply(const std::string& id, std::string cert_pem) const;

  const auth::KeyAndCert ca_;
  TokenAuthority* const tokens_;
  WorkerRegistry* const registry_;
  const Clock* const clock_;
  const absl::Duration validity_;
};

}  // namespace trainctl::coordinator
