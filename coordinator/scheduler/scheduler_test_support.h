// What the scheduler's tests share: builders for workers and jobs, result
// formatting, the invariant checker every test runs through Check(), and a
// tiny cluster simulator. Test-only; single-threaded.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/scheduler/scheduler.h"
#include "gtest/gtest.h"

namespace trainctl::scheduler {

// ---------------------------------------------------------------------------
// Builders.

inline WorkerSlots Worker(std::string id, SlotKind kind, std::vector<int> free, int total = -1,
                          bool schedulable = true) {
  WorkerSlots w;
  w.worker_id = std::move(id);
  w.kind = kind;
  w.total_slots = total < 0 ? static_cast<int>(free.size()) : total;
  w.free_slots = std::move(free);
  w.schedulable = schedulable;
  return w;
}

// A GPU worker with `total` devices of which `free` are free (the lowest indices).
inline WorkerSlots Gpu(std::string id, int free, int total = -1) {
  std::vector<int> slots(free);
  for (int i = 0; i < free; ++i) slots[i] = i;
  return Worker(std::move(id), SlotKind::kGpu, std::move(slots), total < 0 ? free : total);
}

inline WorkerSlots Cpu(std::string id, int free, int total = -1) {
  std::vector<int> slots(free);
  for (int i = 0; i < free; ++i) slots[i] = i;
  return Worker(std::move(id), SlotKind::kCpu, std::move(slots), total < 0 ? free : total);
}

inline PendingJob Job(std::string id, int world_size,
                      DeviceRequirement device = DeviceRequirement::kCuda, int priority = 0,
                      std::uint64_t seq = 0) {
  PendingJob j;
  j.job_id = std::move(id);
  j.world_size = world_size;
  j.device = device;
  j.priority = priority;
  j.submit_seq = seq;
  return j;
}

// `job` on exactly `nodes` workers (scheduler.h, "Nodes").
// A worker whose GPUs are of `flavor`; a job that asks for that flavor.
inline WorkerSlots Flavored(WorkerSlots w, std::string flavor) {
  w.gpu_flavor = std::move(flavor);
  return w;
}
inline PendingJob OfFlavor(PendingJob job, std::string flavor) {
  job.gpu_flavor = std::move(flavor);
  return job;
}

inline PendingJob OnNodes(PendingJob job, int nodes) {
  job.nodes = nodes;
  return job;
}

// Ranks per worker of a job with nodes (0: no per-host shape or invalid).
inline int PerNode(const PendingJob& job) {
  return job.nodes > 0 && job.world_size > 0 && job.world_size % job.nodes == 0
             ? job.world_size / job.nodes
             : 0;
}

// A job with nodes that the scheduler refuses as kInvalidJob.
inline bool InvalidNodes(const PendingJob& job) {
  const bool elastic = job.min_world_size >= 1 && job.min_world_size < job.world_size;
  return job.nodes != 0 && (job.nodes < 0 || PerNode(job) == 0 || elastic);
}

// Resources (scheduler.h, "Resources").
inline constexpr std::int64_t kGiB = std::int64_t{1} << 30;

// `w` with allocatable CPUs and memory (0 = unknown), enforcing limits or
// not, and what its running ranks reserve.
inline WorkerSlots Sized(WorkerSlots w, double cpus, std::int64_t memory, bool enforces = true,
                         double reserved_cpus = 0, std::int64_t reserved_memory = 0) {
  w.allocatable_cpus = cpus;
  w.allocatable_memory = memory;
  w.enforces_limits = enforces;
  w.reserved_cpus = reserved_cpus;
  w.reserved_memory = reserved_memory;
  return w;
}

// `job` asking for `cpus` and `memory` bytes per rank.
inline PendingJob Needs(PendingJob job, double cpus, std::int64_t memory = 0) {
  job.cpus = cpus;
  job.memory_bytes = memory;
  return job;
}

inline bool HasResources(const PendingJob& job) {
  return job.cpus > 0 || job.memory_bytes > 0 || job.other_limits;
}

// The ranks of `job` that `w` could hold idle (a second, plain reading of
// the rule: whole ranks within total slots and the known allocatable; none
// on a worker that does not enforce limits).
inline long long IdleRanks(const PendingJob& job, const WorkerSlots& w) {
  long long n = w.total_slots;
  if (!HasResources(job)) return n;
  if (!w.enforces_limits) return 0;
  if (job.cpus > 0 && w.allocatable_cpus > 0) {
    n = std::min<long long>(n, static_cast<long long>(w.allocatable_cpus / job.cpus + 1e-9));
  }
  if (job.memory_bytes > 0 && w.allocatable_memory > 0) {
    n = std::min<long long>(n, w.allocatable_memory / job.memory_bytes);
  }
  return n;
}

// "a:0,1 b:3" -- worker a slots 0 and 1 (ranks 0-1), then worker b slot 3.
inline std::string Layout(const Placement& p) {
  std::vector<std::string> nodes;
  std::string current_worker;
  std::vector<int> slots;
  auto flush = [&] {
    if (!slots.empty())
      nodes.push_back(absl::StrCat(current_worker, ":", absl::StrJoin(slots, ",")));
    slots.clear();
  };
  for (const RankAssignment& r : p.ranks) {
    if (r.worker_id != current_worker) {
      flush();
      current_worker = r.worker_id;
    }
    slots.push_back(r.slot);
  }
  flush();
  return absl::StrJoin(nodes, " ");
}

// job id -> layout, or "pending:<reason>".
inline std::map<std::string, std::string> Outcome(const ScheduleResult& result) {
  std::map<std::string, std::string> out;
  for (const Placement& p : result.placements) out[p.job_id] = Layout(p);
  for (const PendingJobStatus& p : result.pending) {
    out[p.job_id] = absl::StrCat("pending:", PendingReasonName(p.reason));
  }
  return out;
}

// Everything in a result, for equality under permutation.
inline std::string Dump(const ScheduleResult& result) {
  std::string s;
  for (const Placement& p : result.placements) {
    absl::StrAppend(&s, "P ", p.job_id, " ", SlotKindName(p.kind), " n=", p.num_nodes, " [");
    for (const RankAssignment& r : p.ranks) {
      absl::StrAppend(&s, r.rank, "@", r.worker_id, "/", r.slot, " l", r.local_rank, "/",
                      r.local_world_size, " n", r.node_rank, "; ");
    }
    absl::StrAppend(&s, "]\n");
  }
  for (const PendingJobStatus& p : result.pending) {
    absl::StrAppend(&s, "Q ", p.job_id, " ", PendingReasonName(p.reason), " ", SlotKindName(p.kind),
                    " by=", p.blocked_by, " msg=", p.message, " res=");
    for (const SlotRef& r : p.reserved_slots) absl::StrAppend(&s, r.worker_id, "/", r.slot, ",");
    absl::StrAppend(&s, "\n");
  }
  for (const Preemption& p : result.preemptions) {
    absl::StrAppend(&s, "X ", p.victim_job_id, " for=", p.for_job_id, "\n");
  }
  return s;
}

// ---------------------------------------------------------------------------
// Invariant checker: an independent replay of the scheduling order that checks
// every placement and every pending reason against what was free at that
// point. Used by every test and by the randomized ones.

inline bool Before(const PendingJob& a, const PendingJob& b) {
  if (a.priority != b.priority) return a.priority > b.priority;
  if (a.submit_seq != b.submit_seq) return a.submit_seq < b.submit_seq;
  return a.job_id < b.job_id;
}

// Smallest number of workers whose counts add up to need.
inline int MinWorkers(std::vector<int> counts, int need) {
  std::sort(counts.rbegin(), counts.rend());
  int sum = 0;
  for (int k = 0; k < static_cast<int>(counts.size()); ++k) {
    sum += counts[k];
    if (sum >= need) return k + 1;
  }
  return -1;
}

// Replays the scheduling order over what was free and checks every outcome:
// each job exactly once, output lists in scheduling order, every pending
// reason against what was free at that point, every placement's ranks,
// slots and packing.
// A job's least size: an elastic job's minimum, else world_size.
inline int LeastSize(const PendingJob& job) {
  const bool elastic = job.min_world_size >= 1 && job.min_world_size < job.world_size;
  return elastic ? job.min_world_size : job.world_size;
}

// The slot kind a job of requirement `d` uses, given the schedulable
// capacity per kind (auto: GPU when there is any).
inline SlotKind ResolvedKind(DeviceRequirement d, const std::map<SlotKind, long long>& capacity) {
  if (d == DeviceRequirement::kCuda) return SlotKind::kGpu;
  if (d == DeviceRequirement::kCpu) return SlotKind::kCpu;
  auto gpu = capacity.find(SlotKind::kGpu);
  return gpu != capacity.end() && gpu->second > 0 ? SlotKind::kGpu : SlotKind::kCpu;
}

class InvariantCheck {
 public:
  InvariantCheck(const std::vector<PendingJob>& jobs, const std::vector<WorkerSlots>& workers,
                 const ScheduleResult& result)
      : jobs_(jobs), result_(result) {
    // Free slots and capacity per kind, over schedulable workers.
    for (const WorkerSlots& w : workers) {
      if (!w.schedulable) continue;
      by_id_[w.worker_id] = &w;
      capacity_[w.kind] += w.total_slots;
      for (int s : w.free_slots) free_.insert({w.worker_id, s});
    }
  }

