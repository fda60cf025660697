// A worker's TLS bootstrap: trade a one-time join token for this worker's
// own certificate (AuthService.Join), as kubelet's TLS bootstrap does.
//
// The key is made here and never leaves the host: only a CSR is sent, over
// TLS that verifies the coordinator against the cluster CA (--ca). The
// certificate and key are kept in the work dir (mode 0600) with the id the
// coordinator gave, so a restarted worker reuses them and needs no token.
//
// Join is called once by trainctl-worker's main before the daemon starts;
// RenewCertificateIfDue by the daemon's renewal thread. No shared state.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace trainctl::worker {

struct WorkerIdentity {
  std::string worker_id;
  std::string cert_file;
  std::string key_file;
  // False: found in the work dir from an earlier join.
  bool joined_now = false;
};

// work_dir/worker.crt and worker.key.
std::string JoinedCertFile(const std::string& work_dir);
std::string JoinedKeyFile(const std::string& work_dir);

// The certificate of an earlier join in `work_dir`; NotFound when there is
// none (a key without a certificate is an interrupted join: join again).
absl::StatusOr<WorkerIdentity> JoinedIdentity(const std::string& work_dir);

struct JoinOptions {
  std::string coordinator;  // host:port, or a list (common/coordinator_failover.h)
  std::string ca_file;      // the cluster CA (PEM); required
  std::string join_token;   // the secret (role join)
  std::string work_dir;
  // Names/addresses other hosts reach this one at: the certificate's SANs.
  std::vector<std::string> addresses;
  // Keep retrying an unreachable coordinator this long.
  absl::Duration timeout = absl::Minutes(5);
  // Times that retry deadline (Mono; common/clock.h). Null: SystemClock.
  const Clock* clock = nullptr;
};

// Joins: new key, CSR, Join over TLS; writes worker.key, worker.crt and
// worker-id into the work dir. The coordinator's refusal comes back as its
// status (e.g. Unauthenticated: the token was already used).
absl::StatusOr<WorkerIdentity> Join(const JoinOptions& options);

// Renewal of a joined certificate before it expires (as kubelet's
// certificate rotation): once less than a third of its validity is left,
// a new key and CSR go to AuthService.Join over mutual TLS with the current
// certificate (no token); the coordinator signs the same id and names for a
// full validity. The new pair replaces the old one in the work dir (key,
// then certificate, each written whole; JoinedIdentity completes a swap a
// crash interrupted), and the daemon's next connection presents it.
struct RenewResult {
  bool renewed = false;
  // Why a renewal that was due failed (it is tried again at the next check).
  absl::Status error;
  // When to look again: a twentieth of the validity (1 s .. 1 h).
  absl::Duration next_check = absl::Hours(1);
  absl::Time expires;  // of the certificate in place after this call
};
RenewResult RenewCertificateIfDue(const std::string& coordinator, const std::string& ca_file,
                                  const std::string& work_dir, absl::Time now);

}  // namespace trainctl::worker
