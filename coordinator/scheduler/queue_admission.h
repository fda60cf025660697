// Quota accounting for one scheduling pass: what each queue and cohort uses
// of its nominal quota, what the quota admits, the fair-share order of the
// queues, and preemption victims. Internal to the scheduler: scheduler.h's
// "Queues" policy list is the contract; this file implements its arithmetic
// so that scheduler.cc keeps only placement.
//
// Threading: one instance per Schedule() call; not thread-safe.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "coordinator/scheduler/scheduler.h"

namespace trainctl::scheduler::internal {

inline constexpr int kNumKinds = 2;
inline int KindIndex(SlotKind kind) { return kind == SlotKind::kGpu ? 0 : 1; }

// The dimensions quota is counted in (scheduler.h, "Resource quotas" and
// "Flavor quotas"): the two slot kinds (KindIndex), thousandths of a CPU
// and bytes of memory (the base dimensions, in every pass), then one per
// GPU flavor some queue has a nominal for, sorted by flavor
// (QueueBook::FlavorDim): GPU slots of that flavor.
inline constexpr int kBaseDims = 4;
inline constexpr int kCpusDim = 2;
inline constexpr int kMemoryDim = 3;
// A job's holding in each dimension (per rank, or in all); sized
// QueueBook::dims() (QueueBook::Zero()).
using Demand = absl::InlinedVector<long long, 8>;
// a x b (each >= 0) saturated at 2^53: above every quota (< 1e15) and far
// below kUnbounded, so that sums of a pass's jobs cannot overflow whatever
// a stored row asks.
inline long long Times(long long a, long long b) {
  constexpr long long kHuge = 1LL << 53;
  if (a <= 0 || b <= 0) return 0;
  return a > kHuge / b ? kHuge : std::min(kHuge, a * b);
}
// The job field a base dimension's quota refuses, for messages:
// "world_size", "resources.cpus", "resources.memory".
const char* DimField(int d);
// "3 cuda slots", "1.5 cpus", "64 GiB memory" (a base dimension).
std::string DimAmount(int d, long long amount);

// Larger than any slot count: an unlimited quota's headroom.
inline constexpr long long kUnbounded = 1LL << 60;

// InvalidArgument naming the field for malformed queues or running jobs.
absl::Status ValidateQueues(absl::Span<const PendingJob> jobs, const QueueInput& input);

// What the quota says about more slots of a kind for a queue now.
enum class Admission {
  // The queue has no finite nominal for the kind: quota never limits it.
  kUnlimited,
  // Fits the queue's own nominal, and its group has room.
  kWithinNominal,
  // Fits the queue's own nominal, but its cohort lent that room out.
  kReclaim,
  // Exceeds the queue's nominal; the group's idle quota covers the excess.
  kBorrow,
  // Exceeds the queue's nominal and what its group has idle.
  kOverQuota,
};

// Running jobs chosen to free slots and quota for one pending job.
struct VictimChoice {
  // True when `victims` (possibly none: stopping jobs suffice) free enough.
  bool enough = false;
  // In pick order; empty when !enough.
  std::vector<const RunningJob*> victims;
  // Stopping jobs (sorted by id) of the kind, whose slots are coming free,
  // or holding quota in a dimension the job needs.
  std::vector<const RunningJob*> stopping;
};

class QueueBook {
 public:
  // `input` must have passed ValidateQueues. Holds pointers into it.
  explicit QueueBook(const QueueInput& input);

  // True when no queue is defined: one implicit unlimited "default" queue.
  bool implicit() const { return implicit_; }
  // The dimensions of this pass: kBaseDims, then one per flavor with a
  // nominal in some queue.
  int dims() const { return kBaseDims + static_cast<int>(flavors_.size()); }
  // The dimension of GPU flavor `flavor`, or -1 when no queue has a nominal
  // for it (it is then limited by no flavor quota); the flavor of one.
  int FlavorDim(const std::string& flavor) const;
  const std::string& DimFlavor(int d) const { return flavors_[d - kBaseDims]; }
  // A Demand of dims() zeros.
  Demand Zero() const { return Demand(static_cast<size_t>(dims()), 0); }
  // One rank of a job of `kind` asking `milli_cpus` and `memory` per rank,
  // and (a GPU job) for GPU flavor `flavor` ("" none).
  Demand PerRank(SlotKind kind, long long milli_cpus, long long memory,
                 const std::string& flavor = "") const;
  // The queue a job or running job names ("" = "default"), or -1 when it is
  // not defined. Always 0 when implicit.
  int Find(const std::string& name) const;
  const std::string& Name(int q) const { return queues_[q].name; }
  int size() const { return static_cast<int>(queues_.size()); }
  // max_job_size, or kUnbounded when none.
  long long MaxJobSize(int q) const;