  void Run() {
    EachJobOnce();
    if (::testing::Test::HasFatalFailure()) return;
    InSchedulingOrder();
    for (const PendingJob* job : order_) {
      SCOPED_TRACE(job->job_id);
      if (auto it = pending_.find(job->job_id); it != pending_.end()) {
        CheckPending(*job, *it->second);
        continue;
      }
      CheckPlaced(*job, *placed_.at(job->job_id));
      if (::testing::Test::HasFatalFailure()) return;
    }
  }

 private:
  using Slot = std::pair<std::string, int>;

  static int Need(const PendingJob& job) { return LeastSize(job); }
  SlotKind KindOf(DeviceRequirement d) { return ResolvedKind(d, capacity_); }

  // Available count per worker of `kind` at this point (free, unused, and
  // outside the reservation when `respect_reservation`).
  std::map<std::string, int> Counts(SlotKind kind, bool respect_reservation) {
    std::map<std::string, int> c;
    for (const Slot& s : free_) {
      if (by_id_[s.first]->kind != kind || used_.count(s)) continue;
      if (respect_reservation && reserved_[kind].count(s)) continue;
      ++c[s.first];
    }
    return c;
  }

  // What `c` gives `job`: all of it, or for a job with nodes per_node from
  // each worker that has that many and nothing from the others.
  static std::map<std::string, int> ForJob(const PendingJob& job, std::map<std::string, int> c) {
    const int per = PerNode(job);
    if (per == 0) return c;
    for (auto& [id, n] : c) n = n >= per ? per : 0;
    return c;
  }

  static int Total(const std::map<std::string, int>& c) {
    int t = 0;
    for (const auto& [id, n] : c) t += n;
    return t;
  }

  void EachJobOnce() {
    for (const Placement& p : result_.placements) ASSERT_TRUE(placed_.emplace(p.job_id, &p).second);
    for (const PendingJobStatus& p : result_.pending) {
      ASSERT_TRUE(pending_.emplace(p.job_id, &p).second);
      ASSERT_FALSE(placed_.contains(p.job_id)) << p.job_id;
    }
    ASSERT_EQ(placed_.size() + pending_.size(), jobs_.size());
  }

  // Sorts order_; the output lists are in that order.
  void InSchedulingOrder() {
    for (const PendingJob& j : jobs_) order_.push_back(&j);
    std::sort(order_.begin(), order_.end(),
              [](const PendingJob* a, const PendingJob* b) { return Before(*a, *b); });
    std::vector<std::string> placed_order, pending_order;
    for (const PendingJob* j : order_) {
      (placed_.contains(j->job_id) ? placed_order : pending_order).push_back(j->job_id);
    }
    std::vector<std::string> got_placed, got_pending;
    for (const Placement& p : result_.placements) got_placed.push_back(p.job_id);
    for (const PendingJobStatus& p : result_.pending) got_pending.push_back(p.job_id);
    EXPECT_EQ(got_placed, placed_order);
    EXPECT_EQ(got_pending, pending_order);
  }

