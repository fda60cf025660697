// The address a worker advertises when `--address` is not given: the IP of
// this host on its route to the coordinator (the source address the kernel
// picks to reach it), as Ray picks a node's IP. A host name is what a
// worker used to advertise; across hosts it often resolves to nothing, or to
// 127.0.1.1 (Debian's /etc/hosts), and the coordinator accepts only an
// address it can verify (the one the worker connects from, or one its token
// or certificate names), so the README's cluster could not run a job
// spanning two workers. Any thread; sends nothing (a UDP connect only asks
// the routing table).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace trainctl::worker {

// The source IP this host uses to reach `coordinator` ("host:port" or
// "[v6]:port"), as text; NotFound when the host does not resolve,
// Unavailable when no route reaches it. An IPv4 route comes first.
absl::StatusOr<std::string> RouteSourceAddress(const std::string& coordinator);

}  // namespace trainctl::worker
