// Answers the coordinator's ReadFile (trainctl fetch): one bounded piece of
// a job's checkpoint or final model on this host, and on request the whole
// file's CRC-32 (the checksum checkpoints are recorded with).
//
// Artifacts by record, never by path (docs/security.md): the coordinator
// asks only the worker that reported the file, naming the record's job, and
// this worker serves it only when
//  * its name is the job's (<job>.ckpt-epoch-*.pt or <job>.model.pt), so
//    worker.key, rank.conf or any other file is never a candidate;
//  * the file is opened relative to its directory's descriptor with
//    O_NOFOLLOW: a regular file with one link (a symlink, or a hard link to
//    another file, is refused);
//  * after that open, the same directory holds the job's manifest
//    (job_dir.h), written by this daemon's user or a uid it runs ranks as
//    (ManifestWriters): the directory is one prepared for that job's ranks.
//
// Called by the daemon's RankTable on its loop. Stateless; thread-safe.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "trainctl/v1/worker_service.pb.h"
#include "worker/daemon/job_dir.h"

namespace trainctl::worker {

// Largest piece sent, whatever the request asks.
inline constexpr int kMaxFileChunkBytes = 1 << 20;

// An open artifact: a read-only descriptor (closed by the destructor) and
// its size.
class OpenArtifact {
 public:
  OpenArtifact(int fd, int64_t size) : fd_(fd), size_(size) {}
  ~OpenArtifact();
  OpenArtifact(OpenArtifact&& o) noexcept : fd_(o.fd_), size_(o.size_) { o.fd_ = -1; }
  OpenArtifact(const OpenArtifact&) = delete;
  OpenArtifact& operator=(const OpenArtifact&) = delete;
  OpenArtifact& operator=(OpenArtifact&&) = delete;
  int fd() const { return fd_; }
  int64_t size() const { return size_; }

 private:
  int fd_;
  int64_t size_;
};

// Opens `path` as a checkpoint or final model of `job_id` under the rules
// above; FAILED_PRECONDITION (or NOT_FOUND) saying which rule refused it.
absl::StatusOr<OpenArtifact> OpenJobArtifact(const std::string& path, const std::string& job_id,
                                             const ManifestWriters& writers = {});

// The answer to `req`: a refused, missing or non-regular file is answered
// with `error` set.
v1::FileChunk ReadArtifactChunk(const v1::ReadFile& req, const ManifestWriters& writers = {});

// Deletes `path` when it is a checkpoint (not the final model) of `job_id`
// that OpenJobArtifact would serve (the coordinator's DropCheckpoints):
// unlinked through the same directory descriptor its checks used, as the
// directory's owner when that is a rank uid (a directory the job chose).
// NOT_FOUND when it is already gone; FAILED_PRECONDITION saying which rule
// refused it.
absl::Status DropJobCheckpoint(const std::string& path, const std::string& job_id,
                               const ManifestWriters& writers = {});

}  // namespace trainctl::worker