  void CheckPending(const PendingJob& job, const PendingJobStatus& p) {
    const int need = Need(job);
    const SlotKind kind = KindOf(job.device);
    EXPECT_FALSE(p.message.empty());
    if (job.world_size < 1 || InvalidNodes(job)) {
      EXPECT_EQ(p.reason, PendingReason::kInvalidJob);
      return;
    }
    EXPECT_EQ(p.kind, kind);
    if (capacity_[kind] == 0) {
      EXPECT_EQ(p.reason, PendingReason::kNoWorkerOfKind);
      return;
    }
    if (need > capacity_[kind]) {
      EXPECT_EQ(p.reason, PendingReason::kExceedsCapacity);
      EXPECT_TRUE(p.reserved_slots.empty());
      return;
    }
    if (const int per = PerNode(job); per > 0) {
      int hosts = 0;
      for (const auto& [id, w] : by_id_) hosts += w->kind == kind && w->total_slots >= per;
      if (hosts < job.nodes) {
        EXPECT_EQ(p.reason, PendingReason::kExceedsCapacity);
        EXPECT_TRUE(p.reserved_slots.empty());
        return;
      }
    }
    const int free_now = Total(ForJob(job, Counts(kind, false)));
    const int usable_now = Total(ForJob(job, Counts(kind, true)));
    // Work conserving: a job is left pending only when it does not fit in
    // what later jobs were allowed to use.
    EXPECT_LT(usable_now, need);
    if (head_.count(kind) == 0) {
      // The first blocked job of its kind holds the reservation.
      EXPECT_EQ(p.reason, PendingReason::kInsufficientFreeSlots);
      EXPECT_LT(free_now, need);
      EXPECT_TRUE(p.blocked_by.empty());
      EXPECT_LE(static_cast<int>(p.reserved_slots.size()), need);
      head_[kind] = job.job_id;
      for (const SlotRef& r : p.reserved_slots) {
        const Slot s{r.worker_id, r.slot};
        EXPECT_TRUE(free_.count(s)) << r.worker_id << "/" << r.slot;
        EXPECT_EQ(by_id_[r.worker_id]->kind, kind);
        EXPECT_FALSE(used_.count(s));
        EXPECT_TRUE(reserved_[kind].insert(s).second);
      }
      return;
    }
    EXPECT_EQ(p.blocked_by, head_[kind]);
    EXPECT_TRUE(p.reserved_slots.empty());
    if (free_now >= need) {
      EXPECT_EQ(p.reason, PendingReason::kBlockedByReservation);
    } else {
      EXPECT_EQ(p.reason, PendingReason::kInsufficientFreeSlots);
    }
  }

  void CheckPlaced(const PendingJob& job, const Placement& p) {
    const int need = Need(job);
    const SlotKind kind = KindOf(job.device);
    ASSERT_GE(need, 1);
    EXPECT_EQ(p.kind, kind);
    EXPECT_GE(p.world_size, need);
    EXPECT_LE(p.world_size, job.world_size);
    ASSERT_EQ(static_cast<int>(p.ranks.size()), p.world_size);
    const std::map<std::string, int> before =
        Counts(kind, /*respect_reservation=*/p.backfilled_before.empty());
    CheckRanks(p, kind);
    if (::testing::Test::HasFatalFailure()) return;
    if (PerNode(job) > 0) {
      CheckNodes(job, p, before);
    } else {
      CheckPacking(p, before);
    }
  }

  // A job with nodes: exactly `nodes` workers with per_node ranks each, the
  // tightest that hold per_node (no unchosen one has less room).
  static void CheckNodes(const PendingJob& job, const Placement& p,
                         const std::map<std::string, int>& before) {
    const int per = PerNode(job);
    EXPECT_EQ(p.num_nodes, job.nodes) << Layout(p);
    EXPECT_EQ(p.world_size, job.world_size);
    std::set<std::string> chosen;
    int widest = 0;
    for (const RankAssignment& r : p.ranks) {
      EXPECT_EQ(r.local_world_size, per) << Layout(p);
      chosen.insert(r.worker_id);
      auto it = before.find(r.worker_id);
      ASSERT_NE(it, before.end());
      EXPECT_GE(it->second, per);
      widest = std::max(widest, it->second);
    }
    for (const auto& [id, n] : before) {
      if (!chosen.count(id) && n >= per) {
        EXPECT_GE(n, widest) << "not the tightest hosts: " << Layout(p);
      }
    }
  }

  // Ranks 0..n-1 in order, contiguous per worker, node/local ranks, on free
  // unreserved slots of the job's kind, each slot once.
  void CheckRanks(const Placement& p, SlotKind kind) {
    std::vector<std::string> node_workers;
    std::map<std::string, int> per_worker;
    for (int i = 0; i < p.world_size; ++i) {
      const RankAssignment& r = p.ranks[i];
      EXPECT_EQ(r.rank, i);
      if (node_workers.empty() || node_workers.back() != r.worker_id) {
        // A new node: its worker must not have appeared before (contiguity).
        EXPECT_EQ(std::count(node_workers.begin(), node_workers.end(), r.worker_id), 0)
            << "ranks on " << r.worker_id << " are not contiguous";
        node_workers.push_back(r.worker_id);
      }
      EXPECT_EQ(r.node_rank, static_cast<int>(node_workers.size()) - 1);
      EXPECT_EQ(r.local_rank, per_worker[r.worker_id]++);
      const Slot s{r.worker_id, r.slot};
      ASSERT_TRUE(by_id_.contains(r.worker_id)) << "unschedulable or unknown worker";
      EXPECT_EQ(by_id_[r.worker_id]->kind, kind) << "device kind not respected";
      EXPECT_TRUE(free_.count(s)) << "slot was not free";
      // A backfilled job may take the head's slots, and only the head's.
      if (p.backfilled_before.empty()) {
        EXPECT_FALSE(reserved_[kind].count(s)) << "slot reserved for " << head_[kind];
      } else {
        EXPECT_EQ(p.backfilled_before, head_[kind])
            << "backfilled before a job that is not the head";
      }
      EXPECT_TRUE(used_.insert(s).second) << "slot used twice: " << r.worker_id << "/" << r.slot;
    }
    EXPECT_EQ(p.ranks[0].node_rank, 0);
    EXPECT_EQ(p.num_nodes, static_cast<int>(node_workers.size()));
    for (const RankAssignment& r : p.ranks) EXPECT_EQ(r.local_world_size, per_worker[r.worker_id]);
  }

