// Starting an attempt on its workers and the messages that go with it: the
// pre-flight round (when enabled), StartRanks with the attempt's rendezvous
// secret, the rendezvous report of rank 0's worker and its delivery to every
// worker of the attempt, StopRanks, and the re-sends a reconnecting worker
// may have missed.
//
// Rendezvous: the worker holding rank 0 produces the NCCL unique id or the
// Gloo store address, reports it, and the coordinator hands it to every
// worker of that attempt. Reports about an attempt other than the job's
// current one are refused with ABORTED.
//
// Not thread-safe: built by JobOwners (job_owners.h), on the coordinator's EventLoop.
#pragma once

#include <optional>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/jobs/job_actions.h"
#include "coordinator/jobs/job_book.h"
#include "coordinator/jobs/owner_numbers.h"
#include "coordinator/workers/worker_registry.h"
#include "trainctl/v1/worker_service.pb.h"

namespace trainctl::coordinator {

// How ranks are stopped: SIGTERM, then SIGKILL after `grace` (default
// AttemptStarter::Options::stop_grace); `checkpoint_first` for a preemption
// (StopRanks.checkpoint_first).
struct StopHow {
  std::optional<absl::Duration> grace;
  bool checkpoint_first = false;
  // > 0: a hung command job's ranks dump their Python stacks to their logs
  // first, this long before their SIGTERM (StopRanks.stack_dump_ms).
  absl::Duration stack_dump = absl::ZeroDuration();
};

class AttemptStarter {
 public:
  struct Options {
    // Pre-flight before StartRanks (JobManagerOptions::preflight).
    bool preflight = false;
    // SIGTERM → SIGKILL grace the workers get when told to stop ranks.
    absl::Duration stop_grace = absl::Seconds(10);
  };
  AttemptStarter(JobBook* book, WorkerRegistry* registry, JobActions* actions, OwnerNumbers* owners,
                 Options options)
      : book_(book), registry_(registry), actions_(actions), owners_(owners), options_(options) {}

  // Starts a placed attempt on its workers: pre-flight first when enabled,
  // else StartRanks.
  void Launch(JobEntry& entry, const v1::Attempt& attempt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // A worker's pre-flight result. When every worker of the attempt has
  // answered: StartRanks to all, or the attempt fails as PREFLIGHT naming
  // every failing worker, with no rank started.
  absl::Status OnPreflightReport(const std::string& worker_id, const v1::PreflightReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Rank 0's worker reports the attempt's rendezvous: stored, then sent to
  // every worker of the attempt.
  absl::Status OnRendezvous(const std::string& worker_id, const v1::RendezvousReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The session refused that report (`why`: its host is not the worker's).
  // An attempt with ranks on other workers then fails at once as CONFIG,
  // naming the worker, the address and the fix (its ranks could never
  // meet); one whose ranks are all on that worker goes on (they met
  // without the coordinator). Returns `why` (a refusal), or the store's
  // error when the failure could not be written.
  absl::Status OnRendezvousRefused(const std::string& worker_id, const v1::RendezvousReport& report,
                                   const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // After `worker_id` reconnected: what it may have missed of the current
  // attempt `cur` (pre-flight or StartRanks for its ranks still ASSIGNED,
  // and the rendezvous).
  void Resend(JobEntry& entry, const v1::Attempt& cur, const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Tells a worker to stop ranks.
  void Stop(const std::string& worker_id, const std::string& job_id, int32_t attempt,
            const std::vector<int32_t>& ranks, const std::string& reason, StopHow how = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void StopAll(const std::string& job_id, int32_t attempt, const RanksByWorker& ranks,
               const std::string& reason, StopHow how = {}) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

 private:
  // The owner of the job `job` resumes ("" when none): the worker lets the
  // job use that owner's checkpoint directory (SubmitJob checked that the
  // caller may resume it).
  std::string ResumeOwner(const v1::Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The number of the owner whose files the job works in (ResumeOwner when
  // set, else the job's owner); 0, logged, when none could be stored (a
  // worker with --rank-uids then refuses to start its ranks).
  int64_t OwnerNumber(const v1::Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void SendPreflight(const JobEntry& entry, const v1::Attempt& attempt,
                     const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void SendStartRanks(JobEntry& entry, const v1::Attempt& attempt, const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void SendRendezvous(const v1::Job& job, const v1::Attempt& attempt, const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Sends `msg` to `worker_id` once what made it is stored (JobBook::
  // AfterCommit: at once outside a telemetry group).
  void SendAfterCommit(const std::string& worker_id, v1::CoordinatorMessage msg)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // OnPreflightReport once every worker answered.
  absl::Status ConcludePreflight(JobEntry& entry, const std::vector<std::string>& workers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  JobBook* book_;
  WorkerRegistry* registry_;
  JobActions* actions_;
  OwnerNumbers* owners_;
  Options options_;
};

}  // namespace trainctl::coordinator
