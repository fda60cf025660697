// Artifacts this daemon serves to a fetch (`trainctl fetch`, docs): the
// checkpoints and final models its ranks reported, and files under its work
// dir or a --checkpoint-root, one FileChunk per ReadFile (artifact_reader.h).
//
// Threading: runs on the daemon's EventLoop.
#include <algorithm>
#include <filesystem>

#include "worker/daemon/artifact_reader.h"
#include "worker/daemon/path_policy.h"
#include "worker/daemon/worker_daemon_internal.h"

namespace trainctl::worker {

void WorkerDaemon::RememberArtifact(const std::string& path) {
  std::error_code ec;
  std::string canonical = std::filesystem::canonical(path, ec).string();
  if (!ec) reported_artifacts_.insert(std::move(canonical));
}

void WorkerDaemon::OnReadFile(const v1::ReadFile& r) {
  std::error_code ec;
  const std::string work = std::filesystem::weakly_canonical(options_.work_dir, ec).string();
  v1::WorkerMessage m;
  *m.mutable_file_chunk() = ReadArtifactChunk(r, [&](const std::string& path) {
    if (PathIsUnder(path, work) || reported_artifacts_.count(path) > 0) return true;
    return std::any_of(options_.checkpoint_roots.begin(), options_.checkpoint_roots.end(),
                       [&](const std::string& root) { return PathIsUnder(path, root); });
  });
  Enqueue(std::move(m), /*critical=*/false);
}

}  // namespace trainctl::worker
