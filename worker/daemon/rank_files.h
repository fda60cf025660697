// What a rank process may reach on disk: the worker daemon's work dir laid
// out so that ranks, running as --rank-user, reach their own directories
// and never the daemon's secrets (docs/security.md "Ranks run as another
// user"). Called by the WorkerDaemon (Start) and its RankWorkspace (pre-flight, rank launch).
//
//   <work dir>/                      daemon's user, 0711
//     worker.key worker.crt worker-id    daemon's user, 0600
//     jobs/  jobs/JOB/  jobs/JOB/attempt-N/   daemon's user, group: the rank user's, 0710
//     jobs/JOB/attempt-N/rank-R.conf      daemon's user, 0600: handed to the
//                                         rank as an open fd, never by path
//     jobs/JOB/attempt-N/rank-R/          the rank user's, 0700: its working dir
//     jobs/JOB/checkpoints/               the rank user's, 0700: default checkpoint.dir
//
// 0711 on the work dir and 0710 with the rank user's group below let ranks
// pass through the daemon's directories to their own (they cannot list
// them or create anything in them; other users stop at jobs/); files the
// daemon keeps are 0600, so a rank opening one by a known name gets EACCES.
// The work dir keeps its group (systemd's StateDirectory= would otherwise
// chown the whole tree back at every start). Without a rank user every
// directory is 0700 and the daemon's (ranks then run as the daemon's user
// and can read all of it).
//
// Directories under jobs/ that a rank user owns belong to the one rank user
// every job shares: the ranks of two jobs on one host can read each other's
// scratch and default checkpoint directories (not rank.conf, not the
// daemon's files). With --rank-uids each owner's ranks get a uid of their
// own instead (OwnerIdentity): jobs/JOB/ and below are that uid's and its
// group's, so another owner's ranks cannot pass; and HOME is
// <work dir>/homes/<uid> (the daemon's homes/ 0710, group of the rank user).
//
// Stateless; thread-safe. AsRankUser changes the calling thread only.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_env.h"
#include "common/subprocess.h"

namespace trainctl::worker {

// --rank-uids FIRST-LAST: the uids (and, the same numbers, gids) that
// owners' ranks run as; owner number N gets FIRST + N - 1.
struct RankUidRange {
  uid_t first = 0;
  uid_t last = 0;
};

// Parses "FIRST-LAST": 1 <= FIRST <= LAST < 2^31, at most 65536 ids.
// InvalidArgument naming --rank-uids and the reason.
absl::StatusOr<RankUidRange> ParseRankUids(absl::string_view text);

// FailedPrecondition naming the first user or group of this host (its
// passwd and group databases, as enumerated) whose id lies in `range`:
// those ids must belong to nobody but trainctl's ranks, or a job would run
// as that user (or with that group).
absl::Status CheckRankUidsUnused(const RankUidRange& range);

// The identity the ranks of owner number `owner_number` run as: uid and gid
// FIRST + owner_number - 1; besides its own group, the groups of
// `rank_user` (data every job may read is shared with that group); USER
// and LOGNAME "trainctl-<uid>"; HOME <homes_dir>/<uid>. FailedPrecondition
// for number 0 (the coordinator gave none) or one past the range.
absl::StatusOr<RunAs> OwnerIdentity(const RankUidRange& range, int64_t owner_number,
                                    const RunAs& rank_user, const std::string& homes_dir);

// Sets the work dir's own mode (0711 with a rank user, else 0700) and that of
// the daemon's files in it (worker.key, worker.crt, worker-id, *.tmp: 0600),
// and makes jobs/ as the work dir. Fails when the work dir is not a
// directory owned by this process's user.
absl::Status SecureWorkDir(const std::string& work_dir, const std::optional<RunAs>& rank_user);

// mkdir (when missing) a directory of the daemon's that ranks pass through:
// owner this process's user, mode 0710 with the rank user's group (0700
// without one). The parent must exist. Never follows a symlink at `path`;
// a directory of another owner is FailedPrecondition.
// `env`: the file system's calls (common/file_env.h; null: the real ones).
absl::Status MakeDaemonDir(const std::string& path, const std::optional<RunAs>& rank_user,
                           FileEnv* env = nullptr);

// mkdir (when missing) a directory the rank owns: the rank user and its
// group, 0700 (this process's user without a rank user). The parent must
// exist and be the daemon's. Never follows a symlink at `path`.
absl::Status MakeRankDir(const std::string& path, const std::optional<RunAs>& rank_user,
                         FileEnv* env = nullptr);

// While alive, the calling thread touches files as the rank user would:
// filesystem uid and gid and supplementary groups of the rank user (the
// kernel then checks permissions, and owns new files, as for the rank).
// For the daemon's work on a job's behalf in places the job chose: the
// pre-flight's probes, the claim of a checkpoint.dir the job chose
// (job_dir.h), a command job's checkpoint.dir. Root cannot be made
// to create or read what the rank user could not. A no-op without a rank
// user or when this process is not root.
//
// Only the thread that made it, only in one scope: other threads (and the
// process's real and effective ids) are untouched; a thread started inside
// the scope would inherit the rank user's identity (start none there). Restoring the thread's
// identity cannot fail for root; if it did, the process aborts rather than
// run on as another user.
class AsRankUser {
 public:
  explicit AsRankUser(const std::optional<RunAs>& rank_user);
  ~AsRankUser();
  AsRankUser(const AsRankUser&) = delete;
  AsRankUser& operator=(const AsRankUser&) = delete;

  // False when the switch failed (the thread kept its identity).
  bool ok() const { return ok_; }

 private:
  bool active_ = false;
  bool ok_ = true;
  std::vector<gid_t> saved_groups_;
};

}  // namespace trainctl::worker
