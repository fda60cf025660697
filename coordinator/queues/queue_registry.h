// The queues an admin defined (docs/queues.md): their durable records, the
// QueueSpecs the scheduler takes, and the submit-time rule that puts a job
// in a queue (ResolveQueue).
//
// Called by the QueueService handlers (create, update, delete, read), the
// JobService's SubmitJob (ResolveQueue, before the JobManager validates and
// stores the job) and whoever builds the scheduler's QueueInput (Specs()).
// Loaded from the store at start (Load). Each change persists first, then
// updates memory: a queue acknowledged is on disk.
//
// A cluster where no queue is defined behaves as before queues existed:
// Specs() is empty (the scheduler's implicit unlimited "default" queue) and
// ResolveQueue accepts any valid queue name.
//
// Not thread-safe: runs on the coordinator's EventLoop (checked in debug
// builds once bound).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/scheduler/scheduler.h"
#include "coordinator/store/state_store.h"
#include "trainctl/v1/auth.pb.h"
#include "trainctl/v1/job.pb.h"
#include "trainctl/v1/queue.pb.h"

namespace trainctl::coordinator {

// The queue a job naming none goes to when its token names none.
inline constexpr char kDefaultQueue[] = "default";
// At most this many queues on one token (CreateTokenRequest.queues).
inline constexpr int kMaxTokenQueues = 16;

// A queue (or cohort) name: [a-z0-9-], 1..63 characters, starting and
// ending with a letter or digit (as job names). InvalidArgument naming
// `field` and the reason otherwise.
absl::Status CheckQueueName(absl::string_view field, absl::string_view name);

// Every field of a queue as CreateQueue receives it; InvalidArgument naming
// the first bad field ("queue.nominal_gpu: must be -1 (unlimited) or >= 0,
// got -3"; "queue.default_resources.memory: must be 0 (no limit) or at
// least 1Mi ...", the bounds of a job's own resources).
absl::Status ValidateQueue(const v1::Queue& queue);

// Whether any of cpus, memory, pids is set (a job or queue with resources).
bool HasResources(const v1::ResourceSpec& r);

// The scheduler's view of a queue (usage fields 0; unset nominal = -1).
scheduler::QueueSpec ToQueueSpec(const v1::Queue& queue);

class QueueRegistry {
 public:
  QueueRegistry(StateStore* store, const Clock* clock) : store_(store), clock_(clock) {}

  // Every call must then come from `loop` (checked at run time, in every build).
  void BindToLoop(const EventLoop* loop) { loop_ = loop; }

  // Replaces memory with the store's queues (at start, before serving).
  absl::Status Load() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // True when no queue is defined (the cluster schedules as before queues).
  bool empty() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return queues_.empty(); }
  // The queue named `name`, or nullptr. Valid until the next change.
  const v1::Queue* Find(absl::string_view name) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Every queue, ascending by name.
  std::vector<v1::Queue> List() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The scheduler's input, ascending by name; empty when none is defined.
  std::vector<scheduler::QueueSpec> Specs() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Names, ascending, joined with ", " (for messages); "none" when empty.
  std::string NameList() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The queue marked default_queue, or nullptr when none is. (Create keeps
  // at most one marked; should a store hold several, the first by name.)
  // Valid until the next change.
  const v1::Queue* DefaultQueue() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // Validates, stamps create_time (now, or the replaced queue's) and
  // stores. AlreadyExists for a known name unless `update` (which creates
  // or replaces). Unset nominals are stored unset (unlimited).
  // A queue marked default_queue un-marks the previous default: that queue
  // is stored un-marked first, then this one. Should the second write fail,
  // the error says so and memory keeps what the store holds (no default):
  // never two defaults, on disk or in memory.
  absl::StatusOr<v1::Queue> Create(v1::Queue queue, bool update)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Removes a queue. `pending_jobs`/`running_jobs`: the queue's live jobs
  // now (the caller counts them in the JobBook): FailedPrecondition naming
  // how many when any. NotFound for an unknown name.
  absl::Status Delete(const std::string& name, int pending_jobs, int running_jobs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

 private:
  void CheckLoop() const {
    if (loop_ != nullptr) loop_->CheckInLoop("QueueRegistry");
  }

  StateStore* store_;
  const Clock* clock_;
  const EventLoop* loop_ = nullptr;
  // By name; mirrors the store's queues table.
  absl::btree_map<std::string, v1::Queue> queues_ ABSL_GUARDED_BY(kLoop);
};

// The submit-time rule. Puts `spec` in a queue and fills its priority:
//  - spec.queue empty: the submitter's first queue (Token.queues), else
//    the default queue (QueueRegistry::DefaultQueue), else "default"; when
//    queues are defined, none is the default and none is named "default":
//    InvalidArgument saying how to fix it (name a queue, or mark one the
//    default);
//  - a submitter (not admin) token with queues may only submit to those:
//    PermissionDenied naming the queue and the token's queues;
//  - queues defined and spec.queue not one of them: InvalidArgument
//    "queue: no queue named 'x' (defined: a, b)";
//  - no queue defined: any valid name is kept as given (no quota applies);
//  - priority unset: the queue's default_priority (left unset without
//    queues, which reads as 0);
//  - no resources (cpus, memory and pids all 0): the queue's
//    default_resources, whole (a job giving any of the three keeps exactly
//    its own: a partial merge would give it limits it did not choose);
//  - a job whose least size (elastic.min_ranks when elastic, else
//    world_size) exceeds the queue's max_job_size: InvalidArgument naming
//    the queue and the limit;
//  - scheduling.max_runtime_s 0: the queue's default_max_runtime_s, else
//    its max_runtime_s (0 when neither: no limit); above the queue's
//    max_runtime_s: InvalidArgument naming scheduling.max_runtime_s, the
//    queue and its maximum.
//  - unless spec.scheduling.wait_for_capacity: RefuseNeverRunnable.
// `role`/`token_queues`: the submitting token's (Principal::role, ::queues;
// the bootstrap admin secret has no queues).
absl::Status ResolveQueue(v1::JobSpec& spec, v1::Role role,
                          absl::Span<const std::string> token_queues, const QueueRegistry& queues)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

// InvalidArgument saying why when queue `q` (and its cohort) can never run
// `spec` however long it waits: its world_size exceeds q's
// max_slots_per_owner (an owner's pending job counts at world_size), or its
// least size exceeds the most slots q could ever hold of every kind the job
// may run on (scheduler::QueueCeiling: the nominal plus what the cohort
// could lend, within the borrowing and lending limits; an auto device job
// is refused only when neither kind could hold it), or its least size times
// its per-rank resources.cpus (resources.memory) exceeds the most CPUs
// (memory) q could ever hold (scheduler::QueueResourceShort; the error
// names that field). The scheduler would
// leave such a job pending for ever (kExceedsQueueLimit, or the owner's
// limit).
absl::Status RefuseNeverRunnable(const v1::JobSpec& spec, int32_t least_size, const v1::Queue& q,
                                 const QueueRegistry& queues) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

}  // namespace trainctl::coordinator
