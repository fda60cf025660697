// RankWorkspace (rank_workspace.h): the work dir's job layout, the ranks'
// identity, and an attempt's paths.
//
// Threading: stateless; see the header.
#include "worker/daemon/rank_workspace.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/codepack/code_pack.h"
#include "common/log.h"
#include "common/safe_file.h"
#include "common/status_macros.h"
#include "worker/daemon/path_policy.h"

namespace trainctl::worker {

namespace fs = std::filesystem;

RankWorkspace::RankWorkspace(const DaemonOptions& options, RankTablePaths paths)
    : options_(options), paths_(std::move(paths)), env_(FileEnv::Or(options.file_env)) {}

std::string RankWorkspace::JobDir(const std::string& job_id) const {
  return absl::StrCat(options_.work_dir, "/jobs/", job_id);
}

std::string RankWorkspace::AttemptDir(const std::string& job_id, int32_t attempt) const {
  return absl::StrCat(JobDir(job_id), "/attempt-", attempt);
}

std::string RankWorkspace::RankConfigFile(const std::string& job_id, int32_t attempt,
                                          int32_t rank) const {
  return absl::StrCat(AttemptDir(job_id, attempt), "/rank-", rank, ".conf");
}

std::string RankWorkspace::PreemptFile(const std::string& job_id, int32_t attempt,
                                       int32_t rank) const {
  return absl::StrCat(AttemptDir(job_id, attempt), "/rank-", rank, ".preempted");
}

absl::Status RankWorkspace::MakePreemptFile(const std::string& job_id, int32_t attempt,
                                            int32_t rank) const {
  const std::string path = PreemptFile(job_id, attempt, rank);
  // Empty; never through a link (O_EXCL|O_NOFOLLOW).
  const int fd =
      env_->OpenAt(AT_FDCWD, path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::close(fd);
    return absl::OkStatus();
  }
  const int e = errno;
  if (e == EEXIST) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cannot make ", path, ": ", std::strerror(e)));
}

absl::StatusOr<std::optional<RunAs>> RankWorkspace::JobIdentity(int64_t owner_number) const {
  if (!options_.rank_uids.has_value() || !options_.rank_user.has_value()) return options_.rank_user;
  TRAINCTL_ASSIGN_OR_RETURN(RunAs as,
                            OwnerIdentity(*options_.rank_uids, owner_number, *options_.rank_user,
                                          options_.work_dir + "/homes"));
  return std::optional<RunAs>(std::move(as));
}

ManifestWriters RankWorkspace::ManifestWritersHere() const {
  ManifestWriters w;
  if (options_.rank_uids.has_value()) {
    w.rank_uids = options_.rank_uids;
  } else if (options_.rank_user.has_value()) {
    w.rank_user = options_.rank_user->uid;
  }
  return w;
}

absl::Status RankWorkspace::MakeJobDirs(const std::string& job_id, const v1::JobSpec& spec,
                                        const std::optional<RunAs>& as) const {
  // Passable by the job's ranks only (its owner's group with --rank-uids).
  TRAINCTL_RETURN_IF_ERROR(MakeDaemonDir(JobDir(job_id), as, env_));
  if (options_.rank_uids.has_value() && as.has_value()) {
    TRAINCTL_RETURN_IF_ERROR(MakeDaemonDir(options_.work_dir + "/homes", options_.rank_user, env_));
    TRAINCTL_RETURN_IF_ERROR(MakeRankDir(as->home, as, env_));
  }
  if (!spec.checkpoint().dir().empty()) return absl::OkStatus();
  // The default checkpoint.dir is the daemon's to make (its ranks cannot
  // create anything in the job's directory) and the ranks' to write.
  return MakeRankDir(JobDir(job_id) + "/checkpoints", as, env_);
}

absl::StatusOr<std::string> RankWorkspace::MakeRankDirs(const std::string& job_id, int32_t attempt,
                                                        const v1::JobSpec& spec,
                                                        const std::optional<RunAs>& as,
                                                        int32_t rank) const {
  TRAINCTL_RETURN_IF_ERROR(MakeJobDirs(job_id, spec, as));
  TRAINCTL_RETURN_IF_ERROR(MakeDaemonDir(AttemptDir(job_id, attempt), as, env_));
  std::string dir = absl::StrCat(AttemptDir(job_id, attempt), "/rank-", rank);
  TRAINCTL_RETURN_IF_ERROR(MakeRankDir(dir, as, env_));
  return dir;
}

AttemptPaths RankWorkspace::ResolvePaths(const v1::JobSpec& spec, const AttemptClaim& claim) const {
  AttemptPaths p;
  if (!claim.run_as.ok()) p.error = std::string(claim.run_as.status().message());
  ResolveCommandDir(spec, p);
  ClaimCheckpointPath(spec, claim, p);
  ResolveTensorBoardDir(spec, p);
  return p;
}

void RankWorkspace::ResolveCommandDir(const v1::JobSpec& spec, AttemptPaths& p) const {
  if (!spec.has_command()) return;
  if (!options_.allow_commands) {
    p.error = "this worker does not run commands (start trainctl-worker with --allow-commands)";
  } else if (spec.command().has_code()) {
    // Resolved inside the unpacked code (UnpackCode); only its shape here.
    const fs::path wd(spec.command().working_dir());
    for (const fs::path& part : wd) {
      if (wd.is_absolute() || part == "..") {
        p.error = absl::StrCat("command.working_dir: '", wd.string(),
                               "' must be a relative path inside the job's code (no '..')");
        break;
      }
    }
  } else if (!spec.command().working_dir().empty()) {
    absl::StatusOr<std::string> dir =
        ResolveJobPath("command.working_dir", spec.command().working_dir(), paths_.base_dir,
                       options_.data_roots, "--data-root");
    std::error_code ec;
    if (!dir.ok()) {
      p.error = std::string(dir.status().message());
    } else if (!fs::is_directory(*dir, ec)) {
      p.error = absl::StrCat("command.working_dir: ", *dir, " is not a directory on this worker");
    } else {
      p.command_dir = *dir;
    }
  }
}

void RankWorkspace::ClaimCheckpointPath(const v1::JobSpec& spec, const AttemptClaim& claim,
                                        AttemptPaths& p) const {
  // Absolute (against the daemon's working directory) so the rank, whose
  // working directory differs, reads and writes the same place; a directory
  // the job chose must lie inside --checkpoint_root when one is set; and it
  // must be this owner's (claimed before any rank writes there, job_dir.h);
  // one the job chose is made as its ranks' user, never by root.
  absl::StatusOr<CheckpointDir> ck =
      ResolveCheckpointDir(spec, claim.job_id, claim.owner, options_.work_dir, paths_.base_dir,
                           options_.checkpoint_roots);
  if (!ck.ok()) {
    p.error = std::string(ck.status().message());
    return;
  }
  p.checkpoint_dir = ck->path;
  p.checkpoint_dir_named = ck->named;
  if (!p.error.empty()) return;  // Claimed by nobody (an identity refused is in `error` too).
  const std::optional<RunAs> made_as =
      spec.checkpoint().dir().empty() ? std::nullopt : *claim.run_as;
  if (absl::Status s = ClaimCheckpointDir(p.checkpoint_dir, claim.job_id, claim.owner,
                                          claim.resume_owner, made_as, ManifestWritersHere(), env_);
      !s.ok()) {
    p.error = std::string(s.message());
  }
}

void RankWorkspace::ResolveTensorBoardDir(const v1::JobSpec& spec, AttemptPaths& p) const {
  if (!spec.tensorboard().enabled() && spec.tensorboard().dir().empty()) return;
  if (spec.tensorboard().dir().empty()) {
    p.tensorboard_dir = p.checkpoint_dir.empty() ? "" : p.checkpoint_dir + "/tensorboard";
    return;
  }
  absl::StatusOr<std::string> dir =
      ResolveJobPath("tensorboard.dir", spec.tensorboard().dir(), paths_.base_dir,
                     options_.checkpoint_roots, "--checkpoint-root");
  if (dir.ok()) {
    p.tensorboard_dir = *dir;
  } else if (p.error.empty()) {
    p.error = std::string(dir.status().message());
  }
}

namespace {

// Empties `dir` (a restarted daemon's earlier try) and unpacks the archive
// open at `fd` into it, as the ranks' user. An unpack that fails partway
// (a full disk) removes what it wrote: no half-unpacked code is left.
absl::Status UnpackInto(int fd, const std::string& dir, const std::optional<RunAs>& as,
                        FileEnv* env) {
  {
    AsRankUser as_rank_user(as);
    if (!as_rank_user.ok()) {
      return absl::InternalError("cannot take on the ranks' identity to unpack the job's code");
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  TRAINCTL_RETURN_IF_ERROR(MakeRankDir(dir, as, env));
  AsRankUser as_rank_user(as);
  codepack::UnpackOptions options;
  options.env = env;
  absl::Status unpacked = codepack::UnpackArchiveFd(fd, dir, options);
  if (!unpacked.ok()) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  return unpacked;
}

}  // namespace

absl::StatusOr<std::string> RankWorkspace::UnpackCode(const std::string& job_id, int32_t attempt,
                                                      const v1::JobSpec& spec,
                                                      const std::optional<RunAs>& as,
                                                      const std::string& archive) const {
  const std::string& digest = spec.command().code().digest();
  TRAINCTL_RETURN_IF_ERROR(MakeJobDirs(job_id, spec, as));
  TRAINCTL_RETURN_IF_ERROR(MakeDaemonDir(AttemptDir(job_id, attempt), as, env_));
  const std::string dir = AttemptDir(job_id, attempt) + "/code";
  // Opened as the daemon (the cache is its own); read and written as the
  // ranks' user, so root writes nothing in the ranks' directory.
  const int fd = env_->OpenAt(AT_FDCWD, archive, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return absl::InternalError(absl::StrCat("cannot open ", archive, ": ", std::strerror(errno)));
  absl::Status unpacked = UnpackInto(fd, dir, as, env_);
  ::close(fd);
  if (!unpacked.ok())
    return absl::Status(unpacked.code(), absl::StrCat("code ", digest, ": ", unpacked.message()));
  std::string work = dir;
  if (!spec.command().working_dir().empty()) {
    work = (fs::path(dir) / spec.command().working_dir()).lexically_normal().string();
    std::error_code ec;
    if (!fs::is_directory(work, ec)) {
      return absl::InvalidArgumentError(absl::StrCat("command.working_dir: '",
                                                     spec.command().working_dir(),
                                                     "' is not a directory of the job's code"));
    }
  }
  LogEvent(
      LogLevel::kInfo, "worker", "code_unpacked",
      {{"job_id", job_id}, {"attempt", absl::StrCat(attempt)}, {"digest", digest}, {"dir", dir}});
  return work;
}

}  // namespace trainctl::worker
