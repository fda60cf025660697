#include "worker/daemon/artifact_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/jobspec/artifact_names.h"
#include "worker/daemon/job_dir.h"
#include "worker/daemon/rank_files.h"

namespace trainctl::worker {

OpenArtifact::~OpenArtifact() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

// OpenJobArtifact's checks, leaving the directory's descriptor in `*dir`
// and the file's name in `*name`.
absl::StatusOr<OpenArtifact> OpenArtifactIn(const std::string& path, const std::string& job_id,
                                            const ManifestWriters& writers, bool checkpoints_only,
                                            std::optional<OpenArtifact>* dir, std::string* name) {
  if (job_id.empty())
    return absl::InvalidArgumentError("job_id: required (a coordinator older than this worker?)");
  if (path.empty() || path[0] != '/') return absl::InvalidArgumentError("path: must be absolute");
  const size_t slash = path.rfind('/');
  const std::string dir_path = slash == 0 ? "/" : path.substr(0, slash);
  *name = path.substr(slash + 1);
  if (!IsCheckpointFileName(job_id, *name) &&
      (checkpoints_only || !IsFinalModelFileName(job_id, *name))) {
    return absl::FailedPreconditionError(
        absl::StrCat(path,
                     checkpoints_only ? ": not a checkpoint of job "
                                      : ": not a checkpoint or final model of job ",
                     job_id, " (this worker serves only those)"));
  }
  // The directory may be reached through links (a checkpoint.dir under a
  // symlinked mount is reported in the spec's form): what decides is the
  // manifest found through this descriptor.
  const int dfd = ::open(dir_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (const int e = errno; dfd < 0) {
    return absl::Status(
        e == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kFailedPrecondition,
        absl::StrCat(dir_path, ": ", std::strerror(e)));
  }
  dir->emplace(dfd, 0);
  const int fd = ::openat(dfd, name->c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    return absl::Status(
        e == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kFailedPrecondition,
        absl::StrCat(path, ": ", e == ELOOP ? "a symbolic link (not served)" : std::strerror(e)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", std::strerror(e)));
  }
  OpenArtifact file(fd, st.st_size);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file"));
  }
  if (st.st_nlink != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": has ", st.st_nlink, " links (a hard link to another file is not served)"));
  }
  // The manifest is checked after the open, through the same directory
  // descriptor: swapping the directory after the check gains nothing.
  if (absl::Status m = CheckJobManifestAt(dfd, job_id, writers); !m.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(dir_path, ": ", m.message()));
  }
  return absl::StatusOr<OpenArtifact>(std::move(file));
}

}  // namespace

absl::StatusOr<OpenArtifact> OpenJobArtifact(const std::string& path, const std::string& job_id,
                                             const ManifestWriters& writers) {
  std::optional<OpenArtifact> dir;
  std::string name;
  absl::StatusOr<OpenArtifact> file =
      OpenArtifactIn(path, job_id, writers, /*checkpoints_only=*/false, &dir, &name);
  if (file.ok())
    ::fcntl(file->fd(), F_SETFL,
            0);  // blocking reads from here (O_NONBLOCK only kept a FIFO from hanging the open)
  return file;
}

absl::Status DropJobCheckpoint(const std::string& path, const std::string& job_id,
                               const ManifestWriters& writers) {
  std::optional<OpenArtifact> dir;
  std::string name;
  absl::StatusOr<OpenArtifact> file =
      OpenArtifactIn(path, job_id, writers, /*checkpoints_only=*/true, &dir, &name);
  if (!file.ok()) return file.status();
  // In a directory a rank uid owns (one the job chose), deleted as that
  // uid: the daemon writes nothing there itself.
  std::optional<RunAs> as;
  struct stat dst {};
  if (::fstat(dir->fd(), &dst) == 0 && dst.st_uid != writers.daemon && writers.Trusts(dst.st_uid)) {
    as = RunAs{};
    as->uid = dst.st_uid;
    as->gid = dst.st_gid;
    as->groups = {dst.st_gid};
  }
  int unlinked = -1;
  int e = 0;
  {
    AsRankUser as_owner(as);
    if (as_owner.ok()) {
      unlinked = ::unlinkat(dir->fd(), name.c_str(), 0);
      e = errno;
    } else {
      e = EPERM;
    }
  }
  if (unlinked != 0) {
    return absl::Status(
        e == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kFailedPrecondition,
        absl::StrCat(path, ": ", std::strerror(e)));
  }
  return absl::OkStatus();
}

v1::FileChunk ReadArtifactChunk(const v1::ReadFile& req, const ManifestWriters& writers) {
  v1::FileChunk c;
  c.set_request_id(req.request_id());
  c.set_offset(req.offset());
  absl::StatusOr<OpenArtifact> f = OpenJobArtifact(req.path(), req.job_id(), writers);
  if (!f.ok()) {
    c.set_error(std::string(f.status().message()));
    return c;
  }
  const int64_t size = f->size();
  c.set_size(size);
  if (req.offset() < 0 || req.offset() > size) {
    c.set_error(absl::StrCat("offset: ", req.offset(), " is outside the file (", size, " bytes)"));
    return c;
  }
  std::vector<char> buf(kMaxFileChunkBytes);
  if (req.want_checksum()) {
    uLong crc = crc32(0L, Z_NULL, 0);
    for (int64_t off = 0;;) {
      ssize_t n = ::pread(f->fd(), buf.data(), buf.size(), off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(n));
      off += n;
    }
    c.set_checksum(absl::StrFormat("crc32:%08x", static_cast<uint32_t>(crc)));
  }
  const int64_t want =
      std::min<int64_t>({std::max(req.max_bytes(), 1), kMaxFileChunkBytes, size - req.offset()});
  std::string data(static_cast<size_t>(want), '\0');
  int64_t got = 0;
  while (got < want) {
    ssize_t n =
        ::pread(f->fd(), data.data() + got, static_cast<size_t>(want - got), req.offset() + got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += n;
  }
  if (got != want) {
    c.set_error(absl::StrCat(req.path(), ": short read at ", req.offset(), " (the file changed?)"));
    return c;
  }
  c.set_data(std::move(data));
  return c;
}

}  // namespace trainctl::worker
