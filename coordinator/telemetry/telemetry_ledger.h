// The coordinator's side of at-least-once telemetry: applies each worker's
// sequenced messages (WorkerMessage.seq > 0) at most once, and knows what to
// acknowledge.
//
// A worker numbers every report the coordinator must not lose (rank status,
// rendezvous, metrics, logs, progress) and resends what is not acknowledged
// after a reconnect, in order. For each message the ledger runs the
// manager's handler inside one store group transaction (StateStore::
// BeginGroup) that also records the worker's new highest seq, so that what
// the handler wrote and the seq are durable together; only then may the
// session acknowledge it. A seq at or below the worker's highest applied one
// is a duplicate (a resend) and is dropped without running the handler; a
// gap is accepted (the worker dropped those messages when its buffer was
// full). The highest seq per worker survives a coordinator restart
// (Recover from the store snapshot), so a resend after a crash is
// deduplicated exactly.
//
// A handler's refusal (a bad or stale report: InvalidArgument, Aborted, ...)
// still counts as applied, so one bad message cannot stall the stream. Only
// a store failure that a retry may cure (Unavailable, ResourceExhausted, or
// a failed commit) leaves the seq unapplied: nothing of the group is kept,
// in the store or in memory (the GroupMemory, the jobs, is restored and
// what the handlers would have published or sent is dropped), and the
// caller holds the messages and retries them (WorkerSession::Hold).
//
// Not thread-safe: runs on the coordinator's EventLoop (like the managers it
// calls).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "coordinator/core/group_memory.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/store/state_store.h"

namespace trainctl::coordinator {

class TelemetryLedger {
 public:
  // `memory` (may be null: nothing but the store changes) is told when each
  // group begins and how it ended.
  explicit TelemetryLedger(StateStore* store, GroupMemory* memory = nullptr)
      : store_(store), memory_(memory) {}

  // Loads the highest applied seq per worker (after StateStore::LoadAll).
  void Recover(const StoreSnapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // The highest seq of `worker_id` applied (0 when none): what a
  // TelemetryAck or RegisterAck carries.
  int64_t Applied(const std::string& worker_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  enum class Outcome {
    // The handler ran and the group committed; `status` is the handler's
    // (a refusal is logged by the caller, the seq counts as applied).
    kApplied,
    // seq <= Applied(): a resend, dropped without running the handler.
    kDuplicate,
    // A store failure: nothing committed, the seq is not applied; end the
    // session so the worker resends. `status` says why.
    kRetry,
  };
  struct Result {
    Outcome outcome;
    absl::Status status;
  };

  // Runs `apply` (the manager's handler for the message) at most once for
  // (`worker_id`, `seq`), seq > 0: Begin, apply, Finish.
  Result Apply(const std::string& worker_id, int64_t seq,
               const std::function<absl::Status()>& apply) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // The same in two steps, for a caller that dispatches itself. Begin:
  // kDuplicate (do not handle), kRetry (the group could not start), or
  // kApplied meaning "handle it now, then call Finish" with the handler's
  // status. Exactly one Finish follows a Begin that returned kApplied.
  Result Begin(const std::string& worker_id, int64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  Result Finish(const std::string& worker_id, int64_t seq, absl::Status handled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // Group commit: many workers' messages in one store group, one commit.
  // Items run in order; one at or below its worker's applied seq (or below
  // a seq of the same worker earlier in the batch) is a duplicate and does
  // not run. kApplied: every item that ran is committed together with each
  // worker's highest seq (refusals count as applied, as in Apply; `status`
  // is OK). kRetry: a store failure (at begin, from a handler, or at
  // commit): nothing of the batch is kept, no seq is applied, and every
  // worker of the batch must resend.
  struct Item {
    std::string worker_id;
    int64_t seq = 0;
    std::function<absl::Status()> apply;
  };
  Result ApplyBatch(const std::vector<Item>& items) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // After a group its caller committed itself, off the loop
  // (TelemetryTables::AppendGroup: the telemetry batcher's writer): each
  // worker's applied seq advances to the one committed (never lowered).
  // Only then: a seq whose commit failed must not count as applied, or its
  // resend would be dropped as a duplicate.
  void MarkApplied(const std::vector<std::pair<std::string, int64_t>>& seqs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

 private:
  // BeginGroup, and on success GroupMemory::GroupBegun.
  absl::Status BeginGroup() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Rolls the store's group back (when still open) and memory with it.
  void RollBack() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // CommitGroup; memory keeps what changed only when it succeeded.
  absl::Status Commit(const std::vector<std::pair<std::string, int64_t>>& seqs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  StateStore* store_;
  GroupMemory* memory_;
  // Highest applied seq per worker id (memory; durable for every group that
  // wrote to the store, see StateStore::CommitGroup).
  absl::flat_hash_map<std::string, int64_t> applied_ ABSL_GUARDED_BY(kLoop);
};

}  // namespace trainctl::coordinator
