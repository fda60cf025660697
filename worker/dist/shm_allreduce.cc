#include "worker/dist/shm_allreduce.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/status_macros.h"

namespace trainctl::dist {

namespace {

constexpr int kMaxRanks = 64;
constexpr size_t kHeaderBytes = 4096;  // slots start page-aligned

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration slice) {
  timespec ts = absl::ToTimespec(slice);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Acc: the type the sum runs in. 16-bit values (a compressing DDP comm
// hook's buckets) are summed in float and rounded once, which is what a
// float16 all-reduce can best return; still one rank, one order, so every
// rank gets the same bytes.
// out[i - out_first] for i in [lo, hi).
template <typename T, typename Acc = T>
void SumShare(const char* const* srcs, int world, size_t lo, size_t hi, T* out,
              size_t out_first = 0) {
  for (size_t i = lo; i < hi; ++i) {
    Acc acc = static_cast<Acc>(reinterpret_cast<const T*>(srcs[0])[i]);
    for (int r = 1; r < world; ++r) acc += static_cast<Acc>(reinterpret_cast<const T*>(srcs[r])[i]);
    out[i - out_first] = static_cast<T>(acc);
  }
}

// Elements [lo, hi) of the sum of srcs in rank order into `slot` (read by
// the peers) and `mine` (the caller's buffer, which is also one of srcs), a
// block at a time: each block's result is copied from the slot while it is
// still in the cache, rather than written to both in the loop, where the
// compiler must assume that `mine` aliases a source at other indices.
template <typename T, typename Acc = T>
void SumShareInto(const char* const* srcs, int world, size_t lo, size_t hi, T* slot, T* mine) {
  constexpr size_t kBlock = 2048;
  for (size_t b = lo; b < hi; b += kBlock) {
    const size_t e = std::min(hi, b + kBlock);
    SumShare<T, Acc>(srcs, world, b, e, slot);
    std::memcpy(mine + b, slot + b, (e - b) * sizeof(T));
  }
}

// The element type of a CommDataType Supports takes, and the type its sum
// runs in (SumShare's Acc).
template <typename T, typename Acc = T>
struct SumTypes {
  using Elem = T;
  using Accum = Acc;
};

// Calls sum(SumTypes<...>{}) with the types of `type`.
template <typename Sum>
void WithSumTypes(CommDataType type, Sum&& sum) {
  switch (type) {
    case CommDataType::kFloat32:
      sum(SumTypes<float>{});
      return;
    case CommDataType::kFloat64:
      sum(SumTypes<double>{});
      return;
    case CommDataType::kFloat16:
      sum(SumTypes<c10::Half, float>{});
      return;
    default:  // kBFloat16 (Supports)
      sum(SumTypes<c10::BFloat16, float>{});
      return;
  }
}

// Store failures are not "no shared memory here" (Unavailable, on which the
// ranks agree to fall back): the rendezvous itself failed.
absl::Status StoreError(const absl::Status& s) {
  return absl::AbortedError(absl::StrCat("shared-memory rendezvous: ", s.message()));
}

}  // namespace

struct ShmAllReduce::Header {
  alignas(64) std::atomic<uint32_t> count;
  alignas(64) std::atomic<uint32_t> generation;
  alignas(64) std::atomic<uint32_t> broken;
  alignas(64) std::atomic<int32_t> pids[kMaxRanks];
  // What each rank passed to the all-reduce in progress, as AnnounceOp
  // writes it (block + 1, or 0 for private memory; offset; count), written
  // before its first barrier and compared after it: a buffer in a shared
  // block on one rank and private memory on another must fail, not mix.
  alignas(64) std::atomic<uint64_t> ops[kMaxRanks][3];
};
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex word");
static_assert(sizeof(ShmAllReduce::Header) <= kHeaderBytes, "header fits its page");

// One mapping of a segment; unmapped when the last owner lets go (the
// all-reduce, or a tensor over a shared block that outlives it).
struct ShmAllReduce::Mapping {
  Mapping(void* b, size_t l) : base(static_cast<char*>(b)), length(l) {}
  ~Mapping() { munmap(base, length); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  char* const base;
  const size_t length;
};

// Rank 0 creates a segment of `length` bytes under a random name and
// publishes the name under `key_prefix`; every rank maps it and says so; rank
// 0 unlinks it once all did (or gave up). Unavailable, on every rank alike,
// when any rank could not.
absl::StatusOr<std::shared_ptr<ShmAllReduce::Mapping>> ShmAllReduce::MapSegment(
    int rank, int world_size, size_t length, RendezvousStore& store,
    const std::string& key_prefix) {
  // Rank 0 creates; "" published means "no shared memory here".
  std::string name;
  std::string failure;
  if (rank == 0) {
    std::random_device rd;
    name = absl::StrCat("/trainctl-", getpid(), "-", std::to_string((uint64_t{rd()} << 32) | rd()));
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    int err = fd < 0 ? errno : posix_fallocate(fd, 0, static_cast<off_t>(length));
    if (fd >= 0) close(fd);
    if (err != 0) {
      failure = absl::StrCat("shared memory segment of ", length, " bytes: ", strerror(err));
      if (fd >= 0) shm_unlink(name.c_str());
      name.clear();
    }
    if (absl::Status s = store.Set(key_prefix + "name", name); !s.ok()) return StoreError(s);
  } else {
    absl::StatusOr<std::string> n = store.Get(key_prefix + "name");
    if (!n.ok()) return StoreError(n.status());
    name = *n;
  }
  if (name.empty()) {
    return absl::UnavailableError(failure.empty() ? "rank 0 has no shared memory" : failure);
  }

  void* base = MAP_FAILED;
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) {
    base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
  }
  if (base == MAP_FAILED && failure.empty())
    failure = absl::StrCat("opening ", name, ": ", strerror(errno));
  std::shared_ptr<Mapping> mapping;
  if (base != MAP_FAILED) mapping = std::make_shared<Mapping>(base, length);
  // Every rank says whether it mapped the segment; all use it or none does.
  if (absl::Status s = store.Set(absl::StrCat(key_prefix, "mapped/", rank), mapping ? "1" : "0");
      !s.ok()) {
    return StoreError(s);
  }
  bool all = true;
  for (int r = 0; r < world_size; ++r) {
    absl::StatusOr<std::string> v = store.Get(absl::StrCat(key_prefix, "mapped/", r));
    if (!v.ok()) return StoreError(v.status());
    all = all && *v == "1";
  }
  if (rank == 0) shm_unlink(name.c_str());  // Everyone has it mapped (or gave up).
  if (!all) {
    return absl::UnavailableError(failure.empty() ? "a peer could not map the shared memory"
                                                  : failure);
  }
  return mapping;
}

absl::StatusOr<std::unique_ptr<ShmAllReduce>> ShmAllReduce::Create(int rank, int world_size,
                                                                   size_t slot_bytes,
                                                                   RendezvousStore& store,
                                                                   const std::string& key_prefix) {
  if (world_size < 2 || world_size > kMaxRanks || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm all-reduce: rank ", rank, " of ", world_size));
  }
  slot_bytes = std::max<size_t>(slot_bytes / 64 * 64, 64 * 1024);
  const size_t length = kHeaderBytes + slot_bytes * static_cast<size_t>(world_size);
  TRAINCTL_ASSIGN_OR_RETURN(std::shared_ptr<Mapping> segment,
                            MapSegment(rank, world_size, length, store, key_prefix));
  std::unique_ptr<ShmAllReduce> shm(
      new ShmAllReduce(rank, world_size, slot_bytes, std::move(segment)));
  shm->header()->pids[rank].store(static_cast<int32_t>(getpid()));
  return shm;
}

ShmAllReduce::ShmAllReduce(int rank, int world_size, size_t slot_bytes,
                           std::shared_ptr<Mapping> segment)
    : rank_(rank), world_(world_size), slot_bytes_(slot_bytes), segment_(std::move(segment)) {}

ShmAllReduce::~ShmAllReduce() = default;

ShmAllReduce::Header* ShmAllReduce::header() const {
  return reinterpret_cast<Header*>(segment_->base);
}

char* ShmAllReduce::Slot(int r) const {
  return segment_->base + kHeaderBytes + slot_bytes_ * static_cast<size_t>(r);
}

absl::StatusOr<std::shared_ptr<void>> ShmAllReduce::NewSharedBlock(size_t bytes,
                                                                   RendezvousStore& store,
                                                                   const std::string& key_prefix) {
  // Page-aligned blocks, one per rank, back to back: rank r's at r * stride.
  const size_t stride = std::max<size_t>((bytes + 4095) / 4096 * 4096, 4096);
  absl::StatusOr<std::shared_ptr<Mapping>> m =
      MapSegment(rank_, world_, stride * static_cast<size_t>(world_), store, key_prefix);
  if (!m.ok()) {
    if (m.status().code() == absl::StatusCode::kUnavailable) return std::shared_ptr<void>();
    return m.status();
  }
  absl::MutexLock l(&blocks_mu_);
  blocks_.push_back(SharedBlock{*m, stride, bytes});
  return std::shared_ptr<void>(*m, (*m)->base + stride * static_cast<size_t>(rank_));
}

void ShmAllReduce::Break() {
  Header* h = header();
  h->broken.store(1, std::memory_order_release);
  FutexWakeAll(&h->generation);
}

absl::Status ShmAllReduce::Barrier(absl::Time deadline) {
  Header* h = header();
  const uint32_t gen = h->generation.load(std::memory_order_acquire);
  if (h->broken.load(std::memory_order_acquire) != 0) {
    return absl::AbortedError("shared-memory all-reduce broken by a rank");
  }
  if (h->count.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(world_)) {
    h->count.store(0, std::memory_order_relaxed);
    h->generation.store(gen + 1, std::memory_order_release);
    FutexWakeAll(&h->generation);
    return absl::OkStatus();
  }
  // Spin first: a peer that arrives within kSpin is met without a futex
  // sleep, whose wake-up alone costs tens of microseconds on a VM (the ranks
  // of a tiny model arrive microseconds apart, each on its own core). Past
  // it, sleep on the futex, checking the deadline and the peers' lives.
  constexpr absl::Duration kSpin = absl::Microseconds(50);
  absl::Time spin_until = absl::InfinitePast();
  for (int spins = 0; h->generation.load(std::memory_order_acquire) == gen; ++spins) {
    if (h->broken.load(std::memory_order_acquire) != 0) {
      // Broken by a rank that had passed this barrier (e.g. on a mismatch
      // CheckSameOp found): the barrier itself completed.
      if (h->generation.load(std::memory_order_acquire) != gen) break;
      return absl::AbortedError("shared-memory all-reduce broken by a rank");
    }
    if (spins < 200) {
      CpuRelax();
      continue;
    }
    if (spins == 200) spin_until = MonotonicNow() + kSpin;
    if ((spins & 63) != 0 || MonotonicNow() < spin_until) {
      CpuRelax();
      continue;
    }
    if (MonotonicNow() >= deadline) {
      Break();
      return absl::DeadlineExceededError(
          "shared-memory all-reduce: a peer rank did not arrive in time");
    }
    for (int r = 0; r < world_; ++r) {
      const int32_t pid = h->pids[r].load(std::memory_order_relaxed);
      if (r != rank_ && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
        Break();
        return absl::UnavailableError(
            absl::StrCat("shared-memory all-reduce: rank ", r, " (pid ", pid, ") exited"));
      }
    }
    FutexWait(&h->generation, gen, absl::Milliseconds(20));
  }
  return absl::OkStatus();
}

namespace {

// Sums elements [lo, hi) of `srcs` in rank order and writes the result into
// every one of `dsts` (which are the sources, one per rank), a block at a
// time through a buffer on the stack, so the loop does not alias them.
template <typename T, typename Acc = T>
void SumShareToAll(const char* const* srcs, char* const* dsts, int world, size_t lo, size_t hi) {
  constexpr size_t kBlock = 2048;
  T block[kBlock];
  for (size_t b = lo; b < hi; b += kBlock) {
    const size_t e = std::min(hi, b + kBlock);
    SumShare<T, Acc>(srcs, world, b, e, block, b);
    for (int r = 0; r < world; ++r) {
      std::memcpy(reinterpret_cast<T*>(dsts[r]) + b, block, (e - b) * sizeof(T));
    }
  }
}

}  // namespace

std::optional<ShmAllReduce::InBlock> ShmAllReduce::FindBlock(const void* data, size_t bytes) const {
  const char* p = static_cast<const char*>(data);
  absl::MutexLock l(&blocks_mu_);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const SharedBlock& b = blocks_[i];
    const char* mine = b.map->base + b.stride * static_cast<size_t>(rank_);
    if (p >= mine && p + bytes <= mine + b.bytes) {
      return InBlock{i, static_cast<size_t>(p - mine), b.map->base, b.stride};
    }
  }
  return std::nullopt;
}

absl::Status ShmAllReduce::CheckSameOp(uint64_t block, uint64_t offset, uint64_t count) {
  Header* h = header();
  for (int r = 0; r < world_; ++r) {
    const uint64_t b = h->ops[r][0].load(std::memory_order_relaxed);
    const uint64_t o = h->ops[r][1].load(std::memory_order_relaxed);
    const uint64_t c = h->ops[r][2].load(std::memory_order_relaxed);
    if (b != block || o != offset || c != count) {
      Break();
      return absl::InternalError(absl::StrCat(
          "shared-memory all-reduce: rank ", r, " passed ",
          b == 0 ? "a private buffer" : absl::StrCat("shared block ", b - 1, " at byte ", o),
          " of ", c, " elements, rank ", rank_, " ",
          block == 0 ? "a private buffer"
                     : absl::StrCat("shared block ", block - 1, " at byte ", offset),
          " of ", count, " (every rank must reduce the same buffer)"));
    }
  }
  return absl::OkStatus();
}

void ShmAllReduce::AnnounceOp(uint64_t block, uint64_t offset, uint64_t count) {
  Header* h = header();
  h->ops[rank_][0].store(block, std::memory_order_relaxed);
  h->ops[rank_][1].store(offset, std::memory_order_relaxed);
  h->ops[rank_][2].store(count, std::memory_order_relaxed);
}

absl::Status ShmAllReduce::AllReduceSum(void* data, size_t count, CommDataType type,
                                        absl::Time deadline) {
  if (!Supports(type)) {
    return absl::InvalidArgumentError(
        "shared-memory all-reduce: float32/float64/float16/bfloat16 only");
  }
  const size_t esize = CommDataTypeSize(type);
  if (std::optional<InBlock> in = FindBlock(data, count * esize)) {
    return SharedBlockSum(*in, count, type, deadline);
  }
  AnnounceOp(0, 0, count);
  const size_t per_chunk = slot_bytes_ / esize;
  char* slots[kMaxRanks];
  for (int r = 0; r < world_; ++r) slots[r] = Slot(r);
  char* bytes = static_cast<char*>(data);
  for (size_t off = 0; off < count; off += per_chunk) {
    const size_t n = std::min(per_chunk, count - off);
    char* mine = bytes + off * esize;
    const size_t lo = n * static_cast<size_t>(rank_) / static_cast<size_t>(world_);
    const size_t hi = n * static_cast<size_t>(rank_ + 1) / static_cast<size_t>(world_);
    // Only the shares the peers sum go through this rank's slot: its own
    // share it sums straight from `data` (the same values, the same order),
    // and writes the result both to its slot, for the peers, and to `data`.
    // At 2 ranks that moves 4 bytes per byte of the buffer instead of 5.5.
    std::memcpy(slots[rank_], mine, lo * esize);
    std::memcpy(slots[rank_] + hi * esize, mine + hi * esize, (n - hi) * esize);
    if (absl::Status s = Barrier(deadline); !s.ok()) return s;
    if (off == 0) TRAINCTL_RETURN_IF_ERROR(CheckSameOp(0, 0, count));
    const char* srcs[kMaxRanks];
    for (int r = 0; r < world_; ++r) srcs[r] = r == rank_ ? mine : slots[r];
    WithSumTypes(type, [&](auto types) {
      using T = typename decltype(types)::Elem;
      SumShareInto<T, typename decltype(types)::Accum>(
          srcs, world_, lo, hi, reinterpret_cast<T*>(slots[rank_]), reinterpret_cast<T*>(mine));
    });
    if (absl::Status s = Barrier(deadline); !s.ok()) return s;
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;  // summed in place above
      const size_t rlo = n * static_cast<size_t>(r) / static_cast<size_t>(world_);
      const size_t rhi = n * static_cast<size_t>(r + 1) / static_cast<size_t>(world_);
      std::memcpy(mine + rlo * esize, slots[r] + rlo * esize, (rhi - rlo) * esize);
    }
    // Nobody refills a slot before every rank has copied its results out.
    if (absl::Status s = Barrier(deadline); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Every rank's buffer is in the segment, at the same offset of its own
// block: nothing is copied in or out. Barrier (every rank's values are in
// place); rank r sums share r from every rank's buffer and writes the sum
// into every rank's buffer; barrier (every share is written, and nobody's
// buffer is touched again before every rank is done reading it). At 2 ranks
// that moves 2 bytes per byte of the buffer, half of the slot path's 4.
absl::Status ShmAllReduce::SharedBlockSum(const InBlock& in, size_t count, CommDataType type,
                                          absl::Time deadline) {
  AnnounceOp(in.index + 1, in.offset, count);
  TRAINCTL_RETURN_IF_ERROR(Barrier(deadline));
  TRAINCTL_RETURN_IF_ERROR(CheckSameOp(in.index + 1, in.offset, count));
  char* bufs[kMaxRanks];
  for (int r = 0; r < world_; ++r)
    bufs[r] = in.base + in.stride * static_cast<size_t>(r) + in.offset;
  const size_t lo = count * static_cast<size_t>(rank_) / static_cast<size_t>(world_);
  const size_t hi = count * static_cast<size_t>(rank_ + 1) / static_cast<size_t>(world_);
  WithSumTypes(type, [&](auto types) {
    SumShareToAll<typename decltype(types)::Elem, typename decltype(types)::Accum>(bufs, bufs,
                                                                                   world_, lo, hi);
  });
  return Barrier(deadline);
}

}  // namespace trainctl::dist
