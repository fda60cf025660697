#include "worker/daemon/path_policy.h"

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/jobspec/artifact_names.h"

namespace trainctl::worker {
namespace {

namespace fs = std::filesystem;

// Whether `p` is `root` or below it, by whole path components.
bool Inside(const fs::path& p, const fs::path& root) {
  auto pi = p.begin();
  for (auto ri = root.begin(); ri != root.end(); ++ri, ++pi) {
    if (ri->empty()) continue;  // a trailing separator
    if (pi == p.end() || *pi != *ri) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> ResolveJobPath(const std::string& field, const std::string& path,
                                           const std::string& base,
                                           const std::vector<std::string>& roots,
                                           const std::string& flag) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": empty path"));
  fs::path p(path);
  if (p.is_relative()) p = fs::path(base) / p;
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(p, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": cannot resolve '", path, "': ", ec.message()));
  }
  if (roots.empty()) return canonical.string();
  for (const std::string& root : roots) {
    if (Inside(canonical, fs::path(root))) return canonical.string();
  }
  return absl::FailedPreconditionError(
      absl::StrCat(field, ": '", path, "' (", canonical.string(), ") is outside every ", flag,
                   " of this worker (", absl::StrJoin(roots, ", "), ")"));
}

absl::StatusOr<std::vector<std::string>> CanonicalRoots(const std::vector<std::string>& roots,
                                                        const std::string& flag) {
  std::vector<std::string> out;
  for (const std::string& r : roots) {
    if (r.empty()) continue;
    std::error_code ec;
    fs::path c = fs::canonical(r, ec);
    if (ec || !fs::is_directory(c, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", r, "' is not an existing directory"));
    }
    out.push_back(c.string());
  }
  return out;
}

std::vector<std::string> DefaultDataRoots(const std::string& work_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::path w = fs::weakly_canonical(work_dir, ec);
  out.push_back(ec ? work_dir : w.string());
  for (const char* dir : kSystemDataDirs) {
    fs::path c = fs::canonical(dir, ec);
    if (!ec && fs::is_directory(c, ec)) out.push_back(c.string());
  }
  return out;
}

absl::StatusOr<CheckpointDir> ResolveCheckpointDir(
    const v1::JobSpec& spec, const std::string& job_id, const std::string& owner,
    const std::string& work_dir, const std::string& base, const std::vector<std::string>& roots) {
  const std::string& dir = spec.checkpoint().dir();
  if (dir.empty()) {
    const fs::path d = roots.empty() ? fs::path(work_dir) / "jobs" / job_id / "checkpoints"
                                     : fs::path(roots.front()) / OwnerPathComponent(owner) / job_id;
    const std::string abs = NormalDirPath(fs::absolute(d).string());
    // Links above it (a work dir under a linked mount) resolved now: the
    // directory is then made and opened by a walk that follows none
    // (job_dir.h); reports keep the form given.
    std::error_code ec;
    const fs::path real = fs::weakly_canonical(abs, ec);
    return CheckpointDir{ec ? abs : NormalDirPath(real.string()), abs};
  }
  absl::StatusOr<std::string> canonical =
      ResolveJobPath("checkpoint.dir", dir, base, roots, "--checkpoint-root");
  if (!canonical.ok()) return canonical.status();
  const fs::path p(dir);
  return CheckpointDir{*canonical,
                       NormalDirPath((p.is_relative() ? fs::path(base) / p : p).string())};
}

absl::Status ResolveDataPaths(rankproto::FlatConfig& config, const std::string& base,
                              const std::vector<std::string>& data_roots,
                              const std::string& roots_name) {
  for (auto& [key, value] : config) {
    const bool data_file = absl::StartsWith(key, "data.") &&
                           (absl::EndsWith(key, ".path") || absl::EndsWith(key, ".images") ||
                            absl::EndsWith(key, ".labels"));
    if (!data_file && key != "model.path") continue;
    if (value.empty()) continue;
    absl::StatusOr<std::string> resolved = ResolveJobPath(key, value, base, data_roots, roots_name);
    if (!resolved.ok()) return resolved.status();
    value = *resolved;
  }
  return absl::OkStatus();
}

}  // namespace trainctl::worker
