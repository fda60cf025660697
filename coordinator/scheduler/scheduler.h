// Gang scheduler: decides which pending jobs start now and on which slots.
//
// A pure function of (pending jobs, workers' free slots) -> (placements, jobs
// left pending with a reason). No I/O, no clock, no protos: the job manager
// maps its stored state onto these structs, calls Schedule() once per
// scheduling pass (on submit, on slots freed, on a worker joining or leaving),
// writes the resulting attempts, and only then tells the workers.
//
// Threading: stateless; safe to call from any thread.
//
// Policy, in the order it applies:
//
//  * Order. Jobs are considered by priority (higher first), then submit
//    sequence (lower first: FIFO), then job id (a tiebreak so the result never
//    depends on input order). Workers are sorted by id internally.
//
//  * Device. A `kCuda` job uses GPU slots only, a `kCpu` job CPU slots only.
//    A `kAuto` job resolves to GPU when any schedulable worker with at least
//    one GPU slot (free or busy) is in the input, else to CPU; the resolution
//    does not depend on how many GPU slots are free right now, so an auto job
//    waits for GPUs rather than silently falling back to CPU on a busy GPU
//    cluster. All ranks of one job use one kind.
//
//  * Gang. A job gets all world_size slots in this pass or none. An elastic
//    job (1 <= min_world_size < world_size) gets world_size slots when they
//    are available, else as many as are available when that is at least
//    min_world_size, else none; blocked, it reserves and is counted as a job
//    of min_world_size.
//
//  * Packing. Ranks go on as few workers as possible:
//      - if one worker can hold every rank, the tightest such worker (fewest
//        available slots that suffice; ties by worker id);
//      - otherwise the workers with the most available slots first (ties by
//        worker id) until the remainder fits on one more worker, and that last
//        one is again the tightest that holds the remainder. This uses the
//        minimum number of workers and leaves the larger blocks intact.
//    On a worker a job takes the lowest free slot indices. Ranks are
//    contiguous per worker: node 0 is the first chosen worker and holds ranks
//    0..k0-1, node 1 the next k1 ranks, and so on; local_rank is the position
//    on the worker. Enough available slots of the right kind always suffice
//    (splitting is always allowed), so fragmentation never blocks a job by
//    itself.
//
//  * No starvation: one reservation per device kind (EASY backfilling without
//    runtime estimates). The first job of a kind, in order, that cannot be
//    placed (the "head") reserves slots for itself; jobs after it of the same
//    kind may still start, but only on slots outside the reservation. The
//    reservation targets the workers the head will most likely land on:
//      - if one worker can hold the whole job (total slots >= world_size): the
//        worker with the most available slots, counted up to world_size (ties:
//        fewer total slots, then worker id); it reserves up to world_size of
//        that worker's available slots;
//      - otherwise the workers chosen by the packing rule above applied to
//        total slots (not free ones), each reserving up to its share.
//    Why this and not strict order per kind: strict order idles every free
//    slot of a kind while a large job waits, even slots on workers the large
//    job would never use; the reservation keeps those busy. Why it cannot
//    starve the head: the reserved slots never go to a later job, so what the
//    head holds on its targets only grows as running jobs end (with one worker
//    the target only changes to a worker holding strictly more, bounded by
//    world_size; with several the targets depend only on total slots). Once
//    the targets hold world_size slots the head is placed. A job ahead of the
//    head is placed or skipped, so every job becomes the head in turn.
//    Only the head reserves: jobs behind a blocked head wait their turn
//    (jobs that fit outside the reservation start at once).
//
//  * Avoidance. A job that names workers to avoid (its stragglers) is packed
//    as above on the other workers when their available slots suffice, else
//    as if it named none: a preference, never a reason to wait.
//
//  * Never fits. A job whose world_size exceeds the total slots of its kind on
//    schedulable workers is left pending as kExceedsCapacity and skipped: it
//    reserves nothing and blocks nobody. It may fit later when workers join;
//    whether to fail it is the job manager's call.
//
//  * Dead or unschedulable (draining) workers are ignored entirely: their
//    slots are neither used nor counted as capacity.
//
//  * Determinism. The same set of jobs and workers gives the same result
//    whatever the order of either input (and of each worker's free slots).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace trainctl::scheduler {

// What a job asks for (mirrors trainctl.v1.Device; UNSPECIFIED maps to kAuto).
enum class DeviceRequirement {
  // GPU slots when the cluster has any GPU worker, else CPU slots.
  kAuto,
  // GPU slots only; waits for them.
  kCuda,
  // CPU slots only.
  kCpu,
};

// The kind of a worker's slots (mirrors trainctl.v1.Slot.Kind).
enum class SlotKind {
  // One CUDA device per slot.
  kGpu,
  // One CPU slot (a share of the host's cores).
  kCpu,
};

