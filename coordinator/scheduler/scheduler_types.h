// The values the scheduler works on (scheduler.h is the policy and the
// function): what a pending job asks for, a worker's slots, placements and
// pending reasons, queues and running jobs. Plain structs, no behaviour.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

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
  // The queue it was submitted to; "" = "default". Ignored when no queues are
  // defined.
  std::string queue;
  // Who submitted it (Job.owner): jobs of one queue share it by owner
  // (see Fair share). Any string, "" included.
  std::string owner;
  // Per rank (see Resources): CPUs (>= 0, finite) and bytes of memory
  // (>= 0); 0 = not asked for.
  double cpus = 0;
  std::int64_t memory_bytes = 0;
  // It asks for a limit the scheduler does not count (resources.pids).
  // With it, or cpus or memory_bytes > 0, the job "has resources": it runs
  // only on workers that enforce limits.
  bool other_limits = false;
  // Hosts (job.yaml scheduling.nodes, torchrun's --nnodes): > 0 = exactly
  // this many workers, world_size / nodes ranks on each (see Nodes above);
  // 0 = packed as any job. A negative value, a world_size it does not
  // divide, or an elastic job with nodes > 0 leaves the job pending as
  // kInvalidJob (the job manager validates specs first; a backstop).
  int nodes = 0;
  // The longest it can hold slots once placed, in seconds: what is left of
  // its runtime limit plus the grace it is stopped with; 0 = no limit (see
  // Backfill by runtime). Finite, >= 0.
  double runtime_bound_s = 0;
  // The GPU flavor its ranks must run on (resources.gpu_flavor; see
  // Flavors): "" = any GPU. Set, the job runs on GPU slots whatever
  // `device` says, except kCpu, which leaves it pending as kInvalidJob
  // (the job manager refuses that combination at submit; a backstop).
  std::string gpu_flavor;
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
  // A GPU worker's flavor: the one every GPU slot of it has (Slot.flavor);
  // "" when they have none or differ, and for CPU workers. See Flavors.
  std::string gpu_flavor;
  // What it can give ranks (Worker.allocatable): CPUs and bytes of memory,
  // each >= 0 with 0 = unknown (not a bound; see Resources), and whether it
  // enforces per-rank limits (false: no job with resources goes there).
  double allocatable_cpus = 0;
  std::int64_t allocatable_memory = 0;
  bool enforces_limits = false;
  // What the ranks running there now reserve (the sum of their jobs'
  // per-rank cpus and memory); >= 0. May exceed the allocatable (ranks
  // placed before it shrank): nothing more with resources fits then.
  double reserved_cpus = 0;
  std::int64_t reserved_memory = 0;
  // Its busy slots by how long they can still be held, in seconds (their
  // jobs' runtime bounds as of now; see Backfill by runtime): slots >= 0,
  // within_s >= 0 (infinite: no bound). Busy slots not listed have no
  // bound; entries beyond the busy slots (total_slots minus free) are read
  // as the longest bounds first, so an over-long list never dates a
  // reservation too early.
  struct Busy {
    int slots = 0;
    double within_s = 0;
  };
  std::vector<Busy> busy;
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
  // Set when it took slots reserved for this blocked job, which it ends
  // before (see Backfill by runtime); empty otherwise.
  std::string backfilled_before;
};

// Why a job stays pending.
enum class PendingReason {
  // world_size < 1.
  kInvalidJob,
  // No schedulable worker has slots of the kind the job needs.
  kNoWorkerOfKind,
  // world_size exceeds the total slots of its kind on schedulable workers,
  // or (a job with resources) the ranks they could hold idle: it cannot fit
  // until workers join. Skipped; blocks nobody.
  kExceedsCapacity,
  // Fewer free slots of its kind than world_size (before any reservation),
  // or for a job with resources fewer ranks' worth of free slots, CPUs and
  // memory. The first such job of a kind holds the reservation
  // (reserved_slots).
  kInsufficientFreeSlots,
  // Enough free slots, but some are reserved for an earlier blocked job.
  kBlockedByReservation,
  // Its queue is not defined (only when queues are). Skipped; blocks nobody.
  kUnknownQueue,
  // Larger than its queue's max_job_size, or than its queue's nominal quota
  // plus all its cohort could ever lend: never fits this queue. Skipped.
  kExceedsQueueLimit,
  // Its queue's quota (with what the cohort has idle to lend) does not
  // admit it now. Holds no reservation; blocks nobody.
  kQuotaExceeded,
  // Running jobs are being preempted (or are stopping) to free its slots or
  // its quota; it holds a reservation like the head's.
  kPreempting,
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
  // For the head of its kind (kInsufficientFreeSlots) or a preempting job
  // (kPreempting): the slots held for it in this pass, ordered by worker id
  // then slot. Empty otherwise.
  std::vector<SlotRef> reserved_slots;
  // For kBlockedByReservation: the job holding the reservation.
  std::string blocked_by;
};

