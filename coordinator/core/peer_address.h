// Where a worker may say its rendezvous lives: the IP of a gRPC peer, the
// host of an address, and the check that a worker's rendezvous report names
// only its own hosts. Pure functions; any thread.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::coordinator {

// The IP address of a gRPC peer ("ipv4:10.0.0.5:4242", "ipv6:[::1]:4242",
// "ipv6:%5B::1%5D:4242"); "" for anything else.
std::string PeerIp(absl::string_view peer);

// The host of "host:port", "[v6]:port" or a bare host.
std::string HostOf(absl::string_view address);

// OK when every host a rendezvous report names (the store's address, and
// MASTER_ADDR) is one of `own`; else PermissionDenied naming the host. A
// worker that could name any host could send the other ranks of a job to a
// machine of its choosing.
absl::Status CheckRendezvousHosts(const v1::RendezvousInfo& info,
                                  const std::vector<std::string>& own);

// A host's IP addresses (textual), or why it has none.
using HostResolver =
    std::function<absl::StatusOr<std::vector<std::string>>(const std::string& host)>;

// The system resolver (getaddrinfo: /etc/hosts, then DNS), waited for at
// most `timeout`: a registration waits on it, on the coordinator's loop, so
// a resolver that hangs must not hold the loop (the lookup goes on in a
// thread of its own and its late answer is dropped).
absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host,
                                                     absl::Duration timeout);

// Whether the coordinator accepts the address a worker registers
// (Register.address, "" for none) as its own, decided once per
// registration so that a refusal is said then, not when a job's rendezvous
// times out. Accepted when its host is `peer_ip` (the address the session
// comes from) or one of `vouched` (its token's addresses, its
// certificate's names), or is a name `resolve` maps to one of those; a
// loopback address (or a name resolving to one) is accepted from a
// loopback peer (both are this host). `accepted_host` is the host to add
// to the worker's own hosts; `refused` says why not and which flag fixes
// it.
struct AddressVerdict {
  bool accepted = false;
  std::string accepted_host;
  std::string refused;
};
AddressVerdict JudgeWorkerAddress(const std::string& address, const std::string& peer_ip,
                                  const std::vector<std::string>& vouched,
                                  const HostResolver& resolve);

}  // namespace trainctl::coordinator
