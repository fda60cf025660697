// ShmAllReduce: a sum all-reduce through POSIX shared memory, for the ranks of
// an attempt that all run on one host (the Gloo engine uses it for float
// buffers, 16-bit ones included, when GlooOptions::all_ranks_local).
//
// Why: between two processes on one host Gloo moves a buffer through two
// loopback TCP streams (kernel copies, its device thread, the sum): 9 ms for
// 9.5 MB on a 2-core VM. Through shared memory it is a copy in of what the
// peers sum, a sum of this rank's share, and a copy out of the peers' shares
// (~2 ms).
//
// Per chunk (slot_bytes per rank): every rank copies into its slot the
// parts the others sum; barrier; rank r sums elements [r*n/W, (r+1)*n/W)
// in rank order, its own values taken from its buffer and the others' from
// their slots, into its own slot and its buffer; barrier; every rank copies
// each other share from its owner's slot; barrier. Each element is summed
// once, by one rank, in a fixed order, so every rank ends with
// bitwise-identical results.
//
// The barrier spins briefly, then sleeps on a futex in the segment. A peer
// that died (its pid is gone), Break() from any rank, or the deadline end the
// wait with an error; the segment is then broken for every rank.
//
// Shared blocks: NewSharedBlock() maps a second segment with one block per
// rank, and hands this rank its own. A buffer inside it is reduced without a
// copy in or out: every rank sums its share straight from every rank's block
// and writes the sum into all of them (the GradientBucketer keeps its buckets
// there, through Collectives::AllocateShared). Same order of the sum, same
// bytes on every rank as the slot path. Each all-reduce checks that every
// rank passed the same kind of buffer (block, offset, count); a mismatch is
// an Internal error on every rank, never a mixed sum.
//
// Rendezvous: rank 0 creates the segment under a random name, publishes the
// name in the store, and unlinks it once every rank has opened it (so a crash
// leaves nothing behind in /dev/shm after start-up).
//
// Threading: AllReduceSum from one thread at a time (the engine's thread);
// Break() from any thread.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/dist/collectives.h"
#include "worker/dist/rendezvous_store.h"

namespace trainctl::dist {

class ShmAllReduce {
 public:
  // Creates (rank 0) or opens (the others) the segment of world_size slots of
  // at most `slot_bytes`, exchanging its name through `store` under
  // `key_prefix` (its Get calls wait up to the store's timeout). Unavailable
  // (and the caller keeps using Gloo) when shared memory is missing or too
  // small on any rank, e.g. a container with a tiny /dev/shm.
  static absl::StatusOr<std::unique_ptr<ShmAllReduce>> Create(int rank, int world_size,
                                                              size_t slot_bytes,
                                                              RendezvousStore& store,
                                                              const std::string& key_prefix);
  ~ShmAllReduce();
  ShmAllReduce(const ShmAllReduce&) = delete;
  ShmAllReduce& operator=(const ShmAllReduce&) = delete;

  static bool Supports(CommDataType type) {
    return type == CommDataType::kFloat32 || type == CommDataType::kFloat64 ||
           type == CommDataType::kFloat16 || type == CommDataType::kBFloat16;
  }

  // Sums `count` elements at `data` across the ranks, in place. Every rank
  // calls it with the same count and type, in the same order.
  // DeadlineExceeded at `deadline` (on MonotonicNow(), common/clock.h: a
  // stepped wall clock neither ends the wait early nor stretches it);
  // Unavailable when a peer died; Aborted after Break().
  absl::Status AllReduceSum(void* data, size_t count, CommDataType type, absl::Time deadline);

  // Marks the segment broken and wakes every waiter (here and in the peers).
  void Break();

  // A block of `bytes` in shared memory that this engine all-reduces in
  // place (see "Shared blocks" above); every rank calls it with the same
  // size, in the same order, under a `key_prefix` used once. Null, on every
  // rank alike, when shared memory for it is missing on any rank (the caller
  // then uses private memory). The block stays mapped while the returned
  // pointer or this object lives. Thread-safe with AllReduceSum.
  absl::StatusOr<std::shared_ptr<void>> NewSharedBlock(size_t bytes, RendezvousStore& store,
                                                       const std::string& key_prefix);

  struct Header;   // the segment's first page (shm_allreduce.cc)
  struct Mapping;  // one mmap of a segment

 private:
  struct SharedBlock {
    std::shared_ptr<Mapping> map;  // world_ blocks, `stride` apart
    size_t stride;
    size_t bytes;
  };
  // Where a buffer lies in a shared block: block `index`, `offset` bytes
  // into this rank's block; rank r's block starts at base + r * stride.
  struct InBlock {
    size_t index;
    size_t offset;
    char* base;
    size_t stride;
  };

  static absl::StatusOr<std::shared_ptr<Mapping>> MapSegment(int rank, int world_size,
                                                             size_t length, RendezvousStore& store,
                                                             const std::string& key_prefix);
  ShmAllReduce(int rank, int world_size, size_t slot_bytes, std::shared_ptr<Mapping> segment);
  Header* header() const;
  absl::Status Barrier(absl::Time deadline);
  char* Slot(int r) const;
  std::optional<InBlock> FindBlock(const void* data, size_t bytes) const;
  // The op this rank is about to reduce (block 0 = private memory), and the
  // check after the first barrier that every rank announced the same.
  void AnnounceOp(uint64_t block, uint64_t offset, uint64_t count);
  absl::Status CheckSameOp(uint64_t block, uint64_t offset, uint64_t count);
  absl::Status SharedBlockSum(const InBlock& in, size_t count, CommDataType type,
                              absl::Time deadline);

  const int rank_;
  const int world_;
  const size_t slot_bytes_;
  const std::shared_ptr<Mapping> segment_;
  mutable absl::Mutex blocks_mu_;
  std::vector<SharedBlock> blocks_ ABSL_GUARDED_BY(blocks_mu_);
};

}  // namespace trainctl::dist
