// One-time sign-in codes for the dashboard (`trainctl dashboard`): a caller
// with a dashboard role asks AuthService.CreateSignInCode for a code; the
// browser that opens /signin?code=CODE gets the sign-in cookie of the
// caller's token, once, within kTtl. A code is 64 hex digits from the
// system's random source; at most kMaxPerToken are outstanding for one
// token (its own oldest goes first: one viewer cannot evict another's link)
// and kMaxCodes in all (a full table drops the oldest code of the token that
// holds the most). Like a device-flow code, it stands in for the token for a minute:
// whoever opens the link first is signed in.
//
// Thread-safe: the gRPC service creates, the HTTP server's threads redeem.
#pragma once

#include <cstddef>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace trainctl::coordinator {

class SignInCodes {
 public:
  static constexpr absl::Duration kTtl = absl::Seconds(60);
  static constexpr size_t kMaxCodes = 1024;
  static constexpr size_t kMaxPerToken = 16;

  explicit SignInCodes(const Clock* clock) : clock_(clock) {}

  // Where the dashboard listens, once it does (port 0: no dashboard).
  struct Endpoint {
    int port = 0;
    bool https = false;
  };
  void SetEndpoint(Endpoint e);
  Endpoint endpoint() const;

  // A new code standing for `secret` (a bearer token's secret).
  std::string Create(const std::string& secret);
  // The secret `code` stands for, once: the code is gone after this call.
  // NotFound when it is unknown, used or expired.
  absl::StatusOr<std::string> Redeem(const std::string& code);

 private:
  struct Entry {
    std::string secret;
    absl::Time expires;  // on clock_->Mono()
  };
  // Drops expired codes, then makes room for one more code of `secret`.
  void PruneLocked(const std::string& secret) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the oldest code standing for `secret`.
  void DropOldestLocked(const std::string& secret) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* clock_;
  mutable absl::Mutex mu_;
  Endpoint endpoint_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Entry> codes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, size_t> per_secret_ ABSL_GUARDED_BY(mu_);  // outstanding codes
};

}  // namespace trainctl::coordinator
