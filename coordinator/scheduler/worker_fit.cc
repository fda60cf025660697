// What fits on a worker during one pass (see worker_fit.h).
#include "coordinator/scheduler/worker_fit.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/format_bytes.h"

namespace trainctl::scheduler::internal {
namespace {

// CPUs in thousandths (see Resources in scheduler.h): a request rounds up,
// an allocatable down, so that sums are exact. Bounded far below overflow.
constexpr double kMaxMilli = 1e15;

// How many ranks of `r` fit in `slots` slots and the given CPUs and memory
// (-1: no bound) of `w`, whatever the job's per-host shape.
long long Room(const Request& r, const WorkerState& w, long long slots, long long cpu,
               long long mem) {
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

long long Fit(const Request& r, const WorkerState& w, long long slots, long long cpu,
              long long mem) {
  return Clamp(r, Room(r, w, slots, cpu, mem));
}

// n x per, saturated far below overflow (a request may be any finite size).
long long SaturatedTimes(long long n, long long per) {
  constexpr long long kHuge = 1LL << 62;
  if (per != 0 && n > kHuge / per) return kHuge;
  return n * per;
}

// InvalidArgument naming `field` unless `value` is finite and >= 0.
absl::Status NonNegative(const std::string& where, const char* field, double value) {
  if (std::isfinite(value) && value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(where, field, ": must be finite and >= 0, got ", value));
}

}  // namespace

std::string Count(int n, const char* singular, const char* plural) {
  return absl::StrCat(n, " ", n == 1 ? singular : plural);
}

long long MilliUp(double cpus) {
  return static_cast<long long>(std::ceil(std::min(cpus * 1000, kMaxMilli) - 1e-6));
}
long long MilliDown(double cpus) {
  return static_cast<long long>(std::floor(std::min(cpus * 1000, kMaxMilli) + 1e-6));
}

// "1.5", "4": thousandths of a CPU as a person writes CPUs.
std::string CpuText(long long milli) { return absl::StrCat(static_cast<double>(milli) / 1000); }

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
             w.cpu_left < 0 ? -1 : w.cpu_left + w.cpu_held,
             w.mem_left < 0 ? -1 : w.mem_left + w.mem_held);
}

// Ranks of `r` that `w` could hold with nothing running on it.
long long IdleFit(const Request& r, const WorkerState& w) {
  return Fit(r, w, w.in->total_slots, w.cpu_cap, w.mem_cap);
}

// Takes `n` placed ranks' worth of `r`'s resources out of what is left on
// `w` (the caller checked they fit).
void TakeResources(const Request& r, WorkerState& w, long long n) {
  if (!r.limited) return;
  if (w.cpu_left >= 0) w.cpu_left = std::max<long long>(0, w.cpu_left - SaturatedTimes(n, r.cpu));
  if (w.mem_left >= 0) w.mem_left = std::max<long long>(0, w.mem_left - SaturatedTimes(n, r.mem));
}

// For a reservation of `n` ranks of `r` on `w`: holds up to n ranks' worth
// of each resource, as much as is left, each on its own (not whole ranks:
// CPUs that free up in pieces smaller than a rank must still accumulate for
// the head, or a stream of small jobs could take every piece).
void HoldResources(const Request& r, WorkerState& w, long long n) {
  if (!r.limited) return;
  if (w.cpu_left >= 0) {
    const long long h = std::min(w.cpu_left, SaturatedTimes(n, r.cpu));
    w.cpu_left -= h;
    w.cpu_held += h;
  }
  if (w.mem_left >= 0) {
    const long long h = std::min(w.mem_left, SaturatedTimes(n, r.mem));
    w.mem_left -= h;
    w.mem_held += h;
  }
}

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

