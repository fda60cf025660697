#include "coordinator/scheduler/scheduler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/format_bytes.h"
#include "coordinator/scheduler/fair_order.h"
#include "coordinator/scheduler/flavor_quota.h"
#include "coordinator/scheduler/queue_admission.h"
#include "coordinator/scheduler/worker_fit.h"

namespace trainctl::scheduler {
namespace {

using internal::Admission;
using internal::ByShare;
using internal::KindIndex;
using internal::kNumKinds;
using internal::QueueBook;
using internal::ScheduledBefore;
// What fits on a worker during one pass (worker_fit.h).
using internal::ChooseNodes;
using internal::ChooseWorkers;
using internal::Count;
using internal::CpuText;
using internal::FreeText;
using internal::HoldResources;
using internal::IdleFit;
using internal::KindPool;
using internal::MilliDown;
using internal::MilliUp;
using internal::PerRankText;
using internal::Request;
using internal::RequestOf;
using internal::ResourcesNeverFit;
using internal::RoomNow;
using internal::Share;
using internal::TakeResources;
using internal::Usable;
using internal::UsableIgnoringReservations;
using internal::ValidateInput;
using internal::WorkerState;

class Pass {
 public:
  Pass(absl::Span<const PendingJob> jobs, absl::Span<const WorkerSlots> workers,
       const QueueInput& queues)
      : book_(queues), worker_flavors_(workers) {
    for (const PendingJob& job : jobs) jobs_.push_back(&job);
    std::sort(jobs_.begin(), jobs_.end(),
              [](const PendingJob* a, const PendingJob* b) { return ScheduledBefore(*a, *b); });
    lines_.resize(static_cast<size_t>(book_.size()));
    for (int j = 0; j < static_cast<int>(jobs_.size()); ++j) {
      const int q = book_.Find(jobs_[j]->queue);
      (q < 0 ? unknown_queue_ : lines_[q]).push_back(j);
    }

    for (const WorkerSlots& worker : workers) {
      if (!worker.schedulable || worker.total_slots == 0) continue;
      WorkerState state;
      state.in = &worker;
      state.available = worker.free_slots;
      if (worker.allocatable_cpus > 0) {
        state.cpu_cap = MilliDown(worker.allocatable_cpus);
        state.cpu_left = std::max<long long>(0, state.cpu_cap - MilliUp(worker.reserved_cpus));
      }
      if (worker.allocatable_memory > 0) {
        state.mem_cap = worker.allocatable_memory;
        state.mem_left = std::max<long long>(0, state.mem_cap - worker.reserved_memory);
      }
      std::sort(state.available.begin(), state.available.end());
      state.busy = internal::BusyBounds(worker);
      workers_.push_back(std::move(state));
    }
    std::sort(workers_.begin(), workers_.end(), [](const WorkerState& a, const WorkerState& b) {
      return a.in->worker_id < b.in->worker_id;
    });
    for (int w = 0; w < static_cast<int>(workers_.size()); ++w) {
      for (KindPool* pool :
           {&pools_[KindIndex(workers_[w].in->kind)], FlavorPool(workers_[w].in)}) {
        if (pool == nullptr) continue;
        pool->workers.push_back(w);
        pool->capacity += workers_[w].in->total_slots;
      }
    }
    book_.SetCapacity({pools_[0].capacity, pools_[1].capacity});
  }

  ScheduleResult Run() {
    ScheduleResult result;
    // Jobs that would borrow, set aside by the first round, per queue.
    std::vector<std::vector<int>> borrowing(lines_.size());
    ByShare(book_, jobs_, lines_, [&](int j, int q) {
      if (!ScheduleJob(j, q, /*may_borrow=*/false, result)) borrowing[q].push_back(j);
    });
    ByShare(book_, jobs_, borrowing,
            [&](int j, int q) { ScheduleJob(j, q, /*may_borrow=*/true, result); });
    for (int j : unknown_queue_) ScheduleJob(j, -1, /*may_borrow=*/true, result);
    return result;
  }

