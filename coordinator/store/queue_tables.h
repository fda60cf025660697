// The store's queue tables (StateStore::queues()): the queues jobs are
// submitted to (QueueRegistry) and the one row of fair-share usage the
// JobPlacer keeps across restarts.
//
// Each write is one statement (its own transaction).
// Threading: every method takes the store's one lock (state_store.h).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainctl/v1/queue.pb.h"

namespace trainctl::coordinator {

class StateStore;
namespace store_internal {
struct StoreCore;
}  // namespace store_internal

class QueueTables {
 public:
  QueueTables(const QueueTables&) = delete;
  QueueTables& operator=(const QueueTables&) = delete;

  // Inserts or replaces a queue by name (one commit).
  absl::Status PutQueue(const v1::Queue& queue);
  // Removes the queue's row; absent is fine.
  absl::Status DeleteQueue(const std::string& name);
  // Every stored queue, ascending by name; DataLoss naming the row when one
  // does not parse or holds another name.
  absl::StatusOr<std::vector<v1::Queue>> LoadQueues();
  // Replaces the stored fair-share usage (one row, one commit).
  absl::Status PutFairShare(const v1::FairShareSnapshot& usage);
  // The stored fair-share usage; an empty snapshot when none was stored;
  // DataLoss when the row does not parse.
  absl::StatusOr<v1::FairShareSnapshot> LoadFairShare();

 private:
  friend class StateStore;
  explicit QueueTables(store_internal::StoreCore& core) : core_(core) {}
  store_internal::StoreCore& core_;
};

}  // namespace trainctl::coordinator
