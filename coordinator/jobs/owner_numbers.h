// Each job owner's number (StartRanks.owner_number): 1 for the first owner
// the coordinator sees, then 2, ...; stored, the same on every worker and
// never given to another owner. A worker with --rank-uids runs an owner's
// ranks as uid FIRST + number - 1, so two owners' ranks never share a uid on
// any host, and one owner's ranks have the same uid on every host (files on
// shared storage stay theirs). docs/security.md "Each owner's ranks as
// their own uid".
//
// Used on the coordinator's loop only (JobManager, AttemptStarter); not
// thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/store/state_store.h"

namespace trainctl::coordinator {

class OwnerNumbers {
 public:
  explicit OwnerNumbers(StateStore* store) : store_(store) {}

  // `owner`'s number; an owner without one gets the next and it is stored
  // first. Unavailable (or the store's error) when it cannot be stored:
  // then nothing is given.
  absl::StatusOr<int64_t> Get(const std::string& owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

 private:
  absl::Status LoadOnce() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  StateStore* store_;
  bool loaded_ ABSL_GUARDED_BY(kLoop) = false;
  int64_t highest_ ABSL_GUARDED_BY(kLoop) = 0;
  absl::flat_hash_map<std::string, int64_t> numbers_ ABSL_GUARDED_BY(kLoop);
};

}  // namespace trainctl::coordinator