std::vector<std::pair<double, long long>> BusyBounds(const WorkerSlots& w) {
  std::vector<std::pair<double, long long>> listed;
  for (const WorkerSlots::Busy& b : w.busy) {
    if (b.slots > 0) listed.push_back({b.within_s, b.slots});
  }
  // Longest first, up to the busy slots: an over-long list is read as late
  // as it can be, never too early.
  std::sort(listed.begin(), listed.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  long long left =
      std::max<long long>(0, w.total_slots - static_cast<long long>(w.free_slots.size()));
  std::vector<std::pair<double, long long>> out;
  for (const auto& [within, slots] : listed) {
    if (left == 0) break;
    const long long n = std::min(left, slots);
    out.push_back({within, n});
    left -= n;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

void AddBusy(WorkerState& w, long long n, double bound_s) {
  if (n <= 0) return;
  const double within = bound_s > 0 ? bound_s : std::numeric_limits<double>::infinity();
  w.busy.insert(std::upper_bound(w.busy.begin(), w.busy.end(), std::make_pair(within, n),
                                 [](const auto& a, const auto& b) { return a.first < b.first; }),
                {within, n});
}

double FreedWithin(const WorkerState& w, long long need) {
  if (need <= 0) return 0;
  for (const auto& [within, slots] : w.busy) {
    need -= slots;
    if (need <= 0) return within;
  }
  return std::numeric_limits<double>::infinity();
}

absl::Status ValidateInput(absl::Span<const PendingJob> jobs,
                           absl::Span<const WorkerSlots> workers) {
  absl::flat_hash_set<std::string> job_ids;
  for (const PendingJob& job : jobs) {
    if (job.job_id.empty()) return absl::InvalidArgumentError("job_id: empty");
    if (!job_ids.insert(job.job_id).second) {
      return absl::InvalidArgumentError(absl::StrCat("job_id: duplicate \"", job.job_id, "\""));
    }
    const std::string where = absl::StrCat("job \"", job.job_id, "\": ");
    if (absl::Status s = NonNegative(where, "cpus", job.cpus); !s.ok()) return s;
    if (absl::Status s = NonNegative(where, "memory_bytes", static_cast<double>(job.memory_bytes));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = NonNegative(where, "runtime_bound_s", job.runtime_bound_s); !s.ok())
      return s;
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
          std::pair<const char*, double>{"allocatable_memory",
                                         static_cast<double>(worker.allocatable_memory)},
          std::pair<const char*, double>{"reserved_cpus", worker.reserved_cpus},
          std::pair<const char*, double>{"reserved_memory",
                                         static_cast<double>(worker.reserved_memory)}}) {
      if (absl::Status s = NonNegative(where, field, value); !s.ok()) return s;
    }
    for (const WorkerSlots::Busy& b : worker.busy) {
      if (b.slots < 0 || std::isnan(b.within_s) || b.within_s < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "busy: slots must be >= 0 and within_s >= 0, got ", b.slots,
                         " slots within ", b.within_s, " s"));
      }
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

// "0 of 4 free on 2 workers": all of the kind's workers, busy ones too
// (counting only those with a free slot said "0 free across 0 workers").
// With resources: "room for 1 rank on 2 workers (3 of 8 slots, 2 of 16
// cpus, 10 GiB of 32 GiB memory free)", over the workers that enforce
// limits and know their allocatable.
std::string FreeText(const std::vector<WorkerState>& states, const KindPool& pool,
                     long long free_ranks, const Request& req) {
  const std::string workers = Count(static_cast<int>(pool.workers.size()), "worker", "workers");
  if (req.per_node > 0) {
    // Whole hosts: how many could take per_node now, and the raw slots.
    long long slots = 0;
    int hosts = 0;
    for (int w : pool.workers) {
      const WorkerState& s = states[w];
      slots += static_cast<long long>(s.available.size() + s.reserved.size());
      hosts += UsableIgnoringReservations(req, s) > 0;
    }
    return absl::StrCat(slots, " of ", pool.capacity, " slots free on ", workers, ", ", hosts,
                        " of them with room for ",
                        Count(static_cast<int>(req.per_node), "rank", "ranks"));
  }
  if (!req.limited) {
    return absl::StrCat(free_ranks, " of ", pool.capacity, " free on ", workers);
  }
  long long slots = 0, cpu_free = 0, cpu_cap = 0, mem_free = 0, mem_cap = 0;
  for (int w : pool.workers) {
    const WorkerState& s = states[w];
    slots += static_cast<long long>(s.available.size() + s.reserved.size());
    if (!s.in->enforces_limits) continue;
    if (s.cpu_cap >= 0) cpu_free += s.cpu_left + s.cpu_held, cpu_cap += s.cpu_cap;
    if (s.mem_cap >= 0) mem_free += s.mem_left + s.mem_held, mem_cap += s.mem_cap;
  }
  std::string text = absl::StrCat("room for ", Count(static_cast<int>(free_ranks), "rank", "ranks"),
                                  " on ", workers, " (", slots, " of ", pool.capacity, " slots");
  if (req.cpu > 0 && cpu_cap > 0)
    absl::StrAppend(&text, ", ", CpuText(cpu_free), " of ", CpuText(cpu_cap), " cpus");
  if (req.mem > 0 && mem_cap > 0) {
    absl::StrAppend(&text, ", ", FormatBytes(mem_free), " of ", FormatBytes(mem_cap), " memory");
  }
  return absl::StrCat(text, " free)");
}

// For a job with resources, after the slot checks: true (with `pending`
// kExceedsCapacity naming what is short) when the kind's workers, idle,
// could not hold its least size.
bool ResourcesNeverFit(const std::vector<WorkerState>& states, const PendingJob& job,
                       const std::string& need, const Request& req, const KindPool& pool,
                       PendingJobStatus& pending) {
  const char* kind_name = SlotKindName(pending.kind);
  long long capacity = 0;
  int enforcing = 0;
  // The largest known allocatable among the enforcing workers; -1 when one
  // of them does not know it (then that resource never rules a worker out).
  long long max_cpu = 0, max_mem = 0;
  std::vector<std::string> holds;
  for (int w : pool.workers) {
    const WorkerState& s = states[w];
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
    pending.message = absl::StrCat("needs ", CpuText(req.cpu), " cpus per rank; the largest ",
                                   kind_name, " worker that enforces limits has ", CpuText(max_cpu),
                                   " allocatable; it cannot fit until a larger worker joins");
  } else if (req.mem > 0 && max_mem >= 0 && max_mem < req.mem) {
    pending.message =
        absl::StrCat("needs ", FormatBytes(req.mem), " memory per rank; the largest ", kind_name,
                     " worker that enforces limits has ", FormatBytes(max_mem),
                     " allocatable; it cannot fit until a larger worker joins");
  } else {
    pending.message =
        absl::StrCat("needs ", need, " ", kind_name, " slots of ", PerRankText(req), "; idle, the ",
                     Count(enforcing, "worker", "workers"), " that enforce limits would hold ",
                     capacity, " such ranks (", holds.empty() ? "none" : absl::StrJoin(holds, ", "),
                     "); it cannot fit until workers join");
  }
  return true;
}

}  // namespace trainctl::scheduler::internal
