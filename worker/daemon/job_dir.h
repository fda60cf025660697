// Whose checkpoint directory this is, and which jobs wrote there: the
// manifests kept in a job's checkpoint directory (docs/checkpoints.md
// "Whose directory", docs/security.md).
//
//  * `.trainctl-dir` claims the directory for the owner (Job.owner; in
//    local `trainctl run`, the Unix user) of the first job whose ranks
//    start there. It is written once, first writer wins, and never
//    rewritten: a job of another owner is refused there (at pre-flight and
//    again at launch) naming the owner, unless it resumes that owner's job.
//  * `<job>.trainctl-job` names a job that writes there. A fetch is served
//    only from a directory holding the manifest of the record's job.
//
// Who writes them: in a directory the job chose (checkpoint.dir set, with a
// rank user), the ranks' identity, so that root makes nothing there; in the
// daemon's own default directories, the daemon. Either is trusted when
// read back (ManifestWriters): this daemon's user, or a uid it runs ranks
// as. A manifest by anyone else is not one.
//
// Every directory is opened (or made) by a walk that follows no link
// (OpenOrMakeDirNoFollow) and every file created relative to that
// descriptor (WriteFileAt), so a link swapped in cannot redirect either.
//
// Called by the daemon's RankWorkspace and RankTable on its loop (launch, pre-flight) and by the
// artifact reader. Stateless functions; thread-safe.
#pragma once

#include <unistd.h>

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/file_env.h"
#include "common/subprocess.h"
#include "worker/daemon/rank_files.h"

namespace trainctl::worker {

// The users whose manifests are trusted: this daemon's, and the uids it
// runs ranks as (--rank-user; with --rank-uids, that range). A rank can
// write a manifest only where its own uid may write, which is where the
// daemon would have made that job's directory as that uid anyway.
struct ManifestWriters {
  uid_t daemon = ::geteuid();
  std::optional<uid_t> rank_user;
  std::optional<RankUidRange> rank_uids;

  bool Trusts(uid_t uid) const {
    return uid == daemon || (rank_user.has_value() && uid == *rank_user) ||
           (rank_uids.has_value() && uid >= rank_uids->first && uid <= rank_uids->last);
  }
};

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
// `env` (here and below): the file system's calls (common/file_env.h;
// null: the real ones).
absl::Status WriteFileAt(int dirfd, const std::string& name, const std::string& content,
                         bool replace, FileEnv* env = nullptr);

// The claim of the directory open at `dirfd`; nullopt when it has none.
// DATA_LOSS when the file is there but is not a claim (a link, garbage, or
// written by a user `writers` does not trust).
absl::StatusOr<std::optional<DirClaim>> ReadDirClaimAt(int dirfd,
                                                       const ManifestWriters& writers = {});
absl::StatusOr<std::optional<DirClaim>> ReadDirClaim(const std::string& dir,
                                                     const ManifestWriters& writers = {});

// PERMISSION_DENIED naming the directory and its owner when `claim` belongs
// to neither `owner` nor `resume_owner` (a job resuming a job of that
// owner may use its directory). A claim with no owner (jobs submitted
// before owners existed) binds nobody.
absl::Status CheckDirClaim(const std::string& dir, const DirClaim& claim, const std::string& owner,
                           const std::string& resume_owner);

// The checkpoint directory `dir`, opened (made, with its parents, when
// missing) by a walk that follows no link, proven writable (a probe file
// made and removed through the descriptor) and checked against its claim
// (CheckDirClaim): pre-flight's check and the launch's claim both start
// here, with the identity of the calling thread (the rank user's, inside
// AsRankUser: `as_rank_user` says so in messages). Its descriptor (the
// caller closes it), or FAILED_PRECONDITION / PERMISSION_DENIED naming the
// directory and why; `*err`, when given, gets the errno of a failed make
// or probe (ENOSPC: waiting for space).
absl::StatusOr<int> OpenCheckpointDir(const std::string& dir, const std::string& owner,
                                      const std::string& resume_owner,
                                      const ManifestWriters& writers = {},
                                      bool as_rank_user = false, int* err = nullptr,
                                      FileEnv* env = nullptr);

// Before a job's ranks start: OpenCheckpointDir, then claims the directory
// for `owner` unless already claimed and writes the job's manifest, both
// through that descriptor.
//
// `made_as` (a checkpoint.dir the job chose, with --rank-user): all of it
// -- the walk, the probe, the claim and the manifest -- runs with the
// ranks' filesystem identity (AsRankUser), so root makes nothing a job
// chose and never follows a link the job planted. Without it (the daemon's
// own default directories, or no rank user) the daemon does it itself.
absl::Status ClaimCheckpointDir(const std::string& dir, const std::string& job_id,
                                const std::string& owner, const std::string& resume_owner,
                                const std::optional<RunAs>& made_as = std::nullopt,
                                const ManifestWriters& writers = {}, FileEnv* env = nullptr);

// OK when the directory open at `dirfd` holds `job_id`'s manifest: a
// regular file owned by a user `writers` trusts that names the job.
absl::Status CheckJobManifestAt(int dirfd, const std::string& job_id,
                                const ManifestWriters& writers = {});

// The path to report for a checkpoint (or, `final_model`, the final model)
// a rank of `job_id` said it wrote at `reported`: `named_dir`/<file> when
// `reported` is a file named for the job directly in the attempt's
// checkpoint directory (`dir`, canonical, or its `named_dir` form);
// nullopt otherwise (a rank pointing at another file: not forwarded).
std::optional<std::string> JobArtifactReport(const std::string& reported, const std::string& job_id,
                                             const std::string& dir, const std::string& named_dir,
                                             bool final_model);

}  // namespace trainctl::worker