 private:
  // The pool of a GPU worker's flavor (see Flavors); null for the others.
  KindPool* FlavorPool(const WorkerSlots* w) {
    return w->kind == SlotKind::kGpu && !w->gpu_flavor.empty() ? &flavor_pools_[w->gpu_flavor]
                                                               : nullptr;
  }
  // The pool a job draws on: its kind's, or its flavor's (empty when no
  // worker has that flavor).
  KindPool& PoolOf(SlotKind kind, const std::string& flavor) {
    return flavor.empty() ? pools_[KindIndex(kind)] : flavor_pools_[flavor];
  }
  // Only one job of a kind preempts per pass, whatever its flavor.
  bool& Preempted(SlotKind kind) { return pools_[KindIndex(kind)].preempted; }

  SlotKind ResolveKind(DeviceRequirement device, const std::string& flavor) const {
    if (!flavor.empty()) return SlotKind::kGpu;
    switch (device) {
      case DeviceRequirement::kCuda:
        return SlotKind::kGpu;
      case DeviceRequirement::kCpu:
        return SlotKind::kCpu;
      case DeviceRequirement::kAuto:
        break;
    }
    return pools_[KindIndex(SlotKind::kGpu)].workers.empty() ? SlotKind::kCpu : SlotKind::kGpu;
  }

  // Considers job `j` of queue `q` (-1: not defined). Returns false, doing
  // nothing, when it would borrow and `may_borrow` is false (the first
  // round); otherwise the job ends in placements or pending.
  bool ScheduleJob(int j, int q, bool may_borrow, ScheduleResult& result) {
    const PendingJob& asked = *jobs_[j];
    const bool elastic = asked.min_world_size >= 1 && asked.min_world_size < asked.world_size;
    // What the job needs at least: an elastic job is blocked, reserves and
    // counts against capacity and quota as a job of its minimum size.
    PendingJob least = asked;
    if (elastic) least.world_size = asked.min_world_size;
    const PendingJob& job = least;
    const std::string need = elastic ? absl::StrCat("at least ", job.world_size,
                                                    " (elastic, up to ", asked.world_size, ")")
                                     : absl::StrCat(job.world_size);
    const SlotKind kind = ResolveKind(job.device, job.gpu_flavor);
    KindPool& pool = PoolOf(kind, job.gpu_flavor);
    const Request req = RequestOf(asked);
    // "4 cpu slots", with what each rank asks for when it has resources.
    std::string slots_text =
        absl::StrCat(need, " ", internal::KindText(kind, job.gpu_flavor), " slots",
                     req.limited ? absl::StrCat(" of ", PerRankText(req)) : "");
    if (req.per_node > 0)
      absl::StrAppend(&slots_text, " on ", asked.nodes, " workers, ", req.per_node, " on each");

    PendingJobStatus pending;
    pending.job_id = job.job_id;
    pending.kind = kind;
    if (!asked.gpu_flavor.empty() && asked.device == DeviceRequirement::kCpu) {
      pending.reason = PendingReason::kInvalidJob;
      pending.message =
          absl::StrCat("gpu_flavor ", asked.gpu_flavor, " asks for GPUs, but device is cpu");
      result.pending.push_back(std::move(pending));
      return true;
    }
    if (asked.nodes != 0 && (asked.nodes < 0 || asked.world_size < 1 ||
                             asked.world_size % asked.nodes != 0 || elastic)) {
      pending.reason = PendingReason::kInvalidJob;
      pending.message = asked.nodes < 0 || asked.world_size < 1
                            ? absl::StrCat("nodes must be >= 0 and world_size >= 1, got nodes ",
                                           asked.nodes, ", world_size ", asked.world_size)
                        : elastic ? absl::StrCat("nodes (", asked.nodes,
                                                 ") does not combine with an elastic world size")
                                  : absl::StrCat("world_size ", asked.world_size,
                                                 " is not a multiple of nodes (", asked.nodes, ")");
      result.pending.push_back(std::move(pending));
      return true;
    }
    if (CannotFit(job, q, need, req, pool, pending)) {
      result.pending.push_back(std::move(pending));
      return true;
    }
    const internal::Demand per_rank = book_.PerRank(kind, req.cpu, req.mem, job.gpu_flavor);
    const Admission admission = book_.Admit(q, per_rank, job.world_size);
    if (admission == Admission::kBorrow && !may_borrow) return false;
    if (admission == Admission::kOverQuota) {
      // Over its queue's nominal only because of the queue's own jobs of a
      // lower priority: those are preempted (ChooseVictims keeps the queue
      // within its nominal).
      if (!Preempted(kind) &&
          Preempt(j, q, job, slots_text, req, per_rank, pool, FreeIn(pool, req), pending, result)) {
        result.pending.push_back(std::move(pending));
        return true;
      }
      pending.reason = PendingReason::kQuotaExceeded;
      pending.message =
          absl::StrCat("needs ", slots_text, ", more than its queue's quota admits now (",
                       book_.QuotaText(q, per_rank, job.world_size), ")");
      result.pending.push_back(std::move(pending));
      return true;
    }
    const PoolFree free = FreeIn(pool, req);
    if (admission != Admission::kReclaim) {
      // Without queues every bound but world_size and availability is unbounded.
      const long long size =
          std::min({static_cast<long long>(asked.world_size), free.available,
                    book_.Headroom(q, per_rank, may_borrow), book_.MaxJobSize(q)});
      if (size >= job.world_size) {
        PendingJob sized = asked;
        sized.world_size = static_cast<int>(size);
        result.placements.push_back(Place(sized, req, kind, pool));
        book_.Charge(q, kind, per_rank, size, asked.owner);
        worker_flavors_.ChargeUnflavored(book_, q, asked.gpu_flavor, result.placements.back());
        return true;
      }
      if (Backfill(asked, job, q, kind, req, per_rank, pool, free, may_borrow, result)) return true;
    }
    const bool reclaims =
        admission == Admission::kWithinNominal || admission == Admission::kReclaim;
    if (reclaims && !Preempted(kind) &&
        Preempt(j, q, job, slots_text, req, per_rank, pool, free, pending, result)) {
      result.pending.push_back(std::move(pending));
      return true;
    }
    if (admission == Admission::kReclaim) {
      pending.reason = PendingReason::kQuotaExceeded;
      pending.message = absl::StrCat(
          "needs ", slots_text, " within its queue's nominal quota (",
          book_.QuotaText(q, per_rank, job.world_size),
          "), but the cohort lent that quota out and preempting borrowers cannot free enough");
      result.pending.push_back(std::move(pending));
      return true;
    }
    Wait(j, job, slots_text, req, pool, free, pending);
    result.pending.push_back(std::move(pending));
    return true;
  }

