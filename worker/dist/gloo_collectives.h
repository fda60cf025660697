// Gloo engine of the Collectives interface (collectives.h): CPU buffers, Gloo
// over TCP. Built only when Gloo's headers and library were found
// (TRAINCTL_HAVE_GLOO; pip LibTorch on GPU machines may lack them), so callers
// guard their use with `#if TRAINCTL_HAVE_GLOO`.
//
// Rendezvous: every rank connects to the attempt's RendezvousStore (a
// store hosted by rank 0 that only the attempt's ranks can use,
// rendezvous_store.h), publishes the address
// of its Gloo TCP device under `key_prefix`, and connects a full mesh of TCP
// pairs. The rank process calls CreateGlooCollectives once at start-up.
//
// Replicas: every all-reduce gives every rank the same bytes, whichever
// path it takes (shared memory, the small-message mesh, Gloo's ring); how,
// at each path in gloo_collectives.cc and in docs/ddp.md.
//
// Threading: the engine owns one worker thread that runs collectives one at a
// time in issue order (issue order is what every rank agrees on; each
// collective's sequence number is its Gloo tag). Issuing, Wait and Abort are
// thread-safe.
//
// Abort and timeouts: Gloo cannot interrupt a receive it is blocked in, so
// Abort() (or a Wait() that timed out) fails the pending works at once and
// closes the peer connections of the main mesh (the peers then fail fast
// too; the small-message mesh cannot be closed from outside while a receive
// holds it, its peers notice when this process exits or at the timeout),
// while the worker thread itself leaves Gloo when Gloo's own timeout fires. Buffers
// stay owned by the engine until then (CommBuffer::keep_alive). Destroying the
// engine joins an idle worker thread and detaches a stuck one.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/dist/collectives.h"
#include "worker/dist/rendezvous_store.h"

namespace gloo {
class Context;
}  // namespace gloo

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
  // All-reduces of float32/float64 buffers up to this size take the
  // small-message path: a second mesh whose pairs are in Gloo's sync mode,
  // so the engine thread reads the socket itself instead of waiting for
  // Gloo's device thread to receive and hand over (measured on a 2-core VM,
  // 12 floats between 2 ranks: p50 0.55 -> 0.055 ms, p90 3.7 -> 0.07 ms;
  // bench/ddp/allreduce_latency.cc). Kept far below the socket buffers:
  // sync sends block, and every rank sends before it receives. 0 = off;
  // only used up to 8 ranks (its all-gather takes world_size - 1 round
  // trips), and not when shared memory (below) carries the all-reduces.
  // Every rank sums the gathered buffers in rank order, so every rank gets
  // the same bytes (the sum shared memory gives too; docs/ddp.md).
  size_t small_allreduce_max_bytes = 64 * 1024;
  // Every rank of the attempt runs on this host: float32/float64 all-reduces
  // then go through shared memory (shm_allreduce.h; 9.5 MB between 2 ranks on
  // a 2-core VM: 9 ms through Gloo's TCP, ~2 ms this way), the rest through
  // Gloo. Falls back to Gloo alone when shared memory is unavailable.
  bool all_ranks_local = false;
  // Shared memory per rank (the segment holds world_size slots); larger
  // buffers go through it in chunks. Docker's default /dev/shm is 64 MB.
  size_t shm_slot_bytes = 8 << 20;
};

// Connects the full mesh (blocks until every rank joined or the timeout
// passed). InvalidArgument for bad options; DeadlineExceeded when a peer never
// showed up; Unavailable for transport errors.
absl::StatusOr<std::shared_ptr<Collectives>> CreateGlooCollectives(
    const GlooOptions& options, std::shared_ptr<RendezvousStore> store);

// A raw, connected Gloo context (full mesh of TCP pairs) under
// options.key_prefix; what CreateGlooCollectives builds on. With `sync_pairs`
// the pairs leave Gloo's device thread: a receive then reads the socket on the
// calling thread (blocking, or spinning with `busy_poll`). Sync pairs work
// only with Gloo's buffer-based algorithms (gloo::AllgatherRing and
// friends), not with gloo::allreduce(). Same errors as CreateGlooCollectives.
absl::StatusOr<std::shared_ptr<gloo::Context>> ConnectGlooContext(const GlooOptions& options,
                                                                  RendezvousStore& store,
                                                                  bool sync_pairs = false,
                                                                  bool busy_poll = false);

}  // namespace trainctl::dist
