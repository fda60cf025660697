// RankWorkspace: where a job's ranks live on this worker and as whom. It
// owns the work dir's job layout (rank_files.h: jobs/JOB, its attempt-N,
// each rank's directory, rank-R.conf, the preemption files), the identity
// a job's ranks run as (--rank-user, --rank-uids), whose checkpoint
// manifests this daemon trusts, and an attempt's paths resolved under the
// path policy (path_policy.h: the checkpoint directory, claimed for its
// owner (job_dir.h), the TensorBoard directory, a command job's working
// directory, or the unpacked code's). The RankTable keeps the ranks'
// lifecycle and asks the workspace for every path and directory.
//
// Threading: stateless. Every method is const and reads only the options
// and paths fixed at construction; it touches the filesystem (as the
// calling thread's identity, or the ranks' inside AsRankUser), so the
// daemon calls it on its EventLoop, where the RankTable runs, but nothing
// here needs the loop.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainctl/v1/job.pb.h"
#include "worker/daemon/daemon_options.h"
#include "worker/daemon/job_dir.h"
#include "worker/daemon/rank_files.h"

namespace trainctl::worker {

// Where a job's relative paths and data files are resolved (the daemon
// settles them at Start).
struct RankTablePaths {
  // The daemon's working directory at Start: the one base a job's relative
  // paths are resolved against (path_policy.h).
  std::string base_dir;
  // Where data and model files are read from: --data-root, else
  // DefaultDataRoots (the work dir, /usr/share/datasets); and how errors
  // name them.
  std::vector<std::string> data_read_roots;
  std::string data_roots_name = "--data-root";
};

// Whose attempt's paths are resolved (RankWorkspace::ResolvePaths).
struct AttemptClaim {
  std::string job_id;
  // Job.owner, and the owner of the job it resumes: who may have claimed
  // the checkpoint directory (job_dir.h).
  std::string owner;
  std::string resume_owner;
  // Who its ranks run as (RankWorkspace::JobIdentity); an error when that
  // failed: then nothing is claimed, least of all as root.
  absl::StatusOr<std::optional<RunAs>> run_as = std::optional<RunAs>();
};

// Where an attempt's ranks read and write on this worker.
struct AttemptPaths {
  // Where the writer ranks put checkpoints and the final model (canonical),
  // and the same directory as the job named it (checkpoint_dir_named: the
  // form reports carry, so that the coordinator can check them against the
  // spec; path_policy.h ResolveCheckpointDir).
  std::string checkpoint_dir;
  std::string checkpoint_dir_named;
  // Where rank 0 writes TensorBoard event files ("" = the job has none).
  std::string tensorboard_dir;
  // command.working_dir resolved under the path policy (command jobs); with
  // code, the unpacked code's directory (and working_dir inside it; set
  // from RankWorkspace::UnpackCode).
  std::string command_dir;
  // Why the job's paths (or its identity) are refused on this worker ("" =
  // fine): its ranks fail as a configuration error instead of starting.
  std::string error;
};

class RankWorkspace {
 public:
  // `options` (work_dir absolute) outlives the workspace.
  RankWorkspace(const DaemonOptions& options, RankTablePaths paths);

  const RankTablePaths& paths() const { return paths_; }

  // Paths of rank_files.h: jobs/JOB, its attempt-N, rank R's config file
  // beside rank R's directory (the daemon's: handed over as an open fd).
  std::string JobDir(const std::string& job_id) const;
  std::string AttemptDir(const std::string& job_id, int32_t attempt) const;
  std::string RankConfigFile(const std::string& job_id, int32_t attempt, int32_t rank) const;
  // The file a preemption makes for rank `rank` (rank_protocol.h
  // kPreemptFile): in the attempt's directory, which the daemon owns (the
  // rank may stat it, never plant a link there).
  std::string PreemptFile(const std::string& job_id, int32_t attempt, int32_t rank) const;
  // Makes PreemptFile (empty; never through a link). Already there (a
  // second StopRanks): OK. The error names the path and why.
  absl::Status MakePreemptFile(const std::string& job_id, int32_t attempt, int32_t rank) const;

  // Who a job's ranks (and the daemon's work on the job's files) run as:
  // the owner's own uid with --rank-uids, else --rank-user (nullopt: this
  // daemon's user). FailedPrecondition for an owner number --rank-uids has
  // no uid for.
  absl::StatusOr<std::optional<RunAs>> JobIdentity(int64_t owner_number) const;
  // Whose checkpoint-directory manifests this daemon trusts: its own
  // user's and the uids it runs ranks as (job_dir.h).
  ManifestWriters ManifestWritersHere() const;

  // jobs/JOB (the daemon's, passable by the job's ranks), with --rank-uids
  // the ranks' home, and the default checkpoint.dir (the ranks') unless
  // the job chose one.
  absl::Status MakeJobDirs(const std::string& job_id, const v1::JobSpec& spec,
                           const std::optional<RunAs>& as) const;
  // MakeJobDirs, attempt-N, and rank `rank`'s own directory (returned).
  absl::StatusOr<std::string> MakeRankDirs(const std::string& job_id, int32_t attempt,
                                           const v1::JobSpec& spec, const std::optional<RunAs>& as,
                                           int32_t rank) const;

  // An attempt's paths under the path policy, the checkpoint directory
  // claimed for its owner (as its ranks' user when the job chose it). The
  // first refusal is in `error`, named by field (command.working_dir,
  // checkpoint.dir, tensorboard.dir); a refused identity is one too.
  AttemptPaths ResolvePaths(const v1::JobSpec& spec, const AttemptClaim& claim) const;

  // Unpacks the code archive at `archive` (opened as the daemon) into the
  // attempt's code directory, owned by its ranks and written as their user;
  // returns the command's working directory inside it. InvalidArgument
  // naming command.working_dir when that is not a directory of the code.
  absl::StatusOr<std::string> UnpackCode(const std::string& job_id, int32_t attempt,
                                         const v1::JobSpec& spec, const std::optional<RunAs>& as,
                                         const std::string& archive) const;

 private:
  // A command job's working directory into `p` (or its refusal).
  void ResolveCommandDir(const v1::JobSpec& spec, AttemptPaths& p) const;
  // The checkpoint directory, resolved and claimed, into `p`.
  void ClaimCheckpointPath(const v1::JobSpec& spec, const AttemptClaim& claim,
                           AttemptPaths& p) const;
  // The TensorBoard directory into `p`.
  void ResolveTensorBoardDir(const v1::JobSpec& spec, AttemptPaths& p) const;

  const DaemonOptions& options_;
  const RankTablePaths paths_;
  FileEnv* const env_;  // options_.file_env, or the real file system
};

}  // namespace trainctl::worker