  // True (with `pending` saying why) when `job` of queue `q` cannot be
  // placed however many slots free up: it is invalid, its queue is not
  // defined, it is larger than its queue allows, no worker has its kind of
  // slot, or it needs more than the whole cluster has.
  bool CannotFit(const PendingJob& job, int q, const std::string& need, const Request& req,
                 const KindPool& pool, PendingJobStatus& pending) const {
    const std::string kind_name = internal::KindText(pending.kind, job.gpu_flavor);
    if (job.world_size < 1) {
      pending.reason = PendingReason::kInvalidJob;
      pending.message = absl::StrCat("world_size must be >= 1, got ", job.world_size);
      return true;
    }
    if (q < 0) {
      pending.reason = PendingReason::kUnknownQueue;
      pending.message =
          absl::StrCat("queue \"", job.queue.empty() ? "default" : job.queue, "\" is not defined");
      return true;
    }
    if (job.world_size > book_.MaxJobSize(q)) {
      pending.reason = PendingReason::kExceedsQueueLimit;
      pending.message =
          absl::StrCat("needs ", need, " ", kind_name, " slots, queue ", book_.Name(q),
                       " takes jobs of at most ", book_.MaxJobSize(q), " (max_job_size)");
      return true;
    }
    if (pool.workers.empty()) {
      pending.reason = PendingReason::kNoWorkerOfKind;
      pending.message = absl::StrCat("no schedulable worker has ", kind_name, " slots");
      if (!job.gpu_flavor.empty())
        absl::StrAppend(&pending.message, internal::FlavorsText(flavor_pools_));
      if (job.device == DeviceRequirement::kAuto && job.gpu_flavor.empty()) {
        absl::StrAppend(&pending.message, " (device auto: no GPU worker either)");
      }
      return true;
    }
    if (job.world_size > pool.capacity) {
      pending.reason = PendingReason::kExceedsCapacity;
      pending.message = absl::StrCat(
          "needs ", need, " ", kind_name, " slots, the cluster has ", pool.capacity,
          " in total across ", Count(static_cast<int>(pool.workers.size()), "worker", "workers"),
          "; it cannot fit until workers join");
      return true;
    }
    if (req.per_node > 0) {
      int hosts = 0;
      for (int w : pool.workers) hosts += workers_[w].in->total_slots >= req.per_node;
      if (hosts < job.nodes) {
        pending.reason = PendingReason::kExceedsCapacity;
        pending.message =
            absl::StrCat("needs ", need, " ", kind_name, " slots on ", job.nodes, " workers, ",
                         req.per_node, " on each (scheduling.nodes), and ", hosts, " of the ",
                         Count(static_cast<int>(pool.workers.size()), "schedulable worker",
                               "schedulable workers"),
                         " of its kind ", hosts == 1 ? "has" : "have", " ",
                         Count(static_cast<int>(req.per_node), "slot", "slots"),
                         " or more; it cannot fit until workers join");
        return true;
      }
    }
    if (req.limited && ResourcesNeverFit(workers_, job, need, req, pool, pending)) return true;
    const internal::Demand per_rank = book_.PerRank(pending.kind, req.cpu, req.mem, job.gpu_flavor);
    for (int d = 0; d < book_.dims(); ++d) {
      const long long ceiling = book_.Ceiling(q, d);
      if (per_rank[d] <= 0 || internal::Times(per_rank[d], job.world_size) <= ceiling) continue;
      pending.reason = PendingReason::kExceedsQueueLimit;
      pending.message =
          d < kNumKinds || d >= internal::kBaseDims
              ? absl::StrCat("needs ", need, " ", kind_name, " slots, more than queue ",
                             book_.Name(q), "'s ", d < kNumKinds ? "nominal" : book_.DimFlavor(d),
                             " quota with all its cohort could ever lend (", ceiling, ")")
              : absl::StrCat(
                    "needs ", internal::DimAmount(d, internal::Times(per_rank[d], job.world_size)),
                    " (", need, " ranks of ", PerRankText(req), "), more than queue ",
                    book_.Name(q), "'s nominal quota with all its cohort could ever lend (",
                    internal::DimAmount(d, ceiling), ")");
      return true;
    }
    return false;
  }

