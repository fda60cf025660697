// FileEnv: the file-system calls that trainctl's careful writers make
// (common/safe_file.h, the worker daemon's workspace and checkpoint-directory
// claims, the code unpacker, the state store's check of its database file),
// behind one interface so that a test can make any of them fail the way a
// real disk does (LevelDB's Env and FaultInjectionTestEnv, in small).
//
// Each method is the system call of its name with errno semantics: the
// result, or -1 with errno set. Callers pass AT_FDCWD as the directory for a
// path-based call. Nothing else (close, read, fchown, fchmod) goes through
// here: those are not where disks fail in ways a caller must handle.
//
// PosixFileEnv (FileEnv::Default()) is the real thing and is what every
// caller gets when it is not handed one. FaultFileEnv wraps another env and
// fails chosen calls with a chosen errno.
//
// Threading: both are thread-safe.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace trainctl {

class FileEnv {
 public:
  virtual ~FileEnv() = default;

  // The real file system (a PosixFileEnv); never null, never destroyed.
  static FileEnv* Default();
  // `env`, or Default() when it is null: for callers that take an optional
  // env.
  static FileEnv* Or(FileEnv* env) { return env != nullptr ? env : Default(); }

  virtual int OpenAt(int dir_fd, const std::string& name, int flags, mode_t mode = 0) = 0;
  virtual ssize_t Write(int fd, const void* data, size_t size) = 0;
  virtual int Fsync(int fd) = 0;
  // renameat2(2) with `flags` (0: renameat(2)).
  virtual int RenameAt(int from_dir, const std::string& from, int to_dir, const std::string& to,
                       unsigned flags = 0) = 0;
  virtual int LinkAt(int from_dir, const std::string& from, int to_dir, const std::string& to) = 0;
  virtual int MkdirAt(int dir_fd, const std::string& name, mode_t mode) = 0;
  virtual int UnlinkAt(int dir_fd, const std::string& name, int flags = 0) = 0;
  // fstatat(2).
  virtual int StatAt(int dir_fd, const std::string& name, struct stat* st, int flags = 0) = 0;
};

// The system calls themselves (EINTR is the caller's, as with the calls).
class PosixFileEnv final : public FileEnv {
 public:
  int OpenAt(int dir_fd, const std::string& name, int flags, mode_t mode = 0) override;
  ssize_t Write(int fd, const void* data, size_t size) override;
  int Fsync(int fd) override;
  int RenameAt(int from_dir, const std::string& from, int to_dir, const std::string& to,
               unsigned flags = 0) override;
  int LinkAt(int from_dir, const std::string& from, int to_dir, const std::string& to) override;
  int MkdirAt(int dir_fd, const std::string& name, mode_t mode) override;
  int UnlinkAt(int dir_fd, const std::string& name, int flags = 0) override;
  int StatAt(int dir_fd, const std::string& name, struct stat* st, int flags = 0) override;
};

// The calls a FaultFileEnv can fail.
enum class FileOp {
  kOpen,    // OpenAt (creating a file, or opening one or a directory)
  kWrite,   // Write
  kFsync,   // Fsync
  kRename,  // RenameAt (either name matching counts)
  kLink,    // LinkAt (either name matching counts)
  kMkdir,   // MkdirAt
  kUnlink,  // UnlinkAt
  kStat,    // StatAt
};

// One fault: the calls of `op` whose path starts with `path_prefix` ("" =
// every path) fail with `err` -- every such call (`nth` 0), or only the
// nth (1-based, counted from Inject) -- without being made.
struct FileFault {
  FileOp op;
  std::string path_prefix;
  int err;
  int nth = 0;
};

// Passes every call to `base` except those a fault matches. A call's path is
// the absolute one: a name relative to a directory descriptor is joined to
// the directory's path (read from /proc/self/fd), a descriptor's own path
// is read the same way (a file being written: its temporary name).
class FaultFileEnv final : public FileEnv {
 public:
  explicit FaultFileEnv(FileEnv* base = nullptr) : base_(FileEnv::Or(base)) {}

  // Adds a fault; the first matching fault of a call decides it.
  void Inject(FileFault fault);
  // Removes every fault (the counts of calls stay).
  void Clear();
  // How many calls the faults have failed so far.
  int64_t injected() const;

  int OpenAt(int dir_fd, const std::string& name, int flags, mode_t mode = 0) override;
  ssize_t Write(int fd, const void* data, size_t size) override;
  int Fsync(int fd) override;
  int RenameAt(int from_dir, const std::string& from, int to_dir, const std::string& to,
               unsigned flags = 0) override;
  int LinkAt(int from_dir, const std::string& from, int to_dir, const std::string& to) override;
  int MkdirAt(int dir_fd, const std::string& name, mode_t mode) override;
  int UnlinkAt(int dir_fd, const std::string& name, int flags = 0) override;
  int StatAt(int dir_fd, const std::string& name, struct stat* st, int flags = 0) override;

 private:
  struct Armed {
    FileFault fault;
    int seen = 0;  // matching calls so far
  };
  // The errno the faults give a call of `op` on `paths`, or 0 (then the
  // call goes to base_). Sets errno when non-zero.
  int Fault(FileOp op, const std::vector<std::string>& paths);

  FileEnv* const base_;
  mutable absl::Mutex mu_;
  std::vector<Armed> faults_ ABSL_GUARDED_BY(mu_);
  int64_t injected_ ABSL_GUARDED_BY(mu_) = 0;
};

// The absolute path of `name` relative to `dir_fd` (AT_FDCWD: the working
// directory), as well as /proc/self/fd tells; `name` alone when it cannot.
std::string FilePathAt(int dir_fd, const std::string& name);

}  // namespace trainctl