  // Packing: as few workers as possible; best fit when one suffices.
  static void CheckPacking(const Placement& p, const std::map<std::string, int>& before) {
    std::vector<int> c;
    for (const auto& [id, n] : before) c.push_back(n);
    EXPECT_EQ(p.num_nodes, MinWorkers(c, p.world_size)) << Layout(p);
    if (p.num_nodes == 1) {
      int tightest = 1 << 30;
      std::string tightest_id;
      for (const auto& [id, n] : before) {
        if (n >= p.world_size && n < tightest) tightest = n, tightest_id = id;
      }
      EXPECT_EQ(p.ranks[0].worker_id, tightest_id) << "not best fit";
    }
  }

  const std::vector<PendingJob>& jobs_;
  const ScheduleResult& result_;
  absl::flat_hash_map<std::string, const WorkerSlots*> by_id_;
  std::map<SlotKind, long long> capacity_;
  std::set<Slot> free_;
  absl::flat_hash_map<std::string, const Placement*> placed_;
  absl::flat_hash_map<std::string, const PendingJobStatus*> pending_;
  std::vector<const PendingJob*> order_;
  std::set<Slot> used_;
  std::map<SlotKind, std::string> head_;         // kind -> head job id
  std::map<SlotKind, std::set<Slot>> reserved_;  // kind -> its head's slots
};

inline void CheckInvariants(const std::vector<PendingJob>& jobs,
                            const std::vector<WorkerSlots>& workers, const ScheduleResult& result) {
  InvariantCheck(jobs, workers, result).Run();
}

// The pending status of job `id` (a test failure when it is not pending).
inline const PendingJobStatus& FindPending(const ScheduleResult& r, const std::string& id) {
  for (const PendingJobStatus& p : r.pending) {
    if (p.job_id == id) return p;
  }
  ADD_FAILURE() << id << " is not pending";
  static const PendingJobStatus none;
  return none;
}

inline absl::StatusOr<ScheduleResult> Check(const std::vector<PendingJob>& jobs,
                                            const std::vector<WorkerSlots>& workers) {
  absl::StatusOr<ScheduleResult> result = Schedule(jobs, workers);
  if (result.ok()) CheckInvariants(jobs, workers, *result);
  return result;
}

// ---------------------------------------------------------------------------
// Queues: builders and the invariant checker for Schedule(jobs, workers,
// queues). Unlike InvariantCheck it does not replay the order (fair share
// interleaves queues); it checks what must hold whatever the order.

inline QueueSpec Queue(std::string name, int nominal_gpu, int nominal_cpu = -1,
                       std::string cohort = "", int max_job_size = 0) {
  QueueSpec q;
  q.name = std::move(name);
  q.nominal_gpu = nominal_gpu;
  q.nominal_cpu = nominal_cpu;
  q.cohort = std::move(cohort);
  q.max_job_size = max_job_size;
  return q;
}

inline RunningJob Running(std::string id, std::string queue, int slots, int priority = 0,
                          std::uint64_t start_seq = 0, SlotKind kind = SlotKind::kGpu,
                          bool stopping = false) {
  RunningJob r;
  r.job_id = std::move(id);
  r.queue = std::move(queue);
  r.slots = slots;
  r.priority = priority;
  r.start_seq = start_seq;
  r.kind = kind;
  r.stopping = stopping;
  return r;
}

inline PendingJob Queued(std::string queue, PendingJob job) {
  job.queue = std::move(queue);
  return job;
}

class QueueInvariantCheck {
 public:
  QueueInvariantCheck(const std::vector<PendingJob>& jobs, const std::vector<WorkerSlots>& workers,
                      const QueueInput& input, const ScheduleResult& result)
      : jobs_(jobs), input_(input), result_(result) {
    for (const WorkerSlots& w : workers) {
      if (!w.schedulable) continue;
      by_id_[w.worker_id] = &w;
      capacity_[w.kind] += w.total_slots;
      for (int s : w.free_slots) free_.insert({w.worker_id, s});
    }
    for (const QueueSpec& q : input.queues) queues_[q.name] = &q;
    for (const RunningJob& r : input.running) {
      running_[r.job_id] = &r;
      if (input.queues.empty()) continue;
      used_running_[{Name(r.queue), r.kind}] += r.slots;
      if (r.stopping) stopping_[{Name(r.queue), r.kind}] += r.slots;
    }
  }

  void Run() {
    EachJobOnce();
    if (::testing::Test::HasFatalFailure()) return;
    for (const Placement& p : result_.placements) CheckPlaced(*jobs_by_id_.at(p.job_id), p);
    for (const PendingJobStatus& p : result_.pending) CheckPending(*jobs_by_id_.at(p.job_id), p);
    CheckGroups();
    CheckPreemptions();
  }

 private:
  using Slot = std::pair<std::string, int>;
  using QueueKind = std::pair<std::string, SlotKind>;

