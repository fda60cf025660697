// Where a job's files may be: the one place data, model and checkpoint paths
// of a job spec are resolved on a worker. A relative path is resolved against
// the daemon's working directory (one documented base for every rank, whose
// own working directories differ); `..` and symlinks are resolved; and when
// the operator gave roots (--data-root, --checkpoint-root), the result must
// lie inside one of them, so a job cannot make the worker read /etc/shadow as
// a dataset or write checkpoints over /etc. Data is read only from roots:
// without --data-root, the work dir and the distribution's dataset
// directories (DefaultDataRoots).
//
// Called by the daemon's RankWorkspace and RankTable before it launches a rank.
// Threading: stateless functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainctl/v1/job.pb.h"
#include "worker/protocol/rank_protocol.h"

namespace trainctl::worker {

// The canonical absolute form of `path` (relative to `base`). With non-empty
// `roots` (canonical directories), FAILED_PRECONDITION naming `field`, the
// path and the roots when it is outside all of them; `flag` names the flag
// that sets them ("--data-root").
absl::StatusOr<std::string> ResolveJobPath(const std::string& field, const std::string& path,
                                           const std::string& base,
                                           const std::vector<std::string>& roots,
                                           const std::string& flag);

// Canonical absolute forms of `roots` (for DaemonOptions); INVALID_ARGUMENT
// naming `flag` when one is not an existing directory.
absl::StatusOr<std::vector<std::string>> CanonicalRoots(const std::vector<std::string>& roots,
                                                        const std::string& flag);

// Where Debian's dataset packages install (fashion-mnist, ...): read by
// default, as the work dir is.
inline constexpr const char* kSystemDataDirs[] = {"/usr/share/datasets"};

// The roots a worker without --data-root reads data and model files from:
// `work_dir` and those of kSystemDataDirs that exist, canonical.
std::vector<std::string> DefaultDataRoots(const std::string& work_dir);

// How errors name DefaultDataRoots (in place of "--data-root").
inline constexpr char kDefaultDataRootsName[] =
    "data root (without --data-root: the work dir and /usr/share/datasets)";

// A job's checkpoint directory on this worker: `path` (canonical) is where
// its ranks write; `named` the same directory as the job names it (the
// spec's checkpoint.dir made absolute against `base`, without resolving
// links), the form checkpoint reports carry so that the coordinator can
// check them against the spec (checkpoint_records.h).
struct CheckpointDir {
  std::string path;
  std::string named;
};
// checkpoint.dir resolved under --checkpoint-root (`roots`); unset, it is
// <roots[0]>/<owner>/<job id> with roots, else <work_dir>/jobs/<job id>/checkpoints.
absl::StatusOr<CheckpointDir> ResolveCheckpointDir(
    const v1::JobSpec& spec, const std::string& job_id, const std::string& owner,
    const std::string& work_dir, const std::string& base, const std::vector<std::string>& roots);

// Rewrites every data and model file path in a rank config (data.*.path,
// data.*.images, data.*.labels, model.path) through ResolveJobPath with
// `data_roots` (named `roots_name` in errors). The first refused path is
// the error.
absl::Status ResolveDataPaths(rankproto::FlatConfig& config, const std::string& base,
                              const std::vector<std::string>& data_roots,
                              const std::string& roots_name = "--data-root");

}  // namespace trainctl::worker
