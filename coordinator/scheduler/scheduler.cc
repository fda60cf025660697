#include "coordinator/scheduler/scheduler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/format_bytes.h"
#include "coordinator/scheduler/queue_admission.h"

namespace trainctl::scheduler {
namespace {

using internal::Admission;
using internal::KindIndex;
using internal::kNumKinds;
using internal::QueueBook;

std::string Count(int n, const char* singular, const char* plural) {
  return absl::StrCat(n, " ", n == 1 ? singular : plural);
}

// CPUs in thousandths (see Resources in scheduler.h): a request rounds up,
// an allocatable down, so that sums are exact. Bounded far below overflow.
constexpr double kMaxMilli = 1e15;
long long MilliUp(double cpus) {
  return static_cast<long long>(std::ceil(std::min(cpus * 1000, kMaxMilli) - 1e-6));
}
long long MilliDown(double cpus) {
  return static_cast<long long>(std::floor(std::min(cpus * 1000, kMaxMilli) + 1e-6));
}

// "1.5", "4": thousandths of a CPU as a person writes CPUs.
std::string CpuText(long long milli) { return absl::StrCat(static_cast<double>(milli) / 1000); }

// What one rank of a job asks for (see Resources).
struct Request {
  // Thousandths of a CPU and bytes; 0 = not asked for.
  long long cpu = 0;
  long long mem = 0;
  // The job has resources: only workers that enforce limits.
  bool limited = false;
  // Ranks on each of its workers (see Nodes); 0 = no per-host shape.
  long long per_node = 0;
};

Request RequestOf(const PendingJob& job) {
  Request r;
  if (job.nodes > 0 && job.world_size > 0) r.per_node = job.world_size / job.nodes;
  r.cpu = job.cpus > 0 ? std::max<long long>(1, MilliUp(job.cpus)) : 0;
  r.mem = job.memory_bytes;
  r.limited = r.cpu > 0 || r.mem > 0 || job.other_limits;
  return r;
}

// "4 cpus and 8 GiB memory per rank".
std::string PerRankText(const Request& r) {
  std::vector<std::string> parts;
  if (r.cpu > 0) parts.push_back(absl::StrCat(CpuText(r.cpu), r.cpu == 1000 ? " cpu" : " cpus"));
  if (r.mem > 0) parts.push_back(absl::StrCat(FormatBytes(r.mem), " memory"));
  if (parts.empty()) return "resource limits (pids) per rank";
  return absl::StrCat(absl::StrJoin(parts, " and "), " per rank");
}

// A schedulable worker during one pass.
struct WorkerState {
  const WorkerSlots* in = nullptr;
  // Free slots neither placed nor reserved in this pass, ascending.
  std::vector<int> available;
  // Slots held for the jobs holding this kind's reservations.
  std::vector<int> reserved;
  // Resources (thousandths of a CPU, bytes): allocatable (-1 = unknown: no
  // bound), what is left of it after the running ranks' reservations and
  // this pass's placements and holds (-1 = no bound; else >= 0), and of
  // what is not left, what this pass's reservations hold.
  long long cpu_cap = -1, mem_cap = -1;
  long long cpu_left = -1, mem_left = -1;
  long long cpu_held = 0, mem_held = 0;
};

// How many ranks of `r` fit in `slots` slots and the given CPUs and memory
// (-1: no bound) of `w`, whatever the job's per-host shape.
long long Room(const Request& r, const WorkerState& w, long long slots, long long cpu, long long mem) {
  if (!r.limited) return slots;
  if (!w.in->enforces_limits) return 0;
  long long n = slots;
  if (r.cpu > 0 && cpu >= 0) n = std::min(n, cpu / r.cpu);
  if (r.mem > 0 && mem >= 0) n = std::min(n, mem / r.mem);
  return std::max<long long>(0, n);
}

// What a worker with room for `n` ranks gives a job of `r`: n, or for a
// job with a per-host shape exactly per_node ranks or none (see Nodes).
long long Clamp(const Request& r, long long n) {
  if (r.per_node <= 0) return n;
  return n >= r.per_node ? r.per_node : 0;
}

long long Fit(const Request& r, const WorkerState& w, long long slots, long long cpu, long long mem) {
  return Clamp(r, Room(r, w, slots, cpu, mem));
}

// Ranks of `r` that `w` can take now, outside every reservation.
long long Usable(const Request& r, const WorkerState& w) {
  return Fit(r, w, static_cast<long long>(w.available.size()), w.cpu_left, w.mem_left);
}

// The same before the per-host clamp: how much room `w` has now (to pick
// the tightest hosts for a job with nodes).
long long RoomNow(const Request& r, const WorkerState& w) {
  return Room(r, w, static_cast<long long>(w.available.size()), w.cpu_left, w.mem_left);
}

// The same if no reservation held anything on `w`.
long long UsableIgnoringReservations(const Request& r, const WorkerState& w) {
  return Fit(r, w, static_cast<long long>(w.available.size() + w.reserved.size()),
             w.cpu_left < 0 ? -1 : w.cpu_left + w.cpu_held, w.mem_left < 0 ? -1 : w.mem_left + w.mem_held);
}

// Ranks of `r` that `w` could hold with nothing running on it.
long long IdleFit(const Request& r, const WorkerState& w) {
  return Fit(r, w, w.in->total_slots, w.cpu_cap, w.mem_cap);
}

// n x per, saturated far below overflow (a request may be any finite size).
long long Times(long long n, long long per) {
  constexpr long long kHuge = 1LL << 62;
  if (per != 0 && n > kHuge / per) return kHuge;
  return n * per;
}

// Takes `n` placed ranks' worth of `r`'s resources out of what is left on
// `w` (the caller checked they fit).
void TakeResources(const Request& r, WorkerState& w, long long n) {
  if (!r.limited) return;
  if (w.cpu_left >= 0) w.cpu_left = std::max<long long>(0, w.cpu_left - Times(n, r.cpu));
  if (w.mem_left >= 0) w.mem_left = std::max<long long>(0, w.mem_left - Times(n, r.mem));
}

// For a reservation of `n` ranks of `r` on `w`: holds up to n ranks' worth
// of each resource, as much as is left, each on its own (not whole ranks:
// CPUs that free up in pieces smaller than a rank must still accumulate for
// the head, or a stream of small jobs could take every piece).
void HoldResources(const Request& r, WorkerState& w, long long n) {
  if (!r.limited) return;
  if (w.cpu_left >= 0) {
    const long long h = std::min(w.cpu_left, Times(n, r.cpu));
    w.cpu_left -= h;
    w.cpu_held += h;
  }
  if (w.mem_left >= 0) {
    const long long h = std::min(w.mem_left, Times(n, r.mem));
    w.mem_left -= h;
    w.mem_held += h;
  }
}

// One device kind's pool during one pass.
struct KindPool {
  // Indices into the id-sorted worker vector.
  std::vector<int> workers;
  // Sum of total_slots over `workers`.
  long long capacity = 0;
  // Index of the job holding this kind's reservation, or -1 when no job of
  // this kind has been blocked yet in this pass.
  int head = -1;
  // Jobs holding reserved slots of this kind: the head, and a job that
  // preempts for slots when it is not the head.
  std::vector<int> holders;
  // Whether a job of this kind has preempted (or waits for stopping jobs)
  // in this pass: only one may.
  bool preempted = false;
};

// A share of a job on one worker, in node order.
struct Share {
  int candidate = 0;  // index into the counts vector given to ChooseWorkers
  int take = 0;
};

// Picks workers for `need` ranks given each candidate's usable count
// (candidates in worker-id order). Fewest workers: the tightest single worker
// that holds everything, else the largest blocks first and the tightest
// worker for the remainder. Empty when the counts do not add up to `need`.
std::vector<Share> ChooseWorkers(const std::vector<long long>& counts, long long need) {
  std::vector<Share> shares;
  std::vector<bool> used(counts.size(), false);
  long long remaining = need;
  while (remaining > 0) {
    int tightest = -1;
    int largest = -1;
    for (int i = 0; i < static_cast<int>(counts.size()); ++i) {
      if (used[i] || counts[i] <= 0) continue;
      if (counts[i] >= remaining && (tightest < 0 || counts[i] < counts[tightest])) tightest = i;
      if (largest < 0 || counts[i] > counts[largest]) largest = i;
    }
    if (tightest >= 0) {
      shares.push_back({tightest, static_cast<int>(remaining)});
      return shares;
    }
    if (largest < 0) return {};
    used[largest] = true;
    shares.push_back({largest, static_cast<int>(counts[largest])});
    remaining -= counts[largest];
  }
  return shares;
}

// For a job with nodes: the `nodes` candidates whose room (`room`, in
// worker-id order) holds `per_node`, the tightest first (ties by worker
// id), each taking per_node, in worker-id order. Empty when fewer qualify.
std::vector<Share> ChooseNodes(const std::vector<long long>& room, int nodes, long long per_node) {
  std::vector<int> able;
  for (int i = 0; i < static_cast<int>(room.size()); ++i) {
    if (room[i] >= per_node) able.push_back(i);
  }
  if (static_cast<int>(able.size()) < nodes) return {};
  std::stable_sort(able.begin(), able.end(), [&](int a, int b) { return room[a] < room[b]; });
  able.resize(static_cast<size_t>(nodes));
  std::sort(able.begin(), able.end());
  std::vector<Share> shares;
  for (int i : able) shares.push_back({i, static_cast<int>(per_node)});
  return shares;
}

// InvalidArgument naming `field` unless `value` is finite and >= 0.
absl::Status NonNegative(const std::string& where, const char* field, double value) {
  if (std::isfinite(value) && value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(where, field, ": must be finite and >= 0, got ", value));
}

absl::Status Validate(absl::Span<const PendingJob> jobs, absl::Span<const WorkerSlots> workers) {
  absl::flat_hash_set<std::string> job_ids;
  for (const PendingJob& job : jobs) {
    if (job.job_id.empty()) return absl::InvalidArgumentError("job_id: empty");
    if (!job_ids.insert(job.job_id).second) {
      return absl::InvalidArgumentError(absl::StrCat("job_id: duplicate \"", job.job_id, "\""));
    }
    const std::string where = absl::StrCat("job \"", job.job_id, "\": ");
    if (absl::Status s = NonNegative(where, "cpus", job.cpus); !s.ok()) return s;
    if (absl::Status s = NonNegative(where, "memory_bytes", static_cast<double>(job.memory_bytes)); !s.ok()) {
      return s;
    }
  }
  absl::flat_hash_set<std::string> worker_ids;
  for (const WorkerSlots& worker : workers) {
    if (worker.worker_id.empty()) return absl::InvalidArgumentError("worker_id: empty");
    if (!worker_ids.insert(worker.worker_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker_id: duplicate \"", worker.worker_id, "\""));
    }
    const std::string where = absl::StrCat("worker \"", worker.worker_id, "\": ");
    for (const auto& [field, value] :
         {std::pair<const char*, double>{"allocatable_cpus", worker.allocatable_cpus},
          std::pair<const char*, double>{"allocatable_memory", static_cast<double>(worker.allocatable_memory)},
          std::pair<const char*, double>{"reserved_cpus", worker.reserved_cpus},
          std::pair<const char*, double>{"reserved_memory", static_cast<double>(worker.reserved_memory)}}) {
      if (absl::Status s = NonNegative(where, field, value); !s.ok()) return s;
    }
    if (worker.total_slots < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "total_slots: must be >= 0, got ", worker.total_slots));
    }
    if (static_cast<long long>(worker.free_slots.size()) > worker.total_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "free_slots: ", worker.free_slots.size(),
                       " listed but total_slots is ", worker.total_slots));
    }
    absl::flat_hash_set<int> slots;
    for (int slot : worker.free_slots) {
      if (slot < 0) {
        return absl::InvalidArgumentError(absl::StrCat(where, "free_slots: negative index ", slot));
      }
      if (!slots.insert(slot).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "free_slots: duplicate index ", slot));
      }
    }
  }
  return absl::OkStatus();
}