  static std::string Name(const std::string& queue) { return queue.empty() ? "default" : queue; }
  static int Least(const PendingJob& job) { return LeastSize(job); }
  SlotKind KindOf(DeviceRequirement d) { return ResolvedKind(d, capacity_); }
  // The queue's spec; nullptr when no queues are defined (implicit default)
  // or the queue is not defined.
  const QueueSpec* Spec(const std::string& queue) const {
    auto it = queues_.find(Name(queue));
    return it == queues_.end() ? nullptr : it->second;
  }
  static long long Nominal(const QueueSpec& q, SlotKind k) {
    return k == SlotKind::kGpu ? q.nominal_gpu : q.nominal_cpu;
  }
  static std::string Group(const QueueSpec& q) {
    return q.cohort.empty() ? "queue:" + q.name : "cohort:" + q.cohort;
  }
  // Sum over the group's queues with a finite nominal for k of f(queue).
  template <typename F>
  long long GroupSum(const QueueSpec& of, SlotKind k, F f) const {
    long long sum = 0;
    for (const auto& [name, q] : queues_) {
      if (Group(*q) == Group(of) && Nominal(*q, k) >= 0) sum += f(*q);
    }
    return sum;
  }
  // Borrowing and lending limits: -1 = none.
  static long long BorrowLimit(const QueueSpec& q, SlotKind k) {
    return k == SlotKind::kGpu ? q.borrowing_limit_gpu : q.borrowing_limit_cpu;
  }
  // The part of the nominal a queue never lends.
  static long long Guaranteed(const QueueSpec& q, SlotKind k) {
    const long long lend = k == SlotKind::kGpu ? q.lending_limit_gpu : q.lending_limit_cpu;
    return lend < 0 || Nominal(q, k) < 0 ? 0 : Nominal(q, k) - std::min(lend, Nominal(q, k));
  }
  // What `used` slots of q take from its group.
  static long long Lent(const QueueSpec& q, SlotKind k, long long used) {
    return std::max(0LL, used - Guaranteed(q, k));
  }
  // What the group lends: its members' nominal beyond their guaranteed part.
  long long GroupNominal(const QueueSpec& q, SlotKind k) const {
    return GroupSum(q, k, [&](const QueueSpec& m) { return Nominal(m, k) - Guaranteed(m, k); });
  }
  // The largest job q can ever run of kind k (finite nominal).
  long long Ceiling(const QueueSpec& q, SlotKind k) const {
    long long c = Guaranteed(q, k) + GroupNominal(q, k);
    if (BorrowLimit(q, k) >= 0) c = std::min(c, Nominal(q, k) + BorrowLimit(q, k));
    return c;
  }
  // Whether `more` slots for q fit its group given each member's used.
  template <typename UsedOf>
  bool GroupFits(const QueueSpec& q, SlotKind k, long long more, UsedOf used_of) const {
    const long long group_used =
        GroupSum(q, k, [&](const QueueSpec& m) { return Lent(m, k, used_of(m)); });
    const long long growth = Lent(q, k, used_of(q) + more) - Lent(q, k, used_of(q));
    return growth <= std::max(0LL, GroupNominal(q, k) - group_used);
  }
  long long At(const std::map<QueueKind, long long>& m, const std::string& q, SlotKind k) const {
    auto it = m.find({q, k});
    return it == m.end() ? 0 : it->second;
  }
  long long UsedFinal(const QueueSpec& q, SlotKind k) const {
    return At(used_running_, q.name, k) + At(placed_, q.name, k);
  }

  void EachJobOnce() {
    for (const PendingJob& j : jobs_) jobs_by_id_[j.job_id] = &j;
    std::set<std::string> seen;
    for (const Placement& p : result_.placements) ASSERT_TRUE(seen.insert(p.job_id).second);
    for (const PendingJobStatus& p : result_.pending) ASSERT_TRUE(seen.insert(p.job_id).second);
    ASSERT_EQ(seen.size(), jobs_.size());
    for (const std::string& id : seen) ASSERT_TRUE(jobs_by_id_.contains(id)) << id;
    // Reservations first: placements must avoid every holder's slots.
    for (const PendingJobStatus& p : result_.pending) {
      if (!p.reserved_slots.empty()) {
        EXPECT_TRUE(p.reason == PendingReason::kInsufficientFreeSlots ||
                    p.reason == PendingReason::kPreempting)
            << p.job_id << " " << PendingReasonName(p.reason);
      }
      for (const SlotRef& r : p.reserved_slots) {
        const Slot s{r.worker_id, r.slot};
        EXPECT_TRUE(free_.count(s)) << r.worker_id << "/" << r.slot;
        EXPECT_EQ(by_id_[r.worker_id]->kind, p.kind);
        EXPECT_TRUE(reserved_.insert(s).second)
            << "reserved twice " << r.worker_id << "/" << r.slot;
      }
    }
  }

  // A gang is whole: every rank on a distinct free, unreserved slot of its
  // kind; size within [least, world_size] and the queue's max_job_size.
  void CheckPlaced(const PendingJob& job, const Placement& p) {
    SCOPED_TRACE(job.job_id);
    const SlotKind kind = KindOf(job.device);
    EXPECT_EQ(p.kind, kind);
    EXPECT_GE(p.world_size, std::max(1, Least(job)));
    EXPECT_LE(p.world_size, job.world_size);
    ASSERT_EQ(static_cast<int>(p.ranks.size()), p.world_size) << "gang split";
    std::vector<std::string> nodes;
    for (int i = 0; i < p.world_size; ++i) {
      const RankAssignment& r = p.ranks[i];
      EXPECT_EQ(r.rank, i);
      if (nodes.empty() || nodes.back() != r.worker_id) nodes.push_back(r.worker_id);
      EXPECT_EQ(r.node_rank, static_cast<int>(nodes.size()) - 1);
      const Slot s{r.worker_id, r.slot};
      ASSERT_TRUE(by_id_.contains(r.worker_id));
      EXPECT_EQ(by_id_[r.worker_id]->kind, kind);
      EXPECT_TRUE(free_.count(s)) << "slot was not free";
      EXPECT_FALSE(reserved_.count(s)) << "slot was reserved";
      EXPECT_TRUE(used_.insert(s).second) << "slot used twice";
    }
    EXPECT_EQ(p.num_nodes, static_cast<int>(nodes.size()));
    const QueueSpec* q = Spec(job.queue);
    if (!input_.queues.empty()) {
      ASSERT_NE(q, nullptr) << "placed from an undefined queue";
      if (q->max_job_size > 0) {
        EXPECT_LE(p.world_size, q->max_job_size);
      }
      placed_[{q->name, kind}] += p.world_size;
    }
  }

