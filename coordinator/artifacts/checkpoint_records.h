// The coordinator's checkpoint records of a job (Job.checkpoints): what a
// rank's report adds and how many are kept per holder, and which record a
// new attempt resumes from (moving rank 0 onto a holder when it can).
// Pure functions on the Job proto plus read-only registry lookups; run on
// the coordinator's loop.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/scheduler/scheduler.h"
#include "coordinator/workers/worker_registry.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::coordinator {

// The records of `job` at its newest checkpoint (highest global step), one
// per holder.
std::vector<const v1::CheckpointRecord*> NewestRecords(const v1::Job& job);
// "worker W" or "the shared checkpoint dir".
std::string Holder(const v1::CheckpointRecord& r);
// "the checkpoint of job J at epoch E (step S) on <holder>".
std::string DescribeRecord(const v1::CheckpointRecord& r);

// INVALID_ARGUMENT naming the field when a reported record cannot be kept.
absl::Status ValidateReportedCheckpoint(const v1::CheckpointRecord& in);

// INVALID_ARGUMENT naming `field` unless `path` (absolute) is a file of
// `job` with the job's name (a checkpoint, or with `final_model` the final
// model: common/jobspec/artifact_names.h) directly inside the job's
// checkpoint directory as the worker resolves it: checkpoint.dir itself
// when absolute, a directory ending in it when relative, and when unset
// .../jobs/<job>/checkpoints or .../<owner>/<job> (under a
// --checkpoint-root). A report naming any other file (a worker's key, a
// rank's rank.conf) is never recorded, so no fetch can follow it.
absl::Status CheckArtifactPath(const v1::Job& job, const std::string& path, bool final_model,
                               const std::string& field);

// Who owns the directory `dir` (absolute, NormalDirPath) by the
// coordinator's records: (owner, job id) of the earliest submitted of `jobs`
// whose checkpoint.dir is `dir` (lexically); nullopt when none.
std::optional<std::pair<std::string, std::string>> DirOwnerFromRecords(
    const std::vector<const v1::Job*>& jobs, const std::string& dir);
// Adds `r` to `next`'s records, keeping per holder the job's newest
// checkpoint.keep ones by global step; records of the job a resume started
// from stay, and so does the record the current attempt resumed from
// (fencing: a checkpoint a placement resumes from is never deleted). The
// records it no longer keeps whose files are to be deleted (the job's own,
// at another path than `r`) go to `*dropped` when given. Returns the words
// of the `checkpoint` event.
std::string AddCheckpointRecord(v1::Job& next, const v1::CheckpointRecord& r,
                                std::vector<v1::CheckpointRecord>* dropped = nullptr);

// The same copy: job, holder and path.
bool SameCopy(const v1::CheckpointRecord& a, const v1::CheckpointRecord& b);

// For a new attempt of `job` placed as `p`: moves rank 0 onto a holder of
// the newest checkpoint when one is in the placement, and returns the
// record to resume (unset for a fresh start) plus the words for the event.
std::pair<std::optional<v1::CheckpointRecord>, std::string> ChooseResume(
    const v1::Job& job, scheduler::Placement& p, const WorkerRegistry& registry)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

}  // namespace trainctl::coordinator
