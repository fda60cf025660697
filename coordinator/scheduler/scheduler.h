// Gang scheduler: decides which pending jobs start now and on which slots.
//
// A pure function of (pending jobs, workers' free slots[, queues with their
// quotas and running jobs]) -> (placements, jobs left pending with a reason,
// running jobs to preempt). No I/O, no clock, no protos: the job manager maps
// its stored state onto these structs, calls Schedule() once per scheduling
// pass (on submit, on slots freed, on a worker joining or leaving), writes the
// resulting attempts, and only then tells the workers. Without queues (the
// default) every job is in one implicit queue with no quota, and the result is
// exactly what it was before queues existed.
//
// Threading: stateless; safe to call from any thread.
//
// Policy, in the order it applies:
//
//  * Order. Jobs are considered by priority (higher first), then submit
//    sequence (lower first: FIFO), then job id (a tiebreak so the result never
//    depends on input order); with queues, this is the order within a queue
//    (see Fair share for the order across queues). Workers are sorted by id
//    internally.
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
//  * Backfill by runtime (EASY backfilling with runtime estimates). When
//    the head's reservation can be dated, a later job that ends in time may
//    use it. The head's shadow time: per target worker, the time by which
//    enough of its busy slots will have freed (those that can be held the
//    shortest first; WorkerSlots::busy, with this pass's placements there)
//    to make up its share, and the latest over its targets; infinite when
//    a needed slot has no bound (a busy slot not listed has none). A later
//    job of the kind whose runtime_bound_s is > 0 and at most the shadow
//    time may then start on the reserved slots as well as the available
//    ones (available first): it ends before the head could have started,
//    so it does not delay the head, and the starvation argument stands
//    (the coordinator stops a job at its bound: scheduling.max_runtime_s,
//    then the grace). Its Placement names the head (backfilled_before).
//    Only jobs and heads without resources or nodes backfill this way (the
//    reservation is then in whole slots); while a job of the kind preempts
//    (kPreempting) none does. Without bounds nothing changes: a job
//    without one, or with a longer one, waits as above, and its message
//    says the bound that would let it start now.
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
//  * Resources. A job may ask for CPUs and memory per rank (job.yaml
//    `resources`; PendingJob::cpus, ::memory_bytes; 0 = none) and for a
//    pids limit (other_limits: not counted, as workers report no pids
//    allocatable). A worker then holds k of its ranks only if it has k
//    available slots AND k x cpus and k x memory fit in what is left of its
//    allocatable after what its
//    running ranks reserve (WorkerSlots::reserved_*) and what this pass has
//    placed or reserved there: everywhere above, a worker's "available
//    slots" for such a job read min(available slots, floor(cpus left / cpus),
//    floor(memory left / memory)), and its "total slots" (capacity, the
//    reservation's targets) the same with the worker idle. A job with
//    resources never goes to a worker that does not enforce limits (a hard
//    filter, unlike Avoidance: the worker would fail its launch). A worker
//    whose allocatable CPUs (memory) is 0 reported it as unknown (a daemon
//    that could not read its affinity or MemTotal): that resource does not
//    bound it, as before resources were counted; it must still enforce
//    limits, so each rank stays within its own cgroup. Why not refuse it:
//    it can run the job, and refusing would strand jobs on a cluster of such
//    workers with no way for the user to fix it. CPUs are counted in
//    thousandths (a request rounded up, an allocatable rounded down), so
//    sums are exact. A job without resources reserves nothing and is placed
//    by slots alone: when no pending job has resources the result is exactly
//    what it was before resources were counted, whatever the workers report.
//    Never fits, with resources: a job whose least size exceeds the sum over
//    its kind's schedulable workers of the ranks each could hold idle is
//    kExceedsCapacity, and the message names what is short ("needs 8 cpus
//    per rank; the largest cpu worker that enforces limits has 4
//    allocatable"; "... no schedulable cpu worker enforces resource
//    limits"). The head's reservation holds on
//    each target, besides up to its share of available slots, up to its
//    share's CPUs and memory of what is left there, each resource on its
//    own (not in whole ranks: CPUs that free up in pieces smaller than one
//    rank's must still accumulate for the head, else a stream of small jobs
//    could take every piece). Later jobs never take what it holds, so what
//    it holds of each resource only grows as running ranks end, and the
//    starvation argument above carries over resource by resource.
//    Preemption counts victims' slots, not their CPUs or memory (a victim
//    without resources frees no memory): a job with resources may wait
//    after its victims stopped until running ranks free its CPUs or memory.
//
//  * Nodes. A job with nodes = N > 0 (scheduling.nodes, torchrun's
//    --nnodes) runs on exactly N workers with M = world_size / N ranks on
//    each, whatever the packing rule would prefer: torchrun's
//    GROUP_WORLD_SIZE = N and LOCAL_WORLD_SIZE = M hold, as a script
//    written for torchrun assumes. Everywhere above, a worker's available
//    (and total) slots for such a job read M when it has at least M (with
//    resources: room for M ranks) and 0 otherwise, so the gang, the
//    reservation, the messages and the never-fits check count whole
//    hosts. Placement takes the N workers with the fewest available slots
//    that hold M (ties by worker id), nodes in worker-id order: the same
//    best fit as packing, leaving larger blocks intact. The head's
//    reservation targets the first N workers by id whose total slots hold
//    M (a function of total slots only, so the starvation argument holds:
//    each target keeps up to M slots until it has M). Never fits: fewer
//    than N schedulable workers of its kind with total_slots >= M is
//    kExceedsCapacity, saying so. Preemption counts victims' slots, not
//    where they are: a nodes job may wait after its victims stopped until
//    N workers each have M free (as a job with resources may, above).
//
//  * Flavors (Kueue's ResourceFlavors, Slurm's GRES types). A GPU worker
//    may have a flavor (WorkerSlots::gpu_flavor: the model all its GPUs
//    share) and a job may ask for one (PendingJob::gpu_flavor). Such a job
//    is a GPU job (kAuto included; kCpu leaves it kInvalidJob) whose pool
//    is the GPU workers of its flavor: everywhere above (packing, the gang,
//    the reservation and its head, backfill, the messages, never fits) "the
//    kind's workers" read "the flavor's workers", so its ranks land only
//    there. A flavor no schedulable worker has is kNoWorkerOfKind, its
//    message naming the flavor and the flavors there are. Each flavor has
//    its own head, as each kind has; a flavor's pool shares its workers'
//    slots with the GPU pool, so a slot held for one head is taken by no
//    other job. The starvation argument holds within each pool; a GPU job
//    without a flavor may wait for slots a flavored head holds (and the
//    reverse) until that head is placed. Preemption: victims (and stopping
//    jobs) free slots for a flavored job only when they run on its flavor
//    (RunningJob::gpu_flavor); those are picked first, others only while
//    the quota still lacks; one job per kind preempts per pass, whatever
//    its flavor. Quotas count a flavor's slots as the kind's. A job
//    without a flavor, and a cluster without flavors, are placed exactly
//    as before.
//
//  * Flavor quotas (Kueue's quotas per ResourceFlavor;
//    QueueSpec::nominal_gpu_flavors, borrowing_limit_gpu_flavors,
//    lending_limit_gpu_flavors). Each flavor F some queue has a nominal
//    for is one more quota dimension, counted in GPU slots of F, to which
//    every rule of Queues below applies as to a slot kind (nominal, group
//    sums, borrowing in the second round, lending and borrowing limits,
//    kExceedsQueueLimit past what the cohort could ever lend, elastic
//    headroom, preemption to reclaim): a queue without a nominal for F is
//    unlimited in F and outside its cohort's sums for F. A queue's used
//    of F is the slots of its running jobs on F (RunningJob::gpu_flavor)
//    plus this pass's placements on F's workers, of any job of the queue.
//    Only a job asking for F uses the dimension (its per-rank demand has
//    one slot of F besides its GPU slot): a GPU job asking for no flavor
//    is counted on the flavors its ranks land on, never held back by them
//    (so a queue's used of F may pass what F's quota admits, and borrow
//    F, through such jobs; they are F borrowers for preemption too). A
//    job asking for F that would exceed its queue's nominal F only by its
//    queue's own jobs, or that finds F lent out, preempts as any job does:
//    a candidate frees F's quota only when it runs on F, and its slots
//    serve the job only then (see Flavors). No flavor quota: as before.
//
//  * Determinism. The same set of jobs and workers gives the same result
//    whatever the order of either input (and of each worker's free slots);
//    with queues, whatever the order of the queues and running jobs too.
//
// Queues (only when QueueInput::queues is non-empty; the rules below are
// inert for the implicit queue):
//
//  * Membership. A job belongs to the queue it names ("" = "default"); a job
//    naming a queue that is not defined stays pending as kUnknownQueue (and
//    is reported after every other job). With no queues defined, every job
//    (and every running job) is in one implicit queue "default" with no quota,
//    no size limit and no cohort, whatever it names: the same result as one
//    explicit unlimited "default" queue.
//
//  * Quota. Per queue and slot kind K a nominal quota: the slots of kind K its
//    jobs may use, or -1 for unlimited. `used` of a queue and kind is the
//    slots of its running jobs (stopping ones too, until they are gone from
//    `running`) plus what this pass has placed. A queue's "group" is its
//    cohort (every queue naming that cohort) or, without a cohort, the queue
//    alone. For K, the group's nominal and used are the sums over its queues
//    whose nominal for K is finite. A job's size here is its least size (an
//    elastic job's min_world_size, else world_size). For a job of size s in
//    queue Q with a finite nominal for K:
//      - s > the group's nominal (Q's nominal plus all its cohort could ever
//        lend): kExceedsQueueLimit, skipped, reserves nothing (checked after
//        kNoWorkerOfKind and kExceedsCapacity);
//      - used_Q + s <= nominal_Q ("within nominal") and group used + s <=
//        group nominal: admitted;
//      - within nominal but group used + s > group nominal (other queues
//        borrowed Q's idle quota): it may preempt (below), else kQuotaExceeded;
//      - used_Q + s > nominal_Q ("borrowing") and group used + s <= group
//        nominal: admitted, borrowing the cohort's idle quota, but only after
//        every job that does not borrow (the second round, below);
//      - otherwise kQuotaExceeded.
//    The cohort's lendable quota is thus the group's nominal minus the
//    group's used: other queues' idle quota less what is already borrowed
//    from it. (Summing only the other queues' idle quota, max(0, nominal -
//    used) each, would lend the same idle slot to two borrowers.) Invariant:
//    a pass never places a job that makes a group's used exceed the group's
//    nominal; a queue without cohort never exceeds its own nominal. A queue
//    with an unlimited nominal for K is never limited for K, lends nothing and
//    borrows nothing: it is outside its cohort's sums for K. A job blocked by
//    quota holds no reservation and blocks nobody, not even later jobs of its
//    own queue (best effort FIFO, as Kueue's BestEffortFIFO).
//
//  * Borrowing and lending limits (Kueue's borrowingLimit, lendingLimit).
//    Per queue Q and kind K with a finite nominal N, a lending limit L
//    (unset: N; above N: N) splits N into a guaranteed part G = N - L,
//    which Q never lends, and L, which Q adds to its group's nominal. Q's
//    used counts in the group's used only beyond G: max(0, used_Q - G). So
//    "group nominal" and "group used" above are these sums (without lending
//    limits, G = 0 and they are as stated), a job of Q fits the group when
//    the group's used grows by at most what the group has idle (a job that
//    stays within G always fits, whatever the others do), the group's
//    nominal plus G_Q is the largest job Q can ever run (kExceedsQueueLimit
//    beyond it), and the quota headroom adds Q's unused G. A borrowing limit
//    B caps Q's used at N + B: a job taking Q past it is kQuotaExceeded
//    even when the cohort has idle quota, the largest job Q can ever run is
//    at most N + B, and elastic headroom stops there. Preemption: a victim
//    frees group used only as far as its queue's used exceeds that queue's
//    G.
//
//  * Resource quotas (Kueue's per-resource quotas). A queue may also have a
//    nominal quota, borrowing and lending limit in CPUs and in memory: two
//    more dimensions, counted as Resources counts them (a job holds its
//    least size x its per-rank cpus and memory, CPUs in thousandths, a
//    nominal rounded down), whatever its slot kind. Every rule above applies to each dimension on
//    its own, with a job's size in that dimension for s; a job is admitted only when every
//    dimension it uses (> 0) admits it: within nominal when all are, it
//    borrows (second round) when any borrows and none needs reclaiming, and
//    one that would borrow in one dimension while its cohort lent out
//    another is kQuotaExceeded (preemption never makes a job borrow). Its
//    elastic headroom is the least over the dimensions. Preemption: the
//    conditions hold in every finite dimension the job uses; candidates are
//    running jobs (any kind) that use one of them, of Q at a lower
//    priority, or of a cohort peer borrowing in such a dimension at the
//    time of the pick; only victims of kind K count as available slots.
//    Fair share stays in slots.
//
//  * Job size limits. A job whose least size exceeds its queue's
//    max_job_size (0 = none) stays pending as kExceedsQueueLimit (checked
//    before the workers: it never fits this queue however the cluster grows).
//    The checks that skip a job apply in this order: kInvalidJob,
//    kUnknownQueue, max_job_size, kNoWorkerOfKind, kExceedsCapacity (slots, nodes,
//    then resources), the group's nominal (the last two kExceedsQueueLimit).
//    Elastic jobs start with min(world_size, available slots, max_job_size,
//    quota headroom) ranks when that is at least min_world_size; the
//    headroom is the group's nominal minus its used, and in the first round
//    also no more than the queue's own nominal minus its used (an elastic job
//    grows into borrowed quota only in the second round).
//
//  * Fair share. Queues take turns by weighted dominant share: share_Q =
//    max over kinds K of (usage_Q,K + slots of K placed for Q in this pass)
//    / entitlement_Q,K / weight_Q, where usage is the caller's decayed past
//    use and the entitlement is nominal_Q,K when finite (a kind with nominal
//    0 is skipped: the queue only borrows it), else the capacity of K (total
//    slots of K's schedulable workers; skipped when 0). So a queue without
//    quota competes by usage / weight against the whole cluster, and two
//    such queues get idle capacity in proportion to their weights (Kueue's
//    fair-sharing weights; Slurm's fair-share tree, first level). The next
//    job considered is the next one of the queue with the lowest share; ties
//    by fewer slots used (running plus placed in this pass), then queue
//    name: with usage decaying continuously an exact tie is rare, and the
//    queue that wins one is behind at the next, so no queue wins ties
//    systematically. A placement raises its queue's share, so one pass
//    interleaves queues. Within a queue, the second level of the tree: the
//    next job is the head (by priority, FIFO, id) of one of the queue's
//    owners (PendingJob::owner): the highest priority head, ties by the
//    owner's share (the same formula with the owner's usage and weight and
//    the cluster's capacity per kind), then FIFO, id. With one owner (or no
//    owner usage) this is the order above. The pass runs twice over
//    this merge: the first round considers every job except those that would
//    borrow, which are set aside; the second round considers those, again by
//    share. Why: quota a queue is guaranteed must not wait behind another
//    queue borrowing it (else a victim preempted for a job could take its
//    slots back at once, in every pass). The reservation rule above applies
//    across all queues and both rounds: the first job of a kind, in
//    consideration order, admitted by quota but blocked for slots is the head
//    (or the preempting job, below). As shares change between passes, so can
//    the head: with queues, the guarantee against starvation is a queue's
//    nominal quota, made good by preemption. "Scheduling order" in the
//    result is consideration order: first round, second round, then unknown
//    queues.
//
//  * Preemption (reclaiming quota). A job J of size s (its least size) and
//    kind K in queue Q with a finite nominal for K, that cannot start for
//    lack of available slots of K (free, not placed and not reserved in this
//    pass), because its cohort lent Q's quota out, or because Q's own running
//    jobs fill Q's nominal (kOverQuota: then only Q's jobs of a lower
//    priority than J's can make room), may pick running jobs to preempt. Candidates are the running
//    jobs of kind K not stopping that are either (a) of another queue P of Q's cohort with a finite
//    nominal for K that is borrowing at the time of the pick: used_P (as
//    above, this pass's placements included) - slots of P's stopping jobs -
//    slots already picked from P > nominal_P; or (b) of Q itself with a
//    priority strictly lower than J's. They are
//    taken in the order: lowest priority, then youngest (highest start_seq),
//    then fewest slots, then job id; each eligible one is picked until both
//      available slots of K + slots of stopping jobs of K + picked >= s,
//      group used - group stopping - picked + s <= group nominal, and
//      used_Q - Q's stopping - picked from Q + s <= nominal_Q (so
//      preemption never makes J borrow).
//    If stopping jobs alone satisfy both, none is picked (J waits for them);
//    if the candidates cannot, none is picked (never preempt uselessly) and J
//    is handled as any blocked job (kInsufficientFreeSlots or
//    kQuotaExceeded). Otherwise J stays pending as kPreempting (message names
//    the victims or the stopping jobs it waits for) and holds a reservation
//    like the head's (it becomes the head when its kind has none), so later
//    jobs do not take the slots it is about to get. Only the first such job
//    per kind in a pass preempts or waits this way (later ones are handled as
//    any blocked job): a pass never frees the same slots for two jobs, and
//    the caller sees victims for one job per kind at a time. Stopping jobs are never picked again;
//    they count as used for admission until the caller drops them from `running`. A queue with an
//    unlimited nominal for K never preempts for K, so without queues nothing is ever preempted.
//    Preempting is the caller's job (ask the victims to checkpoint and stop, then mark them
//    stopping); a later pass places J once their slots are free.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "coordinator/scheduler/scheduler_types.h"

namespace trainctl::scheduler {

// Places what can start now. Returns InvalidArgument for malformed input: a
// duplicate or empty job id or worker id, a negative or duplicate free slot
// index, more free slots than total_slots, a negative total_slots, a
// negative or non-finite cpus or memory (job, allocatable, reserved). Each input
// job ends in exactly one of placements or pending.
absl::StatusOr<ScheduleResult> Schedule(absl::Span<const PendingJob> jobs,
                                        absl::Span<const WorkerSlots> workers);

// The same with queues, quotas and running jobs (see the Queues policy
// above). Also InvalidArgument, naming the field, for a queue with an empty or
// duplicate name, a nominal or limit below -1 (CPU / memory: not -1 or
// finite >= 0), a negative max_job_size, a negative or non-finite usage; a
// running job with an empty or duplicate id, an id of a pending job, negative
// slots, cpus or memory, or (queues defined) a queue not defined; a weight
// that is not finite and > 0; a duplicate owner.
// Schedule(jobs, workers) == Schedule(jobs, workers, QueueInput{}).
absl::StatusOr<ScheduleResult> Schedule(absl::Span<const PendingJob> jobs,
                                        absl::Span<const WorkerSlots> workers,
                                        const QueueInput& queues);

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