  // A pool's slots this pass: available, and reserved by its holders.
  struct PoolFree {
    long long available = 0;
    long long reserved = 0;
  };
  // For a job of request `req`: available = the ranks it can take outside
  // every reservation, reserved = those it could take besides if nothing
  // were reserved (slots for a job without resources).
  PoolFree FreeIn(const KindPool& pool, const Request& req) const {
    PoolFree f;
    for (int w : pool.workers) {
      const long long usable = Usable(req, workers_[w]);
      f.available += usable;
      f.reserved += UsableIgnoringReservations(req, workers_[w]) - usable;
    }
    return f;
  }

  // Whether a job of request `r` (or a head) may backfill: its reservation
  // is in whole slots (see Backfill by runtime).
  static bool InWholeSlots(const Request& r) { return !r.limited && r.per_node == 0; }

  // Places `asked` (`job`: its least size) on available and reserved slots when
  // it ends before the head could start (Backfill by runtime); else false.
  bool Backfill(const PendingJob& asked, const PendingJob& job, int q, SlotKind kind,
                const Request& req, const internal::Demand& per_rank, KindPool& pool,
                const PoolFree& free, bool may_borrow, ScheduleResult& result) {
    // An undated head may start when any unbounded job ends: nothing backfills.
    if (pool.head < 0 || Preempted(kind) || !InWholeSlots(req) || !std::isfinite(pool.shadow_s) ||
        asked.runtime_bound_s <= 0 || asked.runtime_bound_s > pool.shadow_s) {
      return false;
    }
    const long long size =
        std::min({static_cast<long long>(asked.world_size), free.available + free.reserved,
                  book_.Headroom(q, per_rank, may_borrow), book_.MaxJobSize(q)});
    if (size < job.world_size) return false;
    PendingJob sized = asked;
    sized.world_size = static_cast<int>(size);
    Placement placement = Place(sized, req, kind, pool, /*into_reserved=*/true);
    placement.backfilled_before = jobs_[pool.head]->job_id;
    result.placements.push_back(std::move(placement));
    book_.Charge(q, kind, per_rank, size, asked.owner);
    worker_flavors_.ChargeUnflavored(book_, q, asked.gpu_flavor, result.placements.back());
    return true;
  }