  void CheckPending(const PendingJob& job, const PendingJobStatus& p) {
    SCOPED_TRACE(job.job_id);
    EXPECT_FALSE(p.message.empty());
    const int least = Least(job);
    if (job.world_size < 1) {
      EXPECT_EQ(p.reason, PendingReason::kInvalidJob);
      return;
    }
    const SlotKind kind = KindOf(job.device);
    EXPECT_EQ(p.kind, kind);
    const QueueSpec* q = Spec(job.queue);
    if (!input_.queues.empty() && q == nullptr) {
      EXPECT_EQ(p.reason, PendingReason::kUnknownQueue);
      return;
    }
    EXPECT_NE(p.reason, PendingReason::kUnknownQueue);
    if (q != nullptr && q->max_job_size > 0 && least > q->max_job_size) {
      EXPECT_EQ(p.reason, PendingReason::kExceedsQueueLimit);
      return;
    }
    if (capacity_[kind] == 0) {
      EXPECT_EQ(p.reason, PendingReason::kNoWorkerOfKind);
      return;
    }
    if (least > capacity_[kind]) {
      EXPECT_EQ(p.reason, PendingReason::kExceedsCapacity);
      return;
    }
    if (HasResources(job)) {
      long long idle = 0;
      for (const auto& [id, w] : by_id_) idle += w->kind == kind ? IdleRanks(job, *w) : 0;
      if (least > idle) {
        EXPECT_EQ(p.reason, PendingReason::kExceedsCapacity);
        return;
      }
    }
    EXPECT_NE(p.reason, PendingReason::kExceedsCapacity);
    const bool finite = q != nullptr && Nominal(*q, kind) >= 0;
    if (finite && least > Ceiling(*q, kind)) {
      EXPECT_EQ(p.reason, PendingReason::kExceedsQueueLimit);
      return;
    }
    EXPECT_NE(p.reason, PendingReason::kExceedsQueueLimit);
    if (p.reason == PendingReason::kQuotaExceeded) {
      // Quota only grows within a pass: what blocked it still does.
      ASSERT_TRUE(finite) << "quota_exceeded in a queue without quota";
      const bool over_borrowing_limit =
          BorrowLimit(*q, kind) >= 0 &&
          UsedFinal(*q, kind) + least > Nominal(*q, kind) + BorrowLimit(*q, kind);
      EXPECT_TRUE(over_borrowing_limit || !GroupFits(*q, kind, least, [&](const QueueSpec& m) {
                    return UsedFinal(m, kind);
                  }));
    }
    if (p.reason == PendingReason::kPreempting) {
      ASSERT_TRUE(finite) << "preempting in a queue without quota";
      // Within its nominal, or over it only by its queue's stopping jobs and
      // running jobs of a lower priority (those it may preempt).
      long long lower = 0;
      for (const auto& entry : running_) {
        const RunningJob& r = *entry.second;
        if (Name(r.queue) == q->name && r.kind == kind &&
            (r.stopping || r.priority < job.priority)) {
          lower += r.slots;
        }
      }
      EXPECT_LE(At(used_running_, q->name, kind) - lower + least, Nominal(*q, kind))
          << "preempts while not within its nominal quota";
      preempting_[kind].push_back(&job);
    }
  }

  // Quota is never exceeded except by borrowing within the cohort: where a
  // queue with a finite nominal placed a job, its group's used (running plus
  // placed) is within its group's nominal.
  void CheckGroups() {
    for (const auto& [qk, n] : placed_) {
      const QueueSpec& q = *queues_.at(qk.first);
      const SlotKind k = qk.second;
      if (n == 0 || Nominal(q, k) < 0) continue;
      SCOPED_TRACE(absl::StrCat(Group(q), " ", SlotKindName(k)));
      // Within its guaranteed part a queue places whatever the others hold.
      if (UsedFinal(q, k) > Guaranteed(q, k)) {
        EXPECT_LE(GroupSum(q, k, [&](const QueueSpec& m) { return Lent(m, k, UsedFinal(m, k)); }),
                  GroupNominal(q, k));
      }
      if (q.cohort.empty()) {
        EXPECT_LE(UsedFinal(q, k), Nominal(q, k));
      }
      if (BorrowLimit(q, k) >= 0) {
        EXPECT_LE(UsedFinal(q, k), Nominal(q, k) + BorrowLimit(q, k)) << "past its borrowing limit";
      }
    }
  }

  // Victims are running, not stopping, of the preempting job's kind, from a
  // borrowing queue of its cohort or lower priority in its own queue; at most
  // one job per kind preempts; what is picked can suffice.
  void CheckPreemptions() {
    for (const auto& entry : preempting_) {
      // Named copies: C++17 lambdas cannot capture structured bindings (clang).
      const auto& kind = entry.first;
      const auto& list = entry.second;
      EXPECT_EQ(list.size(), 1u) << "two preemptors";
      // One that picks no victim waits for stopping jobs of its kind.
      const bool picks =
          std::any_of(result_.preemptions.begin(), result_.preemptions.end(),
                      [&](const Preemption& x) { return x.for_job_id == list.front()->job_id; });
      const bool stopping = std::any_of(
          input_.running.begin(), input_.running.end(),
          [&](const RunningJob& r) { return r.kind == kind && r.stopping && r.slots > 0; });
      EXPECT_TRUE(picks || stopping) << list.front()->job_id << " preempting nothing";
    }
    std::map<std::string, std::vector<const RunningJob*>> victims_of;
    std::set<std::string> victims;
    for (const Preemption& x : result_.preemptions) {
      SCOPED_TRACE(absl::StrCat(x.victim_job_id, " for ", x.for_job_id));
      ASSERT_TRUE(running_.count(x.victim_job_id)) << "victim not running";
      ASSERT_TRUE(jobs_by_id_.contains(x.for_job_id));
      EXPECT_TRUE(victims.insert(x.victim_job_id).second) << "victim picked twice";
      victims_of[x.for_job_id].push_back(running_.at(x.victim_job_id));
    }
    for (const auto& [for_id, picked] : victims_of) {
      const PendingJob& job = *jobs_by_id_.at(for_id);
      SCOPED_TRACE(for_id);
      const SlotKind kind = KindOf(job.device);
      bool is_preempting = false;
      for (const auto& [k, list] : preempting_) {
        for (const PendingJob* j : list) is_preempting |= j->job_id == for_id;
      }
      ASSERT_TRUE(is_preempting) << "preemptions for a job not kPreempting";
      const QueueSpec& q = *Spec(job.queue);
      std::map<std::string, long long> picked_from;
      long long picked_slots = 0;
      for (const RunningJob* v : picked) {
        EXPECT_FALSE(v->stopping) << v->job_id;
        EXPECT_EQ(v->kind, kind) << v->job_id;
        const QueueSpec& vq = *Spec(v->queue);
        if (vq.name == q.name) {
          EXPECT_LT(v->priority, job.priority) << v->job_id << " same queue, not lower priority";
        } else {
          EXPECT_FALSE(q.cohort.empty());
          EXPECT_EQ(vq.cohort, q.cohort) << v->job_id << " outside the cohort";
          ASSERT_GE(Nominal(vq, kind), 0);
          // Borrowing at the time of the pick (final used bounds it above).
          EXPECT_GT(UsedFinal(vq, kind) - At(stopping_, vq.name, kind) - picked_from[vq.name],
                    Nominal(vq, kind))
              << v->job_id << " from a queue not borrowing";
        }
        picked_from[vq.name] += v->slots;
        picked_slots += v->slots;
      }
      long long stopping_slots = 0;
      for (const RunningJob& r : input_.running) {
        if (r.kind == kind && r.stopping) stopping_slots += r.slots;
      }
      long long free_of_kind = 0;
      for (const Slot& s : free_) free_of_kind += by_id_[s.first]->kind == kind;
      EXPECT_GE(free_of_kind + stopping_slots + picked_slots, Least(job))
          << "victims cannot suffice";
      EXPECT_TRUE(GroupFits(q, kind, Least(job), [&](const QueueSpec& m) {
        return At(used_running_, m.name, kind) - At(stopping_, m.name, kind) - picked_from[m.name];
      })) << "victims free too little quota";
    }
  }

