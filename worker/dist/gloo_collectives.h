// Gloo engine of the Collectives interface (collectives.h): CPU buffers, Gloo
// over TCP. Built only when Gloo's headers and library were found
// (TRAINCTL_HAVE_GLOO; pip LibTorch on GPU machines may lack them), so callers
// guard their use with `#if TRAINCTL_HAVE_GLOO`.
//
// Rendezvous: every rank connects to the attempt's RendezvousStore (a
// c10d::TCPStore hosted by rank 0, rendezvous_store.h), publishes the address
// of its Gloo TCP device under `key_prefix`, and connects a full mesh of TCP
// pairs. The rank process calls CreateGlooCollectives once at start-up.
//
// Threading: the engine owns one worker thread that runs collectives one at a
// time in issue order (Gloo pairs carry one collective at a time per tag, and
// issue order is what every rank agrees on). Issuing, Wait and Abort are
// thread-safe. Destroying the engine aborts it and joins the worker thread,
// which may take up to the timeout when a collective is stuck inside Gloo.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/dist/collectives.h"
#include "worker/dist/rendezvous_store.h"

namespace trainctl::dist {

struct GlooOptions {
  int rank = 0;
  int world_size = 1;
  // Address this rank's Gloo TCP device binds to and advertises to its peers
  // (loopback for single-host jobs; the host's address on the job network
  // otherwise).
  std::string bind_host = "127.0.0.1";
  // Bounds rendezvous and every collective: a dead or stalled peer becomes an
  // error after this long at the latest.
  absl::Duration timeout = absl::Minutes(5);
  // Scopes the store keys, e.g. by job attempt, so that ranks of a stale
  // attempt sharing a store never pair up with the current one.
  std::string key_prefix = "trainctl/gloo/";
};

// Connects the full mesh (blocks until every rank joined or the timeout
// passed). InvalidArgument for bad options; DeadlineExceeded when a peer never
// showed up; Unavailable for transport errors.
absl::StatusOr<std::shared_ptr<Collectives>> CreateGlooCollectives(
    const GlooOptions& options, std::shared_ptr<RendezvousStore> store);

}  // namespace trainctl::dist