// A job waiting for its next attempt to be placed.
struct PendingJob {
  // Unique among the jobs of one call.
  std::string job_id;
  // Ranks; each takes one slot. A value < 1 leaves the job pending as
  // kInvalidJob (the job manager validates specs first; this is a backstop).
  int world_size = 1;
  DeviceRequirement device = DeviceRequirement::kAuto;
  // Higher is scheduled first.
  int priority = 0;
  // Order of submission (or of re-queueing for a restart); lower is older.
  std::uint64_t submit_seq = 0;
  // Elastic: when in [1, world_size), the job may start with fewer ranks
  // (at least this many); 0 = exactly world_size.
  int min_world_size = 0;
  // Workers to keep the job off when the others' available slots suffice
  // (stragglers.policy: avoid); otherwise they are used as any other.
  std::vector<std::string> avoid_workers;
};

// One worker's view for this pass.
struct WorkerSlots {
  // Unique among the workers of one call.
  std::string worker_id;
  SlotKind kind = SlotKind::kCpu;
  // Indices of the slots not running a rank (CUDA device index or CPU slot
  // number): each >= 0, no duplicates, at most total_slots of them.
  std::vector<int> free_slots;
  // Slots the worker has, busy or free. Capacity for the never-fits check.
  int total_slots = 0;
  // False for a lost or draining worker: it is ignored.
  bool schedulable = true;
};

// One rank of a placed job.
struct RankAssignment {
  // Global rank in [0, world_size).
  int rank = 0;
  std::string worker_id;
  // Index from the worker's free_slots.
  int slot = 0;
  // Position among the job's ranks on this worker, in [0, local_world_size).
  int local_rank = 0;
  // Ranks of this job on this worker.
  int local_world_size = 0;
  // Index of the worker within the placement; rank 0 is on node 0, and node
  // n+1 holds the ranks right after node n's.
  int node_rank = 0;
};

// A job that starts now.
struct Placement {
  std::string job_id;
  // The kind its ranks run on (an auto job's resolved kind).
  SlotKind kind = SlotKind::kCpu;
  int world_size = 0;
  // Workers it spans.
  int num_nodes = 0;
  // Exactly world_size entries, ordered by rank (ranks[i].rank == i).
  std::vector<RankAssignment> ranks;
};

// Why a job stays pending.
enum class PendingReason {
  // world_size < 1.
  kInvalidJob,
  // No schedulable worker has slots of the kind the job needs.
  kNoWorkerOfKind,
  // world_size exceeds the total slots of its kind on schedulable workers:
  // it cannot fit until workers join. Skipped; blocks nobody.
  kExceedsCapacity,
  // Fewer free slots of its kind than world_size (before any reservation).
  // The first such job of a kind holds the reservation (reserved_slots).
  kInsufficientFreeSlots,
  // Enough free slots, but some are reserved for an earlier blocked job.
  kBlockedByReservation,
};

// A slot of a worker; used to report reservations.
struct SlotRef {
  std::string worker_id;
  int slot = 0;
};

struct PendingJobStatus {
  std::string job_id;
  PendingReason reason = PendingReason::kInsufficientFreeSlots;
  // One line for a person, e.g. "needs 4 cuda slots, 2 of 8 free on 2 workers".
  std::string message;
  // The kind it waits for (auto resolved); meaningless for kInvalidJob.
  SlotKind kind = SlotKind::kCpu;
  // For the head of its kind (kInsufficientFreeSlots): the slots held for it
  // in this pass, ordered by worker id then slot. Empty otherwise.
  std::vector<SlotRef> reserved_slots;
  // For kBlockedByReservation: the job holding the reservation.
  std::string blocked_by;
};

struct ScheduleResult {
  // In scheduling order; no slot appears twice across all placements.
  std::vector<Placement> placements;
  // Every input job not placed, in scheduling order.
  std::vector<PendingJobStatus> pending;
};

// Places what can start now. Returns InvalidArgument for malformed input: a
// duplicate or empty job id or worker id, a negative or duplicate free slot
// index, more free slots than total_slots, a negative total_slots. Each input
// job ends in exactly one of placements or pending.
absl::StatusOr<ScheduleResult> Schedule(absl::Span<const PendingJob> jobs,
                                        absl::Span<const WorkerSlots> workers);

// Moves the node of `placement` whose worker `prefer` accepts (the first such
// node in node order) to node 0, keeping every node's slots and the order of
// the others, and renumbers ranks so that ranks stay contiguous per node.
// Used to put rank 0 on a host that holds the checkpoint a restart resumes
// (rank 0 reads it and broadcasts it). Returns whether such a node exists;
// the placement is unchanged when none does or node 0 already qualifies.
bool PreferNodeZero(Placement& placement, const std::function<bool(const std::string&)>& prefer);

// "cuda"/"cpu" style names for messages and tests.
const char* SlotKindName(SlotKind kind);
const char* PendingReasonName(PendingReason reason);

}  // namespace trainctl::scheduler