  const std::vector<PendingJob>& jobs_;
  const QueueInput& input_;
  const ScheduleResult& result_;
  absl::flat_hash_map<std::string, const PendingJob*> jobs_by_id_;
  absl::flat_hash_map<std::string, const WorkerSlots*> by_id_;
  std::map<std::string, const QueueSpec*> queues_;
  std::map<std::string, const RunningJob*> running_;
  std::map<SlotKind, long long> capacity_;
  std::set<Slot> free_;
  std::set<Slot> used_;
  std::set<Slot> reserved_;
  std::map<QueueKind, long long> used_running_;  // running, stopping included
  std::map<QueueKind, long long> stopping_;
  std::map<QueueKind, long long> placed_;
  std::map<SlotKind, std::vector<const PendingJob*>> preempting_;
};

inline void CheckQueueInvariants(const std::vector<PendingJob>& jobs,
                                 const std::vector<WorkerSlots>& workers, const QueueInput& input,
                                 const ScheduleResult& result) {
  QueueInvariantCheck(jobs, workers, input, result).Run();
}

inline absl::StatusOr<ScheduleResult> CheckQ(const std::vector<PendingJob>& jobs,
                                             const std::vector<WorkerSlots>& workers,
                                             const QueueInput& input) {
  absl::StatusOr<ScheduleResult> result = Schedule(jobs, workers, input);
  if (result.ok()) CheckQueueInvariants(jobs, workers, input, *result);
  return result;
}

// ---------------------------------------------------------------------------
// Resources: what must hold whatever the order, with or without queues.
//  - each job once; a placed gang whole (world_size ranks in [least,
//    world_size], in rank order, contiguous per worker) on distinct free,
//    unreserved slots of its kind on schedulable workers;
//  - a job with resources only on workers that enforce limits;
//  - no worker over-committed: where this pass placed ranks with resources
//    (or held resources for a reservation), its running ranks' reservation
//    plus the placed ranks' CPUs (memory) is within its known allocatable
//    (a reservation holds at most what was left: that is checked by the
//    placements staying within what is left);
//  - kExceedsCapacity exactly when the least size exceeds the slots or the
//    ranks the kind's workers could hold idle.
class ResourceInvariantCheck {
 public:
  ResourceInvariantCheck(const std::vector<PendingJob>& jobs,
                         const std::vector<WorkerSlots>& workers, const ScheduleResult& result)
      : jobs_(jobs), result_(result) {
    for (const WorkerSlots& w : workers) {
      if (!w.schedulable || w.total_slots == 0) continue;
      by_id_[w.worker_id] = &w;
      capacity_[w.kind] += w.total_slots;
      for (int s : w.free_slots) free_.insert({w.worker_id, s});
    }
  }

  void Run() {
    std::map<std::string, const PendingJob*> by_id;
    for (const PendingJob& j : jobs_) by_id[j.job_id] = &j;
    std::set<std::string> seen;
    for (const Placement& p : result_.placements)
      ASSERT_TRUE(seen.insert(p.job_id).second) << p.job_id;
    for (const PendingJobStatus& p : result_.pending)
      ASSERT_TRUE(seen.insert(p.job_id).second) << p.job_id;
    ASSERT_EQ(seen.size(), jobs_.size());
    for (const PendingJobStatus& p : result_.pending) {
      for (const SlotRef& r : p.reserved_slots) {
        EXPECT_TRUE(free_.count({r.worker_id, r.slot})) << "reserved a slot that is not free";
        EXPECT_TRUE(reserved_.insert({r.worker_id, r.slot}).second) << "reserved twice";
      }
      CheckPending(*by_id.at(p.job_id), p);
    }
    std::map<std::string, double> cpus;
    // long double: the sums of huge requests (HugeRequestsNeitherOverflowNorFit)
    // must not overflow in the checker itself; exact up to 2^64.
    std::map<std::string, long double> memory;
    for (const Placement& p : result_.placements) {
      const PendingJob& job = *by_id.at(p.job_id);
      SCOPED_TRACE(job.job_id);
      EXPECT_GE(p.world_size, std::max(1, LeastSize(job)));
      EXPECT_LE(p.world_size, job.world_size);
      ASSERT_EQ(static_cast<int>(p.ranks.size()), p.world_size) << "gang split";
      std::vector<std::string> nodes;
      for (int i = 0; i < p.world_size; ++i) {
        const RankAssignment& r = p.ranks[i];
        EXPECT_EQ(r.rank, i);
        if (nodes.empty() || nodes.back() != r.worker_id) {
          EXPECT_EQ(std::count(nodes.begin(), nodes.end(), r.worker_id), 0) << "not contiguous";
          nodes.push_back(r.worker_id);
        }
        ASSERT_TRUE(by_id_.contains(r.worker_id)) << "unschedulable or unknown worker";
        const WorkerSlots& w = *by_id_[r.worker_id];
        EXPECT_EQ(w.kind, p.kind);
        EXPECT_TRUE(free_.count({r.worker_id, r.slot})) << "slot was not free";
        EXPECT_FALSE(reserved_.count({r.worker_id, r.slot})) << "slot was reserved";
        EXPECT_TRUE(used_.insert({r.worker_id, r.slot}).second) << "slot used twice";
        if (HasResources(job)) {
          EXPECT_TRUE(w.enforces_limits)
              << "job with resources on " << r.worker_id << ", which does not enforce limits";
        }
        cpus[r.worker_id] += job.cpus;
        memory[r.worker_id] += job.memory_bytes;
      }
      EXPECT_EQ(p.num_nodes, static_cast<int>(nodes.size()));
    }
    for (const auto& [id, c] : cpus) {
      const WorkerSlots& w = *by_id_[id];
      if (c > 0 && w.allocatable_cpus > 0) {
        EXPECT_LE(w.reserved_cpus + c, w.allocatable_cpus + 1e-6)
            << "cpus over-committed on " << id;
      }
    }
    for (const auto& [id, m] : memory) {
      const WorkerSlots& w = *by_id_[id];
      if (m > 0 && w.allocatable_memory > 0) {
        EXPECT_LE(static_cast<long double>(w.reserved_memory) + m,
                  static_cast<long double>(w.allocatable_memory))
            << "memory over-committed on " << id;
      }
    }
  }

