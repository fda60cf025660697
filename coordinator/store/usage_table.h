// The store's accounting table (StateStore::usage(); attempt_usage, schema
// version 10; `trainctl usage --by attempt`): one row per ended attempt
// (job_id, attempt), written by the JobBook when the attempt's last rank
// exited (coordinator/jobs/attempt_usage.h); never deleted with the job.
//
// Threading: every method takes the store's one lock (state_store.h).
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainctl/v1/queue.pb.h"

namespace trainctl::coordinator {

class StateStore;
namespace store_internal {
struct StoreCore;
}  // namespace store_internal

class UsageTable {
 public:
  UsageTable(const UsageTable&) = delete;
  UsageTable& operator=(const UsageTable&) = delete;

  // Inserts or replaces the attempt's row (one commit, or a savepoint of an
  // open group). InvalidArgument without a job id, an attempt >= 1, a
  // start and an end time.
  absl::Status PutAttemptUsage(const v1::AttemptUsage& usage);
  // The rows whose time overlaps (since, until): ending after `since`,
  // starting before `until`; ordered by start, job id, attempt. DataLoss
  // naming the row when one does not parse or holds another attempt.
  absl::StatusOr<std::vector<v1::AttemptUsage>> LoadAttemptUsage(absl::Time since,
                                                                 absl::Time until);

 private:
  friend class StateStore;
  explicit UsageTable(store_internal::StoreCore& core) : core_(core) {}
  store_internal::StoreCore& core_;
};

}  // namespace trainctl::coordinator