// A running job asked to stop so that another can start.
struct Preemption {
  std::string victim_job_id;
  // The pending job (kPreempting) its slots or quota are freed for.
  std::string for_job_id;
};

struct ScheduleResult {
  // In scheduling order; no slot appears twice across all placements.
  std::vector<Placement> placements;
  // Every input job not placed, in scheduling order.
  std::vector<PendingJobStatus> pending;
  // Running jobs to preempt, grouped by the job they are for, in pick order.
  // At most one for_job_id per slot kind; empty without queues.
  std::vector<Preemption> preemptions;
};

// A queue: a share of the cluster for the jobs submitted to it.
struct QueueSpec {
  // Unique among the queues of one call; not empty.
  std::string name;
  // Nominal quota in slots per kind; -1 = unlimited, else >= 0.
  int nominal_gpu = -1;
  int nominal_cpu = -1;
  // Per kind with a finite nominal (see Borrowing and lending limits); -1 =
  // none, else >= 0. borrowing_limit: the most slots beyond the nominal the
  // queue may hold. lending_limit: the most of its nominal it lends (above
  // the nominal reads as the nominal); the rest stays reserved for it.
  int borrowing_limit_gpu = -1;
  int borrowing_limit_cpu = -1;
  int lending_limit_gpu = -1;
  int lending_limit_cpu = -1;
  // The same in CPUs and bytes of memory (see Resource quotas): -1 =
  // unlimited / none, else >= 0 (CPUs finite).
  double nominal_cpus = -1;
  std::int64_t nominal_memory_bytes = -1;
  double borrowing_limit_cpus = -1;
  std::int64_t borrowing_limit_memory_bytes = -1;
  double lending_limit_cpus = -1;
  std::int64_t lending_limit_memory_bytes = -1;
  // Nominal GPU slots per flavor (see Flavor quotas): flavor -> >= 0.
  // Flavors not listed are not limited by flavor.
  std::map<std::string, int> nominal_gpu_flavors;
  // Borrowing and lending limits per flavor, each for a flavor listed in
  // nominal_gpu_flavors (others are ignored): flavor -> >= 0; a flavor not
  // listed has no limit.
  std::map<std::string, int> borrowing_limit_gpu_flavors;
  std::map<std::string, int> lending_limit_gpu_flavors;
  // Queues naming the same cohort lend each other their idle quota; "" = none.
  std::string cohort;
  // The largest job (least size) the queue accepts; 0 = no limit, else > 0.
  int max_job_size = 0;
  // Per-owner limits (0 = none): the most running jobs and held slots one
  // owner may have in the queue. Applied by the coordinator's placer before
  // a pass (JobPlacer), not by Schedule().
  int max_running_jobs_per_owner = 0;
  int max_slots_per_owner = 0;
  // Decayed past use in slot-seconds per kind (the caller applies the
  // half-life); >= 0. Orders queues for fair share; nothing else.
  double usage_gpu = 0;
  double usage_cpu = 0;
  // Fair-share weight; finite and > 0.
  double weight = 1;
  // Per owner of the queue's jobs: weight (finite, > 0) and decayed usage as
  // above. An owner not listed weighs 1 with no usage. Names unique.
  struct Owner {
    std::string name;
    double weight = 1;
    double usage_gpu = 0;
    double usage_cpu = 0;
  };
  std::vector<Owner> owners;
};

// A job holding slots now; counts against its queue's quota and may be a
// preemption victim.
struct RunningJob {
  // Unique among the running jobs and not one of the pending jobs' ids.
  std::string job_id;
  // Must name a defined queue when queues are defined; "" = "default".
  std::string queue;
  SlotKind kind = SlotKind::kCpu;
  // Slots it holds; >= 0.
  int slots = 0;
  // The flavor of the GPU slots it holds ("" = none, or several): only
  // victims of a job's own flavor free slots for it (see Flavors).
  std::string gpu_flavor;
  // Per rank, as PendingJob's (finite, >= 0): it holds slots x each against
  // its queue's CPU and memory quotas.
  double cpus = 0;
  std::int64_t memory_bytes = 0;
  int priority = 0;
  // Order of starting; higher = started later (younger).
  std::uint64_t start_seq = 0;
  // Already being preempted or stopped: its slots count as coming free for
  // preemption, as used for admission, and it is never picked again.
  bool stopping = false;
};

struct QueueInput {
  // Empty: one implicit unlimited "default" queue (behaviour without queues).
  std::vector<QueueSpec> queues;
  std::vector<RunningJob> running;
};

}  // namespace trainctl::scheduler