  bool Finite(int q, int d) const { return queues_[q].nominal[d] >= 0; }
  // The most of dimension `d` the queue's jobs can ever hold: its group's
  // nominal (its own plus all its cohort could lend), within its borrowing
  // limit; kUnbounded if unlimited.
  long long Ceiling(int q, int d) const;
  // What the quota says about `ranks` more ranks of `per_rank`, over every
  // dimension it uses (see "Resource quotas").
  Admission Admit(int q, const Demand& per_rank, long long ranks) const;
  // Ranks of `per_rank` the queue may still take now: per dimension the
  // group's nominal minus its used, without `borrow` also at most the
  // queue's nominal minus its used; the least over the dimensions used.
  // kUnbounded when unlimited; never negative.
  long long Headroom(int q, const Demand& per_rank, bool borrow) const;
  // Counts a placement of this pass: `ranks` of `per_rank`, of kind `kind`,
  // of a job of `owner`.
  void Charge(int q, SlotKind kind, const Demand& per_rank, long long ranks,
              const std::string& owner);
  // Counts `slots` more of flavor dimension `d` for queue q: the ranks of a
  // GPU job that asked for no flavor, placed on that flavor's workers.
  void ChargeFlavor(int q, int d, long long slots);
  // Total slots of each kind on schedulable workers: the entitlement of a
  // queue without quota and of every owner (see scheduler.h, "Fair share").
  void SetCapacity(const std::array<long long, kNumKinds>& capacity) { capacity_ = capacity; }
  // Weighted dominant share (see scheduler.h, "Fair share").
  double Share(int q) const;
  // The same for `owner` among the jobs of queue `q`.
  double OwnerShare(int q, const std::string& owner) const;
  // Slots of all kinds the queue holds: running plus placed in this pass
  // (the first tie-break between equal shares).
  long long UsedSlots(int q) const;

  // Victims for a job of `priority` needing `ranks` of `per_rank` (kind
  // `kind`) in queue `q` (within its nominal), given `available` slots
  // usable for it now. A job asking for a GPU flavor (`flavor` not "")
  // counts only the slots of victims and stopping jobs of that flavor as
  // freed for it (others still free quota).
  VictimChoice ChooseVictims(int q, SlotKind kind, int priority, const Demand& per_rank,
                             long long ranks, long long available,
                             const std::string& flavor = "") const;

  // "queue a: 2 of 4 cuda used, cohort c: 6 of 8" for messages.
  std::string QuotaText(int q, int d) const;
  // For a job of `ranks` x `per_rank`: QuotaText of each finite dimension
  // it uses that does not admit it within nominal (all finite ones it uses
  // when every one does), "; "-joined; the slot kind's when none is finite.
  std::string QuotaText(int q, const Demand& per_rank, long long ranks) const;

 private:
  struct Queue {
    std::string name;
    std::string cohort;
    // Index into groups_.
    int group = 0;
    // Every Demand here and in Group sized dims().
    Demand nominal;  // per dimension; -1 = unlimited
    // The most beyond nominal it may hold; -1 = no limit.
    Demand borrow_limit;
    // Of nominal, what it never lends (nominal - lending limit); 0 without
    // a lending limit. Its used counts in its group's used only beyond it.
    Demand guaranteed;
    std::array<double, kNumKinds> usage{};
    double weight = 1;
    // Per owner: weight, decayed usage, and what this pass placed for it.
    struct Owner {
      double weight = 1;
      std::array<double, kNumKinds> usage{};
      std::array<long long, kNumKinds> placed{};
    };
    absl::flat_hash_map<std::string, Owner> owners;
    long long max_job_size = 0;
    // Running (stopping included) plus placed in this pass.
    Demand used;
    // Of `used`: what stopping running jobs hold.
    Demand stopping;
    // Slots placed in this pass (for the share).
    std::array<long long, kNumKinds> placed{};
  };
  // A cohort, or a queue without one; sums over member queues with a finite
  // nominal for the dimension: nominal = what they lend (nominal -
  // guaranteed), used = Lent() of each.
  struct Group {
    std::vector<int> members;
    Demand nominal;
    Demand used;
  };

  // What a running job holds in every dimension (its flavor's by its
  // gpu_flavor).
  Demand Held(const RunningJob& job) const;
  // A queue of the pass with every dimension unlimited.
  Queue Unlimited(std::string name) const;
  // One dimension's admission (the slot rules of scheduler.h).
  Admission AdmitDim(int q, int k, long long amount) const;
  // What `used` of dimension k of queue `queue` takes from its group: the
  // part beyond its guaranteed quota.
  static long long Lent(const Queue& queue, int k, long long used) {
    return std::max(0LL, used - queue.guaranteed[k]);
  }
  // Recomputes groups_[g].used[k] from its members' used.
  void Recount(int g, int k);

  bool implicit_ = true;
  // The flavors with a dimension (dims() - kBaseDims of them), sorted, and
  // each one's dimension.
  std::vector<std::string> flavors_;
  absl::flat_hash_map<std::string, int> flavor_dim_;
  // Sorted by name.
  std::vector<Queue> queues_;
  absl::flat_hash_map<std::string, int> by_name_;
  std::vector<Group> groups_;
  std::array<long long, kNumKinds> capacity_{};
  // Running jobs with a queue index, sorted by job id.
  std::vector<std::pair<const RunningJob*, int>> running_;
};

}  // namespace trainctl::scheduler::internal
