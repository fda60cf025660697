// The store's jobs table and each job's events (StateStore::jobs()): a job
// row holds the whole v1.Job (attempts included) plus the columns queries
// need; its events are appended with it. Written by the JobBook before any
// job change is acted on or acknowledged.
//
// A job and the events of its change are one transaction (PutJob): they
// share this class because nothing may store one without the other.
//
// Threading: every method takes the store's one lock (state_store.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::coordinator {

class StateStore;
namespace store_internal {
struct StoreCore;
}  // namespace store_internal

class JobsTable {
 public:
  JobsTable(const JobsTable&) = delete;
  JobsTable& operator=(const JobsTable&) = delete;

  // Inserts or replaces the job (the whole message, attempts included) and
  // appends `events` (their seq set by the caller, unique per job), in one
  // transaction. submit_seq orders jobs; it is kept from the first write.
  // An event with an empty job_id is stored with the job's; another job's id
  // is InvalidArgument. A seq already stored is AlreadyExists, and nothing of
  // the call is written. Events beyond StoreOptions::max_events_per_job: the
  // oldest are deleted.
  absl::Status PutJob(const v1::Job& job, int64_t submit_seq,
                      const std::vector<v1::Event>& events = {});

  // Events of a job with seq > after_seq, ascending, at most `limit`
  // (<= 0: no limit).
  absl::StatusOr<std::vector<v1::Event>> ListEvents(const std::string& job_id, int64_t after_seq,
                                                    int64_t limit);

 private:
  friend class StateStore;
  explicit JobsTable(store_internal::StoreCore& core) : core_(core) {}
  store_internal::StoreCore& core_;
};

}  // namespace trainctl::coordinator