  // Job `j` (`job`: its least size) of queue `q`, within its nominal quota
  // but blocked, picks running jobs to preempt (see the header). Returns
  // false, changing nothing, when preempting cannot free enough.
  bool Preempt(int j, int q, const PendingJob& job, const std::string& slots_text,
               const Request& req, const internal::Demand& per_rank, KindPool& pool,
               const PoolFree& f, PendingJobStatus& pending, ScheduleResult& result) {
    const internal::VictimChoice choice = book_.ChooseVictims(
        q, pending.kind, job.priority, per_rank, job.world_size, f.available, job.gpu_flavor);
    if (!choice.enough) return false;
    Preempted(pending.kind) = true;
    if (pool.head < 0) pool.head = j;
    pool.holders.push_back(j);
    Reserve(job, req, pool, pending.reserved_slots);
    pending.reason = PendingReason::kPreempting;
    pending.message = absl::StrCat("needs ", slots_text, " within its queue's nominal quota (",
                                   book_.QuotaText(q, per_rank, job.world_size), "), ",
                                   FreeText(workers_, pool, f.available + f.reserved, req));
    std::vector<std::string> names;
    if (choice.victims.empty()) {
      for (const RunningJob* r : choice.stopping) names.push_back(r->job_id);
      absl::StrAppend(&pending.message, "; waiting for stopping jobs ", absl::StrJoin(names, ", "),
                      " to free their slots");
    } else {
      for (const RunningJob* r : choice.victims) {
        names.push_back(absl::StrCat(r->job_id, " (queue ", r->queue.empty() ? "default" : r->queue,
                                     ", priority ", r->priority, ", ", r->slots, " slots)"));
        result.preemptions.push_back({r->job_id, job.job_id});
      }
      absl::StrAppend(&pending.message, "; preempting ", absl::StrJoin(names, ", "));
    }
    if (!pending.reserved_slots.empty()) {
      absl::StrAppend(&pending.message, "; holds ", pending.reserved_slots.size(),
                      " free slots meanwhile");
    }
    return true;
  }