 private:
  using Slot = std::pair<std::string, int>;

  void CheckPending(const PendingJob& job, const PendingJobStatus& p) {
    SCOPED_TRACE(job.job_id);
    EXPECT_FALSE(p.message.empty());
    if (job.world_size < 1) {
      EXPECT_EQ(p.reason, PendingReason::kInvalidJob);
      return;
    }
    if (p.reason == PendingReason::kUnknownQueue || p.reason == PendingReason::kNoWorkerOfKind)
      return;
    if (p.reason == PendingReason::kExceedsQueueLimit) return;  // the queue checker's
    const SlotKind kind = p.kind;
    long long idle = 0;
    for (const auto& [id, w] : by_id_) idle += w->kind == kind ? IdleRanks(job, *w) : 0;
    const bool never = LeastSize(job) > capacity_[kind] || LeastSize(job) > idle;
    EXPECT_EQ(p.reason == PendingReason::kExceedsCapacity, never)
        << PendingReasonName(p.reason) << ": " << p.message;
    if (never) {
      EXPECT_TRUE(p.reserved_slots.empty());
    }
  }

  const std::vector<PendingJob>& jobs_;
  const ScheduleResult& result_;
  absl::flat_hash_map<std::string, const WorkerSlots*> by_id_;
  std::map<SlotKind, long long> capacity_;
  std::set<Slot> free_;
  std::set<Slot> used_;
  std::set<Slot> reserved_;
};

inline void CheckResourceInvariants(const std::vector<PendingJob>& jobs,
                                    const std::vector<WorkerSlots>& workers,
                                    const ScheduleResult& result) {
  ResourceInvariantCheck(jobs, workers, result).Run();
}

inline constexpr DeviceRequirement kCuda = DeviceRequirement::kCuda;
inline constexpr DeviceRequirement kCpu = DeviceRequirement::kCpu;
inline constexpr DeviceRequirement kAuto = DeviceRequirement::kAuto;

// A tiny cluster simulator: each pass frees slots of jobs that ended,
// submits arrivals, schedules, and starts the placements.
struct SimJob {
  PendingJob spec;
  int arrival = 0;
  int duration = 1;
};

struct SimResult {
  std::map<std::string, int> start_tick;  // job id -> tick placed
  int busy_slot_ticks = 0;
  int backfills = 0;  // placements with backfilled_before
};

using BusyUntil = std::map<std::pair<std::string, int>, int>;  // (worker, slot) -> tick

// Workers' free_slots are recomputed every tick from their total_slots
// (indices 0..total-1) and what is busy.
inline SimResult Simulate(std::vector<WorkerSlots> workers, const std::vector<SimJob>& sim_jobs,
                          int max_ticks, BusyUntil busy_until = {}, bool bounds = false) {
  std::map<std::string, std::set<int>> all_slots;
  for (const WorkerSlots& w : workers) {
    for (int s = 0; s < w.total_slots; ++s) all_slots[w.worker_id].insert(s);
  }
  SimResult out;
  std::map<std::string, const SimJob*> by_id;
  for (const SimJob& j : sim_jobs) by_id[j.spec.job_id] = &j;
  for (int tick = 0; tick < max_ticks; ++tick) {
    for (WorkerSlots& w : workers) {
      w.free_slots.clear();
      w.busy.clear();
      for (int s : all_slots[w.worker_id]) {
        auto it = busy_until.find({w.worker_id, s});
        if (it == busy_until.end() || it->second <= tick) {
          w.free_slots.push_back(s);
        } else {
          ++out.busy_slot_ticks;
          // With bounds, every job's duration is its bound (the
          // coordinator stops a job at it).
          if (bounds) w.busy.push_back({1, static_cast<double>(it->second - tick)});
        }
      }
    }
    std::vector<PendingJob> queue;
    for (const SimJob& j : sim_jobs) {
      if (j.arrival <= tick && !out.start_tick.count(j.spec.job_id)) {
        queue.push_back(j.spec);
        if (bounds) queue.back().runtime_bound_s = j.duration;
      }
    }
    if (queue.empty() && out.start_tick.size() == sim_jobs.size()) break;
    auto r = Check(queue, workers);
    if (!r.ok()) {
      ADD_FAILURE() << r.status();
      return out;
    }
    for (const Placement& p : r->placements) {
      out.start_tick[p.job_id] = tick;
      out.backfills += !p.backfilled_before.empty();
      for (const RankAssignment& a : p.ranks) {
        busy_until[{a.worker_id, a.slot}] = tick + by_id[p.job_id]->duration;
      }
    }
  }
  return out;
}

}  // namespace trainctl::scheduler
