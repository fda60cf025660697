// Whose checkpoint directory this is, and which jobs wrote there: the
// manifests a worker daemon keeps in a job's checkpoint directory
// (docs/checkpoints.md "Whose directory", docs/security.md).
//
//  * `.trainctl-dir` claims the directory for the owner (Job.owner; in
//    local `trainctl run`, the Unix user) of the first job whose ranks
//    start there. It is written once, first writer wins, and never
//    rewritten: a job of another owner is refused there (at pre-flight and
//    again at launch) naming the owner, unless it resumes that owner's job.
//  * `<job>.trainctl-job` names a job that writes there. A fetch is served
//    only from a directory holding the manifest of the record's job, written
//    by this daemon's user (artifact_reader.h).
//
// Every file is created without following links, relative to a directory
// descriptor opened with O_NOFOLLOW (WriteFileAt).
//
// Called by the daemon's RankTable on its loop (launch, pre-flight) and by the
// artifact reader. Stateless functions; thread-safe.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/subprocess.h"

namespace trainctl::worker {

// A directory's claim (.trainctl-dir).
struct DirClaim {
  std::string owner;
  // The job whose start claimed it.
  std::string job_id;
};

// Writes `content` as `name` in the directory open at `dirfd`, never
// following a link: a temporary file created O_CREAT|O_EXCL|O_NOFOLLOW
// (mode 0600), written and fsynced, then renamed over `name` (`replace`),
// or linked to `name` so that the first writer wins (`!replace`:
// ALREADY_EXISTS when `name` exists). The only place this module creates a
// file.
absl::Status WriteFileAt(int dirfd, const std::string& name, const std::string& content, bool replace);

// The claim of the directory open at `dirfd`; nullopt when it has none.
// DATA_LOSS when the file is there but is not a claim (a link, garbage).
absl::StatusOr<std::optional<DirClaim>> ReadDirClaimAt(int dirfd);
absl::StatusOr<std::optional<DirClaim>> ReadDirClaim(const std::string& dir);

// PERMISSION_DENIED naming the directory and its owner when `claim` belongs
// to neither `owner` nor `resume_owner` (a job resuming a job of that
// owner may use its directory). A claim with no owner (jobs submitted
// before owners existed) binds nobody.
absl::Status CheckDirClaim(const std::string& dir, const DirClaim& claim, const std::string& owner,
                           const std::string& resume_owner);

// Before a job's ranks start: creates `dir` (and its parents),
// claims it for `owner` unless already claimed, checks the claim
// (CheckDirClaim) and writes the job's manifest.
//
// `made_as` (a checkpoint.dir the job chose, with --rank-user): the
// directory is created, opened and proven writable (a probe file made and
// removed through the descriptor) with the ranks' filesystem identity
// (AsRankUser), so root makes no directory a job chose, never follows a
// link the job planted into a place that user cannot reach, and writes its
// two manifests only through that descriptor, into a directory the ranks
// can write anyway. Without it (the daemon's own default directories, or
// no rank user) the daemon makes the directory itself.
absl::Status ClaimCheckpointDir(const std::string& dir, const std::string& job_id, const std::string& owner,
                                const std::string& resume_owner, const std::optional<RunAs>& made_as = std::nullopt);

// OK when the directory open at `dirfd` holds `job_id`'s manifest: a
// regular file owned by this process's user that names the job.
absl::Status CheckJobManifestAt(int dirfd, const std::string& job_id);

// The path to report for a checkpoint (or, `final_model`, the final model)
// a rank of `job_id` said it wrote at `reported`: `named_dir`/<file> when
// `reported` is a file named for the job directly in the attempt's
// checkpoint directory (`dir`, canonical, or its `named_dir` form);
// nullopt otherwise (a rank pointing at another file: not forwarded).
std::optional<std::string> JobArtifactReport(const std::string& reported, const std::string& job_id,
                                             const std::string& dir, const std::string& named_dir, bool final_model);

}  // namespace trainctl::worker