  // Job `j` (`job`: its least size) waits: the first blocked job of its kind
  // takes the reservation; a later one says whom it waits behind.
  void Wait(int j, const PendingJob& job, const std::string& slots_text, const Request& req,
            KindPool& pool, const PoolFree& f, PendingJobStatus& pending) {
    const long long free = f.available + f.reserved;
    const std::string free_text = FreeText(workers_, pool, f.available + f.reserved, req);
    if (pool.head < 0) {
      // First blocked job of this kind: it holds the reservation.
      pool.head = j;
      pool.holders.push_back(j);
      const double shadow = Reserve(job, req, pool, pending.reserved_slots);
      if (InWholeSlots(req)) pool.shadow_s = shadow;
      pending.reason = PendingReason::kInsufficientFreeSlots;
      pending.message = absl::StrCat("needs ", slots_text, ", ", free_text, "; first in line");
      if (!pending.reserved_slots.empty()) {
        absl::StrAppend(&pending.message, ", holds ", pending.reserved_slots.size(),
                        " of them until enough free up");
      }
      return;
    }
    const PendingJob& head = *jobs_[pool.head];
    pending.blocked_by = head.job_id;
    if (free >= job.world_size) {
      std::vector<std::string> holders;
      for (int h : pool.holders) holders.push_back(jobs_[h]->job_id);
      pending.reason = PendingReason::kBlockedByReservation;
      pending.message =
          absl::StrCat("waiting behind job ", head.job_id, " (priority ", head.priority,
                       ", reserved): needs ", slots_text, ", ", free_text, " but ", f.reserved,
                       " of them are reserved for ", absl::StrJoin(holders, " and "));
      if (std::isfinite(pool.shadow_s) && !Preempted(pending.kind) && InWholeSlots(req)) {
        absl::StrAppend(&pending.message, "; a runtime limit (with the stop grace) of at most ",
                        static_cast<long long>(pool.shadow_s),
                        " s would let it start now (backfill)");
      }
    } else {
      pending.reason = PendingReason::kInsufficientFreeSlots;
      pending.message = absl::StrCat("needs ", slots_text, ", ", free_text, "; queued behind job ",
                                     head.job_id, " (reserved)");
    }
  }

  // Places `job` on available slots of `pool` (the caller checked there are
  // enough) and removes them from the pool.
  // With `into_reserved` (a job in whole slots: Backfill) it takes reserved
  // slots too, available ones first.
  Placement Place(const PendingJob& job, const Request& req, SlotKind kind, KindPool& pool,
                  bool into_reserved = false) {
    std::vector<long long> counts, counts_avoiding;
    long long total_avoiding = 0;
    for (int w : pool.workers) {
      const long long n =
          into_reserved ? UsableIgnoringReservations(req, workers_[w]) : Usable(req, workers_[w]);
      counts.push_back(n);
      const bool avoid = std::find(job.avoid_workers.begin(), job.avoid_workers.end(),
                                   workers_[w].in->worker_id) != job.avoid_workers.end();
      counts_avoiding.push_back(avoid ? 0 : n);
      total_avoiding += avoid ? 0 : n;
    }
    const bool avoiding = !job.avoid_workers.empty() && total_avoiding >= job.world_size;
    std::vector<Share> shares;
    if (req.per_node > 0) {
      // Exactly `nodes` hosts: the tightest that hold per_node (see Nodes).
      std::vector<long long> room;
      for (size_t c = 0; c < pool.workers.size(); ++c) {
        const long long usable = avoiding ? counts_avoiding[c] : counts[c];
        room.push_back(usable > 0 ? RoomNow(req, workers_[pool.workers[c]]) : 0);
      }
      shares = ChooseNodes(room, job.nodes, req.per_node);
    } else {
      shares = ChooseWorkers(avoiding ? counts_avoiding : counts, job.world_size);
    }

    Placement placement;
    placement.job_id = job.job_id;
    placement.kind = kind;
    placement.world_size = job.world_size;
    placement.num_nodes = static_cast<int>(shares.size());
    int rank = 0;
    for (int node = 0; node < static_cast<int>(shares.size()); ++node) {
      WorkerState& worker = workers_[pool.workers[shares[node].candidate]];
      const int take = shares[node].take;
      std::vector<int> from = worker.available;
      if (into_reserved) from.insert(from.end(), worker.reserved.begin(), worker.reserved.end());
      for (int local = 0; local < take; ++local) {
        RankAssignment assignment;
        assignment.rank = rank++;
        assignment.worker_id = worker.in->worker_id;
        assignment.slot = from[local];
        assignment.local_rank = local;
        assignment.local_world_size = take;
        assignment.node_rank = node;
        placement.ranks.push_back(std::move(assignment));
      }
      const int from_available = std::min(take, static_cast<int>(worker.available.size()));
      worker.available.erase(worker.available.begin(), worker.available.begin() + from_available);
      worker.reserved.erase(worker.reserved.begin(),
                            worker.reserved.begin() + (take - from_available));
      TakeResources(req, worker, take);
      internal::AddBusy(worker, take, job.runtime_bound_s);
    }
    return placement;
  }

