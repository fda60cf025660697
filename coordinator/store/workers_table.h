// The store's workers table (StateStore::workers()): every worker ever
// registered, by id, as its v1.Worker. Written by the WorkerRegistry before
// it acknowledges a registration or a state change; read back at start by
// StateStore::LoadAll.
//
// Threading: every method takes the store's one lock (state_store.h).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "trainctl/v1/worker_service.pb.h"

namespace trainctl::coordinator {

class StateStore;
namespace store_internal {
struct StoreCore;
}  // namespace store_internal

class WorkersTable {
 public:
  WorkersTable(const WorkersTable&) = delete;
  WorkersTable& operator=(const WorkersTable&) = delete;

  // Inserts or replaces the worker by id (one statement, its own commit).
  absl::Status PutWorker(const v1::Worker& worker);
  // Removes the worker's row (a gone worker past its TTL); absent is fine.
  absl::Status DeleteWorker(const std::string& id);

 private:
  friend class StateStore;
  explicit WorkersTable(store_internal::StoreCore& core) : core_(core) {}
  store_internal::StoreCore& core_;
};

}  // namespace trainctl::coordinator
