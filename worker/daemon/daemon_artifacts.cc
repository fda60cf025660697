// Artifacts this daemon serves to a fetch (`trainctl fetch`, docs): a
// checkpoint or final model of the job the coordinator's record names, in a
// directory this daemon prepared for that job, one FileChunk per ReadFile
// (artifact_reader.h). Nothing else: not the work dir, not worker.key, not
// a rank's rank.conf.
//
// Threading: runs on the daemon's EventLoop.
#include "common/log.h"
#include "worker/daemon/artifact_reader.h"
#include "worker/daemon/rank_table_internal.h"

namespace trainctl::worker {

void RankTable::OnReadFile(const v1::ReadFile& r) {
  v1::WorkerMessage m;
  *m.mutable_file_chunk() = ReadArtifactChunk(r, workspace_.ManifestWritersHere());
  if (!m.file_chunk().error().empty()) {
    LogEvent(LogLevel::kWarn, "worker", "fetch_refused",
             {{"job_id", r.job_id()}, {"path", r.path()}, {"reason", m.file_chunk().error()}});
  }
  out_.Send(std::move(m), /*critical=*/false);
}

void RankTable::OnDropCheckpoints(const v1::DropCheckpoints& d) {
  for (const std::string& path : d.paths()) {
    absl::Status s = DropJobCheckpoint(path, d.job_id(), workspace_.ManifestWritersHere());
    if (s.ok()) {
      LogEvent(LogLevel::kInfo, "worker", "checkpoint_dropped",
               {{"job_id", d.job_id()}, {"path", path}});
    } else if (!absl::IsNotFound(s)) {
      LogEvent(LogLevel::kWarn, "worker", "checkpoint_drop_refused",
               {{"job_id", d.job_id()}, {"path", path}, {"reason", std::string(s.message())}});
    }
  }
}

}  // namespace trainctl::worker
