// What fits on a worker during one scheduling pass (internal to
// scheduler.cc): a job's per-rank request, each schedulable worker's state
// (slots available and reserved, CPUs and memory left and held), the
// arithmetic of how many ranks fit, the choice of workers for a job, and
// the check of the pass's input.
#pragma once

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "coordinator/scheduler/scheduler.h"

namespace trainctl::scheduler::internal {

// "1 worker", "3 workers".
std::string Count(int n, const char* singular, const char* plural);

// CPUs in thousandths (see Resources in scheduler.h): a request rounds up,
// an allocatable down, so that sums are exact. Bounded far below overflow.
long long MilliUp(double cpus);
long long MilliDown(double cpus);
// "1.5", "4": thousandths of a CPU as a person writes CPUs.
std::string CpuText(long long milli);

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

Request RequestOf(const PendingJob& job);

// "4 cpus and 8 GiB memory per rank".
std::string PerRankText(const Request& r);

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
  // Busy slots by how long they can still be held (seconds, ascending;
  // infinite: no bound), this pass's placements included; at most the
  // worker's busy slots (see WorkerSlots::busy).
  std::vector<std::pair<double, long long>> busy;
};

// The worker's busy bounds from its input (see WorkerSlots::busy).
std::vector<std::pair<double, long long>> BusyBounds(const WorkerSlots& w);
// Records `n` slots placed on `w` this pass, held at most `bound_s`
// (0: no bound).
void AddBusy(WorkerState& w, long long n, double bound_s);
// How long until `need` more slots of `w` will have freed: the bound that
// makes them up, busy slots by bound, shortest first; 0 when need <= 0;
// infinite when the bounds listed do not make it up.
double FreedWithin(const WorkerState& w, long long need);

// Ranks of `r` that `w` can take now, outside every reservation (for a job
// with a per-host shape: exactly per_node or none).
long long Usable(const Request& r, const WorkerState& w);
// The same before the per-host clamp: how much room `w` has now (to pick
// the tightest hosts for a job with nodes).
long long RoomNow(const Request& r, const WorkerState& w);
// Usable if no reservation held anything on `w`.
long long UsableIgnoringReservations(const Request& r, const WorkerState& w);
// Ranks of `r` that `w` could hold with nothing running on it.
long long IdleFit(const Request& r, const WorkerState& w);

// Takes `n` placed ranks' worth of `r`'s resources out of what is left on
// `w` (the caller checked they fit).
void TakeResources(const Request& r, WorkerState& w, long long n);
// For a reservation of `n` ranks of `r` on `w`: holds up to n ranks' worth
// of each resource, as much as is left, each on its own (not whole ranks:
// CPUs that free up in pieces smaller than a rank must still accumulate for
// the head, or a stream of small jobs could take every piece).
void HoldResources(const Request& r, WorkerState& w, long long n);

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
  // When the head's reservation will hold its whole share at the latest
  // (see Backfill by runtime); infinite when it cannot be dated.
  double shadow_s = std::numeric_limits<double>::infinity();
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
std::vector<Share> ChooseWorkers(const std::vector<long long>& counts, long long need);

// For a job with nodes: the `nodes` candidates whose room (`room`, in
// worker-id order) holds `per_node`, the tightest first (ties by worker
// id), each taking per_node, in worker-id order. Empty when fewer qualify.
std::vector<Share> ChooseNodes(const std::vector<long long>& room, int nodes, long long per_node);

// "0 of 4 free on 2 workers": all of the kind's workers, busy ones too.
// With resources: "room for 1 rank on 2 workers (3 of 8 slots, 2 of 16
// cpus, 10 GiB of 32 GiB memory free)", over the workers that enforce
// limits and know their allocatable. `free_ranks`: ranks of `req` the pool
// could take now, reserved ones included. `states`: the pass's workers.
std::string FreeText(const std::vector<WorkerState>& states, const KindPool& pool,
                     long long free_ranks, const Request& req);

// For a job with resources, after the slot checks: true (with `pending`
// kExceedsCapacity naming what is short) when the kind's workers, idle,
// could not hold its least size (`need`: that size as text).
bool ResourcesNeverFit(const std::vector<WorkerState>& states, const PendingJob& job,
                       const std::string& need, const Request& req, const KindPool& pool,
                       PendingJobStatus& pending);

// The pass's input checked: job and worker ids present and unique,
// resources finite and >= 0, free slots within total_slots and unique.
// INVALID_ARGUMENT naming the job or worker and the field.
absl::Status ValidateInput(absl::Span<const PendingJob> jobs,
                           absl::Span<const WorkerSlots> workers);

}  // namespace trainctl::scheduler::internal
