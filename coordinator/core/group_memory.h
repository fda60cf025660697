// The memory a store group's handlers change, told how the group ended.
//
// TelemetryLedger runs a worker's reports inside one store group
// (StateStore::BeginGroup): their writes are durable only at CommitGroup,
// and a failed commit (a full disk) or a handler's store failure rolls the
// whole group back. What the handlers did to memory, and what they would
// tell watchers and workers, must follow the store: kept and released only
// when the group commits, undone and dropped when it rolls back, so that
// memory never runs ahead of what is stored (the reports are then held and
// retried, and apply afresh). The JobBook is that memory.
//
// Loop only, like the ledger that calls it.
#pragma once

#include "coordinator/core/on_loop.h"

namespace trainctl::coordinator {

class GroupMemory {
 public:
  virtual ~GroupMemory() = default;
  // The store group began: from now on remember how memory was, and hold
  // every effect that would leave the coordinator.
  virtual void GroupBegun() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) = 0;
  // The group committed (`committed`: keep what changed, release the held
  // effects in order) or was rolled back (restore memory as it was at
  // GroupBegun, drop the held effects).
  virtual void GroupEnded(bool committed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) = 0;
};

}  // namespace trainctl::coordinator
