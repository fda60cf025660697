// Files created without following links: the one way trainctl writes a file
// into a directory that someone else (a job, another user) may control.
//
// A job chooses its checkpoint directory, and a job's own program (or another
// job of the same owner) can plant a symlink there under any name it can
// predict: "model.pt.tmp" -> /etc/shadow. A writer that opens by path with
// O_TRUNC, or std::ofstream, then writes through the link as the writer's user
// (root, often). Here every file is created relative to an open directory fd
// with O_CREAT|O_EXCL|O_NOFOLLOW under a random temporary name (a planted
// name fails with EEXIST, a planted link is never followed), written,
// fsync'ed and renamed into place (rename replaces a link at the final name;
// it never writes through it), and the directory is fsync'ed. A reader sees
// the old file or the new one, never half of one, even after a crash.
//
// The directory itself is opened by path and may be reached through links
// (a checkpoint root on /data -> /mnt/data is normal); the daemon resolves a
// job's directory once (worker/daemon/path_policy.h).
//
// Errors are values naming the path and the errno text: ENOSPC/EDQUOT are
// RESOURCE_EXHAUSTED (callers keep their disk-full class), EACCES/EPERM/EROFS
// PERMISSION_DENIED, an existing final name with `replace = false`
// ALREADY_EXISTS, a missing directory NOT_FOUND, anything else INTERNAL.
// The errno is also attached (SafeFileErrno).
//
// Every system call that can fail goes through a FileEnv (common/file_env.h;
// SafeWriteOptions::env): a test hands a FaultFileEnv to make the disk fill
// at a write, a rename fail with EIO, a create be refused, and checks that
// the caller's error names the path and nothing half-written is left.
//
// Callers: token and key files (common/auth), the rank config
// (worker/protocol), models and checkpoints (worker/engine, worker/trainer),
// trainctl fetch, the worker-id file, the pre-flight and write probes.
// Threading: a SafeFileWriter is used by one thread; the functions are
// thread-safe (two writers of one name never share a temporary file).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_env.h"

namespace trainctl {

struct SafeWriteOptions {
  // Permission bits of the new file, before the process umask (0666: what the
  // umask allows, as for any file the process creates; 0600 for secrets).
  mode_t mode = 0666;
  // false: an existing file (or link) at the final name is left alone and
  // Commit fails with ALREADY_EXISTS (trainctl fetch without --force).
  bool replace = true;
  // fsync the file before the rename and the directory after it.
  bool sync = true;
  // The file system's calls (common/file_env.h); null: FileEnv::Default().
  // A test's FaultFileEnv makes a step fail as the disk would.
  FileEnv* env = nullptr;
};

// Mode 0600 (tokens, keys, the rank config, fetched files).
inline SafeWriteOptions PrivateFile(bool replace = true) {
  SafeWriteOptions o;
  o.mode = 0600;
  o.replace = replace;
  return o;
}

// One file being written: created at "<path>.tmp.<16 random hex>" in the
// final name's directory; Commit renames it over `path`. Destroyed without a
// successful Commit, the temporary file is removed.
class SafeFileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<SafeFileWriter>> Create(
      const std::string& path, const SafeWriteOptions& options = {});
  // The same in the directory open as `dir_fd` (the writer uses a dup of
  // it): for a caller that opened and checked the directory itself.
  // `name` is a plain file name; errors name it.
  static absl::StatusOr<std::unique_ptr<SafeFileWriter>> CreateAt(
      int dir_fd, const std::string& name, const SafeWriteOptions& options = {});
  ~SafeFileWriter();
  SafeFileWriter(const SafeFileWriter&) = delete;
  SafeFileWriter& operator=(const SafeFileWriter&) = delete;

  // Appends `data` (retrying short writes and EINTR).
  absl::Status Append(absl::string_view data);
  // The file as a stream (for writers that take a std::ostream: LibTorch's
  // archives, the client's Fetch). A failed write sets badbit; Commit then
  // reports the errno.
  std::ostream& stream();
  // fsync (options.sync), close, rename into place, fsync the directory.
  // Once only; on failure the temporary file is gone.
  absl::Status Commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  class FdBuf;
  SafeFileWriter(std::string path, SafeWriteOptions options);
  // Create/CreateAt once dir_fd_ is open: the temporary file.
  static absl::StatusOr<std::unique_ptr<SafeFileWriter>> CreateTemp(
      std::unique_ptr<SafeFileWriter> w, const std::string& dir);
  absl::Status Error(const std::string& what, int err) const;
  void Abandon();

  std::string path_;
  std::string temp_path_;
  std::string name_;       // basename of path_
  std::string temp_name_;  // basename of temp_path_
  SafeWriteOptions options_;
  FileEnv* env_;  // options_.env, or the default
  int dir_fd_ = -1;
  int fd_ = -1;
  int write_errno_ = 0;  // first failed write (Append or stream)
  int64_t written_ = 0;  // bytes in the temporary file
  std::unique_ptr<FdBuf> buf_;
  std::unique_ptr<std::ostream> stream_;
};

// Create + Append(contents) + Commit.
absl::Status WriteFileSafely(const std::string& path, absl::string_view contents,
                             const SafeWriteOptions& options = {});
// CreateAt + Append(contents) + Commit.
absl::Status WriteFileSafelyAt(int dir_fd, const std::string& name, absl::string_view contents,
                               const SafeWriteOptions& options = {});

// Checks that a file can be created in `dir`: creates "<dir>/<name>" with
// O_CREAT|O_EXCL|O_NOFOLLOW (mode 0600), writes `contents` and removes it. A
// file or link already at that name is never opened or written through: the
// probe then uses "<name>.<random hex>" instead. Status as above. `env`:
// as SafeWriteOptions::env.
absl::Status ProbeWritableDir(const std::string& dir, const std::string& name,
                              absl::string_view contents = "", FileEnv* env = nullptr);
// The same through a directory already open at `dir_fd` (kept open);
// `dir` only names it in messages.
absl::Status ProbeWritableDirAt(int dir_fd, const std::string& dir, const std::string& name,
                                absl::string_view contents = "", FileEnv* env = nullptr);

// Opens the directory `path` (absolute, or relative to the working
// directory), making each missing component with mkdirat(`mode`, less the
// umask), by a walk from "/" (or ".") that opens every component with
// O_DIRECTORY|O_NOFOLLOW relative to its parent's descriptor: a component
// that is a symbolic link (or not a directory) ends the walk with ELOOP or
// ENOTDIR and nothing is made past it, so a link swapped in at any depth
// cannot redirect what is made. ".." is refused (EINVAL). The caller owns
// the descriptor (O_RDONLY|O_DIRECTORY|O_CLOEXEC). Status as above.
absl::StatusOr<int> OpenOrMakeDirNoFollow(const std::string& path, mode_t mode = 0777,
                                          FileEnv* env = nullptr);

// The errno a status of this file attached, or 0.
int SafeFileErrno(const absl::Status& status);

// The status code for an errno of a file operation (see above).
absl::StatusCode SafeFileCode(int err);

}  // namespace trainctl