// Scheduling order: priority desc, submit_seq asc, job id asc.
bool ScheduledBefore(const PendingJob& a, const PendingJob& b) {
  if (a.priority != b.priority) return a.priority > b.priority;
  if (a.submit_seq != b.submit_seq) return a.submit_seq < b.submit_seq;
  return a.job_id < b.job_id;
}

class Pass {
 public:
  Pass(absl::Span<const PendingJob> jobs, absl::Span<const WorkerSlots> workers,
       const QueueInput& queues)
      : book_(queues) {
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
      workers_.push_back(std::move(state));
    }
    std::sort(workers_.begin(), workers_.end(), [](const WorkerState& a, const WorkerState& b) {
      return a.in->worker_id < b.in->worker_id;
    });
    for (int w = 0; w < static_cast<int>(workers_.size()); ++w) {
      KindPool& pool = pools_[KindIndex(workers_[w].in->kind)];
      pool.workers.push_back(w);
      pool.capacity += workers_[w].in->total_slots;
    }
    book_.SetCapacity({pools_[0].capacity, pools_[1].capacity});
  }

  ScheduleResult Run() {
    ScheduleResult result;
    // Jobs that would borrow, set aside by the first round, per queue.
    std::vector<std::vector<int>> borrowing(lines_.size());
    ByShare(lines_, [&](int j, int q) {
      if (!ScheduleJob(j, q, /*may_borrow=*/false, result)) borrowing[q].push_back(j);
    });
    ByShare(borrowing, [&](int j, int q) { ScheduleJob(j, q, /*may_borrow=*/true, result); });
    for (int j : unknown_queue_) ScheduleJob(j, -1, /*may_borrow=*/true, result);
    return result;
  }

 private:
  // Calls `consider(job, queue)` for every job of `lines` (one list per
  // queue, each in scheduling order): next a job of the queue with the
  // lowest share, ties by fewer slots used, then queue name (queue index
  // order); within the queue the head of an owner (see NextOfQueue).
  template <typename Consider>
  void ByShare(const std::vector<std::vector<int>>& lines, Consider consider) {
    // Per queue, its owners' lines (each in scheduling order) and how far
    // each has been considered. Without queues one line: the order above.
    struct OwnerLine {
      std::vector<int> jobs;
      size_t next = 0;
    };
    std::vector<std::vector<OwnerLine>> owners(lines.size());
    std::vector<size_t> left(lines.size(), 0);
    for (size_t q = 0; q < lines.size(); ++q) {
      absl::flat_hash_map<std::string, size_t> index;
      for (int j : lines[q]) {
        const std::string& owner = book_.implicit() ? std::string() : jobs_[j]->owner;
        auto [it, added] = index.try_emplace(owner, owners[q].size());
        if (added) owners[q].emplace_back();
        owners[q][it->second].jobs.push_back(j);
      }
      left[q] = lines[q].size();
    }
    while (true) {
      int best = -1;
      double best_share = 0;
      long long best_used = 0;
      for (int q = 0; q < static_cast<int>(lines.size()); ++q) {
        if (left[q] == 0) continue;
        const double share = book_.Share(q);
        const long long used = book_.UsedSlots(q);
        if (best < 0 || share < best_share || (share == best_share && used < best_used)) {
          best = q, best_share = share, best_used = used;
        }
      }
      if (best < 0) return;
      // The owner whose head goes next: highest priority, then lowest
      // owner share, then scheduling order.
      OwnerLine* pick = nullptr;
      double pick_share = 0;
      for (OwnerLine& line : owners[best]) {
        if (line.next >= line.jobs.size()) continue;
        const PendingJob& head = *jobs_[line.jobs[line.next]];
        const double share = book_.OwnerShare(best, head.owner);
        if (pick != nullptr) {
          const PendingJob& other = *jobs_[pick->jobs[pick->next]];
          if (head.priority != other.priority) {
            if (head.priority < other.priority) continue;
          } else if (share != pick_share) {
            if (share > pick_share) continue;
          } else if (!ScheduledBefore(head, other)) {
            continue;
          }
        }
        pick = &line, pick_share = share;
      }
      --left[best];
      consider(pick->jobs[pick->next++], best);
    }
  }

  SlotKind ResolveKind(DeviceRequirement device) const {
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
    const std::string need =
        elastic ? absl::StrCat("at least ", job.world_size, " (elastic, up to ", asked.world_size, ")")
                : absl::StrCat(job.world_size);
    const SlotKind kind = ResolveKind(job.device);
    KindPool& pool = pools_[KindIndex(kind)];
    const Request req = RequestOf(asked);
    // "4 cpu slots", with what each rank asks for when it has resources.
    std::string slots_text = absl::StrCat(need, " ", SlotKindName(kind), " slots",
                                          req.limited ? absl::StrCat(" of ", PerRankText(req)) : "");
    if (req.per_node > 0) absl::StrAppend(&slots_text, " on ", asked.nodes, " workers, ", req.per_node, " on each");

    PendingJobStatus pending;
    pending.job_id = job.job_id;
    pending.kind = kind;
    if (asked.nodes != 0 && (asked.nodes < 0 || asked.world_size < 1 || asked.world_size % asked.nodes != 0 ||
                             elastic)) {
      pending.reason = PendingReason::kInvalidJob;
      pending.message =
          asked.nodes < 0 || asked.world_size < 1
              ? absl::StrCat("nodes must be >= 0 and world_size >= 1, got nodes ", asked.nodes, ", world_size ",
                             asked.world_size)
          : elastic ? absl::StrCat("nodes (", asked.nodes, ") does not combine with an elastic world size")
                    : absl::StrCat("world_size ", asked.world_size, " is not a multiple of nodes (", asked.nodes, ")");
      result.pending.push_back(std::move(pending));
      return true;
    }
    if (CannotFit(job, q, need, req, pool, pending)) {
      result.pending.push_back(std::move(pending));
      return true;
    }
    const Admission admission = book_.Admit(q, kind, job.world_size);
    if (admission == Admission::kBorrow && !may_borrow) return false;
    if (admission == Admission::kOverQuota) {
      // Over its queue's nominal only because of the queue's own jobs of a
      // lower priority: those are preempted (ChooseVictims keeps the queue
      // within its nominal).
      if (!pool.preempted && Preempt(j, q, job, slots_text, req, pool, FreeIn(pool, req), pending, result)) {
        result.pending.push_back(std::move(pending));
        return true;
      }
      pending.reason = PendingReason::kQuotaExceeded;
      pending.message = absl::StrCat("needs ", slots_text, ", more than its queue's quota admits now (",
                                     book_.QuotaText(q, kind), ")");
      result.pending.push_back(std::move(pending));
      return true;
    }
    const PoolFree free = FreeIn(pool, req);
    if (admission != Admission::kReclaim) {
      // Without queues every bound but world_size and availability is unbounded.
      const long long size = std::min({static_cast<long long>(asked.world_size), free.available,
                                       book_.Headroom(q, kind, may_borrow), book_.MaxJobSize(q)});
      if (size >= job.world_size) {
        PendingJob sized = asked;
        sized.world_size = static_cast<int>(size);
        result.placements.push_back(Place(sized, req, kind, pool));
        book_.Charge(q, kind, size, asked.owner);
        return true;
      }
    }
    const bool reclaims =
        admission == Admission::kWithinNominal || admission == Admission::kReclaim;
    if (reclaims && !pool.preempted && Preempt(j, q, job, slots_text, req, pool, free, pending, result)) {
      result.pending.push_back(std::move(pending));
      return true;
    }
    if (admission == Admission::kReclaim) {
      pending.reason = PendingReason::kQuotaExceeded;
      pending.message = absl::StrCat(
          "needs ", slots_text, " within its queue's nominal quota (",
          book_.QuotaText(q, kind),
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
    const std::string kind_name = SlotKindName(pending.kind);
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
      if (job.device == DeviceRequirement::kAuto) {
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
        pending.message = absl::StrCat(
            "needs ", need, " ", kind_name, " slots on ", job.nodes, " workers, ", req.per_node,
            " on each (scheduling.nodes), and ", hosts, " of the ", Count(static_cast<int>(pool.workers.size()),
                                                                            "schedulable worker", "schedulable workers"),
            " of its kind ", hosts == 1 ? "has" : "have", " ", Count(static_cast<int>(req.per_node), "slot", "slots"),
            " or more; it cannot fit until workers join");
        return true;
      }
    }
    if (req.limited && ResourcesNeverFit(job, need, req, pool, pending)) return true;
    if (job.world_size > book_.Ceiling(q, pending.kind)) {
      pending.reason = PendingReason::kExceedsQueueLimit;
      pending.message =
          absl::StrCat("needs ", need, " ", kind_name, " slots, more than queue ", book_.Name(q),
                       "'s nominal quota with all its cohort could ever lend (",
                       book_.Ceiling(q, pending.kind), ")");
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

  // "0 of 4 free on 2 workers": all of the kind's workers, busy ones too
  // (counting only those with a free slot said "0 free across 0 workers").
  // With resources: "room for 1 rank on 2 workers (3 of 8 slots, 2 of 16
  // cpus, 10 GiB of 32 GiB memory free)", over the workers that enforce
  // limits and know their allocatable.
  std::string FreeText(const KindPool& pool, const PoolFree& f, const Request& req) const {
    const std::string workers = Count(static_cast<int>(pool.workers.size()), "worker", "workers");
    if (req.per_node > 0) {
      // Whole hosts: how many could take per_node now, and the raw slots.
      long long slots = 0;
      int hosts = 0;
      for (int w : pool.workers) {
        const WorkerState& s = workers_[w];
        slots += static_cast<long long>(s.available.size() + s.reserved.size());
        hosts += UsableIgnoringReservations(req, s) > 0;
      }
      return absl::StrCat(slots, " of ", pool.capacity, " slots free on ", workers, ", ", hosts, " of them with room for ",
                          Count(static_cast<int>(req.per_node), "rank", "ranks"));
    }
    if (!req.limited) {
      return absl::StrCat(f.available + f.reserved, " of ", pool.capacity, " free on ", workers);
    }
    long long slots = 0, cpu_free = 0, cpu_cap = 0, mem_free = 0, mem_cap = 0;
    for (int w : pool.workers) {
      const WorkerState& s = workers_[w];
      slots += static_cast<long long>(s.available.size() + s.reserved.size());
      if (!s.in->enforces_limits) continue;
      if (s.cpu_cap >= 0) cpu_free += s.cpu_left + s.cpu_held, cpu_cap += s.cpu_cap;
      if (s.mem_cap >= 0) mem_free += s.mem_left + s.mem_held, mem_cap += s.mem_cap;
    }
    std::string text = absl::StrCat("room for ", Count(static_cast<int>(f.available + f.reserved), "rank", "ranks"),
                                    " on ", workers, " (", slots, " of ", pool.capacity, " slots");
    if (req.cpu > 0 && cpu_cap > 0) absl::StrAppend(&text, ", ", CpuText(cpu_free), " of ", CpuText(cpu_cap), " cpus");
    if (req.mem > 0 && mem_cap > 0) {
      absl::StrAppend(&text, ", ", FormatBytes(mem_free), " of ", FormatBytes(mem_cap), " memory");
    }
    return absl::StrCat(text, " free)");
  }

  // For a job with resources, after the slot checks: true (with `pending`
  // kExceedsCapacity naming what is short) when the kind's workers, idle,
  // could not hold its least size.
  bool ResourcesNeverFit(const PendingJob& job, const std::string& need, const Request& req,
                         const KindPool& pool, PendingJobStatus& pending) const {
    const char* kind_name = SlotKindName(pending.kind);
    long long capacity = 0;
    int enforcing = 0;
    // The largest known allocatable among the enforcing workers; -1 when one
    // of them does not know it (then that resource never rules a worker out).
    long long max_cpu = 0, max_mem = 0;
    std::vector<std::string> holds;
    for (int w : pool.workers) {
      const WorkerState& s = workers_[w];
      if (!s.in->enforces_limits) continue;
      ++enforcing;
      max_cpu = (max_cpu < 0 || s.cpu_cap < 0) ? -1 : std::max(max_cpu, s.cpu_cap);
      max_mem = (max_mem < 0 || s.mem_cap < 0) ? -1 : std::max(max_mem, s.mem_cap);
      const long long fit = IdleFit(req, s);
      capacity += fit;
      if (fit > 0) holds.push_back(absl::StrCat(s.in->worker_id, ": ", fit));
    }
    if (capacity >= job.world_size) return false;
    pending.reason = PendingReason::kExceedsCapacity;
    if (enforcing == 0) {
      pending.message = absl::StrCat(
          "needs ", PerRankText(req), ", and no schedulable ", kind_name,
          " worker enforces resource limits (cgroups); it cannot fit until such a worker joins");
    } else if (req.cpu > 0 && max_cpu >= 0 && max_cpu < req.cpu) {
      pending.message = absl::StrCat("needs ", CpuText(req.cpu), " cpus per rank; the largest ", kind_name,
                                     " worker that enforces limits has ", CpuText(max_cpu),
                                     " allocatable; it cannot fit until a larger worker joins");
    } else if (req.mem > 0 && max_mem >= 0 && max_mem < req.mem) {
      pending.message = absl::StrCat("needs ", FormatBytes(req.mem), " memory per rank; the largest ", kind_name,
                                     " worker that enforces limits has ", FormatBytes(max_mem),
                                     " allocatable; it cannot fit until a larger worker joins");
    } else {
      pending.message = absl::StrCat(
          "needs ", need, " ", kind_name, " slots of ", PerRankText(req), "; idle, the ",
          Count(enforcing, "worker", "workers"), " that enforce limits would hold ", capacity, " such ranks (",
          holds.empty() ? "none" : absl::StrJoin(holds, ", "), "); it cannot fit until workers join");
    }
    return true;
  }

  // Job `j` (`job`: its least size) of queue `q`, within its nominal quota
  // but blocked, picks running jobs to preempt (see the header). Returns
  // false, changing nothing, when preempting cannot free enough.
  bool Preempt(int j, int q, const PendingJob& job, const std::string& slots_text, const Request& req,
               KindPool& pool, const PoolFree& f, PendingJobStatus& pending, ScheduleResult& result) {
    const internal::VictimChoice choice =
        book_.ChooseVictims(q, pending.kind, job.priority, job.world_size, f.available);
    if (!choice.enough) return false;
    pool.preempted = true;
    if (pool.head < 0) pool.head = j;
    pool.holders.push_back(j);
    Reserve(job, req, pool, pending.reserved_slots);
    pending.reason = PendingReason::kPreempting;
    pending.message = absl::StrCat("needs ", slots_text, " within its queue's nominal quota (",
                                   book_.QuotaText(q, pending.kind), "), ", FreeText(pool, f, req));
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
  void Wait(int j, const PendingJob& job, const std::string& slots_text, const Request& req, KindPool& pool,
            const PoolFree& f, PendingJobStatus& pending) {
    const long long free = f.available + f.reserved;
    const std::string free_text = FreeText(pool, f, req);
    if (pool.head < 0) {
      // First blocked job of this kind: it holds the reservation.
      pool.head = j;
      pool.holders.push_back(j);
      Reserve(job, req, pool, pending.reserved_slots);
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
                       ", reserved): needs ", slots_text, ", ", free_text, " but ",
                       f.reserved, " of them are reserved for ", absl::StrJoin(holders, " and "));
    } else {
      pending.reason = PendingReason::kInsufficientFreeSlots;
      pending.message = absl::StrCat("needs ", slots_text, ", ", free_text, "; queued behind job ",
                                     head.job_id, " (reserved)");
    }
  }

  // Places `job` on available slots of `pool` (the caller checked there are
  // enough) and removes them from the pool.
  Placement Place(const PendingJob& job, const Request& req, SlotKind kind, KindPool& pool) {
    std::vector<long long> counts, counts_avoiding;
    long long total_avoiding = 0;
    for (int w : pool.workers) {
      const long long n = Usable(req, workers_[w]);
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
      for (int local = 0; local < take; ++local) {
        RankAssignment assignment;
        assignment.rank = rank++;
        assignment.worker_id = worker.in->worker_id;
        assignment.slot = worker.available[local];
        assignment.local_rank = local;
        assignment.local_world_size = take;
        assignment.node_rank = node;
        placement.ranks.push_back(std::move(assignment));
      }
      worker.available.erase(worker.available.begin(), worker.available.begin() + take);
      TakeResources(req, worker, take);
    }
    return placement;
  }

  // Holds slots for the blocked head `job` so later jobs of its kind cannot
  // take them. See the header for the choice of target workers.
  void Reserve(const PendingJob& job, const Request& req, KindPool& pool, std::vector<SlotRef>& out) {
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
    for (const Share& target : targets) {
      WorkerState& worker = workers_[pool.workers[target.candidate]];
      const int hold = std::min(target.take, static_cast<int>(worker.available.size()));
      for (int i = 0; i < hold; ++i) {
        worker.reserved.push_back(worker.available[i]);
        out.push_back({worker.in->worker_id, worker.available[i]});
      }
      worker.available.erase(worker.available.begin(), worker.available.begin() + hold);
      HoldResources(req, worker, target.take);
    }
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
};

}  // namespace

const char* SlotKindName(SlotKind kind) { return kind == SlotKind::kGpu ? "cuda" : "cpu"; }

const char* PendingReasonName(PendingReason reason) {
  switch (reason) {
    case PendingReason::kInvalidJob:
      return "invalid_job";
    case PendingReason::kNoWorkerOfKind:
      return "no_worker_of_kind";
    case PendingReason::kExceedsCapacity:
      return "exceeds_capacity";
    case PendingReason::kInsufficientFreeSlots:
      return "insufficient_free_slots";
    case PendingReason::kBlockedByReservation:
      return "blocked_by_reservation";
    case PendingReason::kUnknownQueue:
      return "unknown_queue";
    case PendingReason::kExceedsQueueLimit:
      return "exceeds_queue_limit";
    case PendingReason::kQuotaExceeded:
      return "quota_exceeded";
    case PendingReason::kPreempting:
      return "preempting";
  }
  return "unknown";
}

absl::StatusOr<ScheduleResult> Schedule(absl::Span<const PendingJob> jobs,
                                        absl::Span<const WorkerSlots> workers) {
  return Schedule(jobs, workers, QueueInput{});
}

absl::StatusOr<ScheduleResult> Schedule(absl::Span<const PendingJob> jobs,
                                        absl::Span<const WorkerSlots> workers,
                                        const QueueInput& queues) {
  if (absl::Status status = Validate(jobs, workers); !status.ok()) return status;
  if (absl::Status status = internal::ValidateQueues(jobs, queues); !status.ok()) return status;
  return Pass(jobs, workers, queues).Run();
}

bool PreferNodeZero(Placement& placement, const std::function<bool(const std::string&)>& prefer) {
  // Nodes in node order, each with its ranks in rank order.
  std::vector<std::vector<RankAssignment>> nodes(static_cast<size_t>(placement.num_nodes));
  for (const RankAssignment& r : placement.ranks) {
    if (r.node_rank < 0 || r.node_rank >= placement.num_nodes) return false;
    nodes[static_cast<size_t>(r.node_rank)].push_back(r);
  }
  size_t chosen = nodes.size();
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (!nodes[n].empty() && prefer(nodes[n].front().worker_id)) {
      chosen = n;
      break;
    }
  }
  if (chosen == nodes.size()) return false;
  if (chosen == 0) return true;
  std::rotate(nodes.begin(), nodes.begin() + static_cast<std::ptrdiff_t>(chosen),
              nodes.begin() + static_cast<std::ptrdiff_t>(chosen) + 1);
  std::vector<RankAssignment> ranks;
  int rank = 0;
  for (size_t n = 0; n < nodes.size(); ++n) {
    for (RankAssignment r : nodes[n]) {
      r.rank = rank++;
      r.node_rank = static_cast<int>(n);
      ranks.push_back(std::move(r));
    }
  }
  placement.ranks = std::move(ranks);
  return true;
}

}  // namespace trainctl::scheduler