  // Holds slots for the blocked head `job` so later jobs of its kind cannot
  // take them. See the header for the choice of target workers. Returns
  // when its targets will hold its whole share (see Backfill by runtime;
  // meaningful for a job in whole slots).
  double Reserve(const PendingJob& job, const Request& req, KindPool& pool,
                 std::vector<SlotRef>& out) {
    std::vector<Share> targets;
    int single = -1;
    for (int c = 0; c < static_cast<int>(pool.workers.size()); ++c) {
      const WorkerState& worker = workers_[pool.workers[c]];
      if (IdleFit(req, worker) < job.world_size) continue;
      if (single < 0) {
        single = c;
        continue;
      }
      const WorkerState& best = workers_[pool.workers[single]];
      const long long held = std::min<long long>(Usable(req, worker), job.world_size);
      const long long best_held = std::min<long long>(Usable(req, best), job.world_size);
      if (held > best_held ||
          (held == best_held && worker.in->total_slots < best.in->total_slots)) {
        single = c;
      }
    }
    if (single >= 0) {
      targets.push_back({single, job.world_size});
    } else {
      std::vector<long long> totals;
      for (int w : pool.workers) totals.push_back(IdleFit(req, workers_[w]));
      targets = ChooseWorkers(totals, job.world_size);
    }
    // Order by worker id so reserved_slots reads in a stable order.
    std::sort(targets.begin(), targets.end(),
              [](const Share& a, const Share& b) { return a.candidate < b.candidate; });
    double shadow = 0;
    for (const Share& target : targets) {
      WorkerState& worker = workers_[pool.workers[target.candidate]];
      const int hold = std::min(target.take, static_cast<int>(worker.available.size()));
      shadow = std::max(shadow, internal::FreedWithin(worker, target.take - hold));
      for (int i = 0; i < hold; ++i) {
        worker.reserved.push_back(worker.available[i]);
        out.push_back({worker.in->worker_id, worker.available[i]});
      }
      worker.available.erase(worker.available.begin(), worker.available.begin() + hold);
      HoldResources(req, worker, target.take);
    }
    return shadow;
  }

  // Quota accounting; without queues, one unlimited queue.
  QueueBook book_;
  // Sorted by ScheduledBefore.
  std::vector<const PendingJob*> jobs_;
  // Per queue (QueueBook index), its jobs' indices in jobs_, in order.
  std::vector<std::vector<int>> lines_;
  // Jobs naming a queue that is not defined, in order.
  std::vector<int> unknown_queue_;
  // Schedulable workers with slots, sorted by id.
  std::vector<WorkerState> workers_;
  std::array<KindPool, kNumKinds> pools_;
  // The GPU workers of each flavor (a subset of the GPU pool, sharing its
  // workers' slots), by flavor; a flavor no worker has maps to an empty pool.
  std::map<std::string, KindPool> flavor_pools_;
  // Where each GPU worker's slots count (see Flavor quotas).
  internal::WorkerFlavors worker_flavors_;
};

}  // namespace

absl::StatusOr<ScheduleResult> Schedule(absl::Span<const PendingJob> jobs,
                                        absl::Span<const WorkerSlots> workers) {
  return Schedule(jobs, workers, QueueInput{});
}

absl::StatusOr<ScheduleResult> Schedule(absl::Span<const PendingJob> jobs,
                                        absl::Span<const WorkerSlots> workers,
                                        const QueueInput& queues) {
  if (absl::Status status = ValidateInput(jobs, workers); !status.ok()) return status;
  if (absl::Status status = internal::ValidateQueues(jobs, queues); !status.ok()) return status;
  if (absl::Status status = internal::ValidateFlavorQuotas(queues); !status.ok()) return status;
  return Pass(jobs, workers, queues).Run();
}

}  // namespace trainctl::scheduler
