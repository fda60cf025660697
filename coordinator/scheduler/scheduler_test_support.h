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

inline PendingJob Job(std::string id, int world_size, DeviceRequirement device = DeviceRequirement::kCuda,
               int priority = 0, std::uint64_t seq = 0) {
  PendingJob j;
  j.job_id = std::move(id);
  j.world_size = world_size;
  j.device = device;
  j.priority = priority;
  j.submit_seq = seq;
  return j;
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

  // An elastic job needs its minimum and takes up to world_size.
  static int Need(const PendingJob& job) {
    const bool elastic = job.min_world_size >= 1 && job.min_world_size < job.world_size;
    return elastic ? job.min_world_size : job.world_size;
  }

  SlotKind KindOf(DeviceRequirement d) {
    if (d == DeviceRequirement::kCuda) return SlotKind::kGpu;
    if (d == DeviceRequirement::kCpu) return SlotKind::kCpu;
    return capacity_[SlotKind::kGpu] > 0 ? SlotKind::kGpu : SlotKind::kCpu;
  }

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
    if (job.world_size < 1) {
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
    const int free_now = Total(Counts(kind, false));
    const int usable_now = Total(Counts(kind, true));
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
    const std::map<std::string, int> before = Counts(kind, true);
    CheckRanks(p, kind);
    if (::testing::Test::HasFatalFailure()) return;
    CheckPacking(p, before);
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
      EXPECT_FALSE(reserved_[kind].count(s)) << "slot reserved for " << head_[kind];
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

inline void CheckInvariants(const std::vector<PendingJob>& jobs, const std::vector<WorkerSlots>& workers,
                     const ScheduleResult& result) {
  InvariantCheck(jobs, workers, result).Run();
}

inline absl::StatusOr<ScheduleResult> Check(const std::vector<PendingJob>& jobs,
                                     const std::vector<WorkerSlots>& workers) {
  absl::StatusOr<ScheduleResult> result = Schedule(jobs, workers);
  if (result.ok()) CheckInvariants(jobs, workers, *result);
  return result;
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
};

using BusyUntil = std::map<std::pair<std::string, int>, int>;  // (worker, slot) -> tick

// Workers' free_slots are recomputed every tick from their total_slots
// (indices 0..total-1) and what is busy.
inline SimResult Simulate(std::vector<WorkerSlots> workers, const std::vector<SimJob>& sim_jobs,
                   int max_ticks, BusyUntil busy_until = {}) {
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
      for (int s : all_slots[w.worker_id]) {
        auto it = busy_until.find({w.worker_id, s});
        if (it == busy_until.end() || it->second <= tick)
          w.free_slots.push_back(s);
        else
          ++out.busy_slot_ticks;
      }
    }
    std::vector<PendingJob> queue;
    for (const SimJob& j : sim_jobs) {
      if (j.arrival <= tick && !out.start_tick.count(j.spec.job_id)) queue.push_back(j.spec);
    }
    if (queue.empty() && out.start_tick.size() == sim_jobs.size()) break;
    auto r = Check(queue, workers);
    if (!r.ok()) {
      ADD_FAILURE() << r.status();
      return out;
    }
    for (const Placement& p : r->placements) {
      out.start_tick[p.job_id] = tick;
      for (const RankAssignment& a : p.ranks) {
        busy_until[{a.worker_id, a.slot}] = tick + by_id[p.job_id]->duration;
      }
    }
  }
  return out;
}


}  // namespace trainctl::scheduler
