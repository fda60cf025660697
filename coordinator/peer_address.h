// Where a worker may say its rendezvous lives: the IP of a gRPC peer, the
// host of an address, and the check that a worker's rendezvous report names
// only its own hosts. Pure functions; any thread.
#pragma once

#include <string>
#include <vector>

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
absl::Status CheckRendezvousHosts(const v1::RendezvousInfo& info, const std::vector<std::string>& own);

}  // namespace trainctl::coordinator
