#include "common/file_env.h"

#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace trainctl {
namespace {

// The path /proc/self/fd gives `fd`; "" when it cannot be read.
std::string FdPath(int fd) {
  char buf[PATH_MAX];
  const std::string link = fd == AT_FDCWD ? "/proc/self/cwd" : absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof buf);
  return n <= 0 ? std::string() : std::string(buf, static_cast<size_t>(n));
}

}  // namespace

std::string FilePathAt(int dir_fd, const std::string& name) {
  if (!name.empty() && name[0] == '/') return name;
  const std::string dir = FdPath(dir_fd);
  if (dir.empty()) return name;
  if (name.empty()) return dir;
  return absl::StrCat(dir == "/" ? "" : dir, "/", name);
}

FileEnv* FileEnv::Default() {
  static PosixFileEnv* const env = new PosixFileEnv;
  return env;
}

int PosixFileEnv::OpenAt(int dir_fd, const std::string& name, int flags, mode_t mode) {
  return ::openat(dir_fd, name.c_str(), flags, mode);
}

ssize_t PosixFileEnv::Write(int fd, const void* data, size_t size) {
  return ::write(fd, data, size);
}

int PosixFileEnv::Fsync(int fd) { return ::fsync(fd); }

int PosixFileEnv::RenameAt(int from_dir, const std::string& from, int to_dir, const std::string& to,
                           unsigned flags) {
  if (flags == 0) return ::renameat(from_dir, from.c_str(), to_dir, to.c_str());
  return ::renameat2(from_dir, from.c_str(), to_dir, to.c_str(), flags);
}

int PosixFileEnv::LinkAt(int from_dir, const std::string& from, int to_dir, const std::string& to) {
  return ::linkat(from_dir, from.c_str(), to_dir, to.c_str(), 0);
}

int PosixFileEnv::MkdirAt(int dir_fd, const std::string& name, mode_t mode) {
  return ::mkdirat(dir_fd, name.c_str(), mode);
}

int PosixFileEnv::UnlinkAt(int dir_fd, const std::string& name, int flags) {
  return ::unlinkat(dir_fd, name.c_str(), flags);
}

int PosixFileEnv::StatAt(int dir_fd, const std::string& name, struct stat* st, int flags) {
  return ::fstatat(dir_fd, name.c_str(), st, flags);
}

void FaultFileEnv::Inject(FileFault fault) {
  absl::MutexLock lock(&mu_);
  faults_.push_back(Armed{std::move(fault)});
}

void FaultFileEnv::Clear() {
  absl::MutexLock lock(&mu_);
  faults_.clear();
}

int64_t FaultFileEnv::injected() const {
  absl::MutexLock lock(&mu_);
  return injected_;
}

int FaultFileEnv::Fault(FileOp op, const std::vector<std::string>& paths) {
  absl::MutexLock lock(&mu_);
  for (Armed& a : faults_) {
    if (a.fault.op != op) continue;
    bool match = false;
    for (const std::string& p : paths) match = match || absl::StartsWith(p, a.fault.path_prefix);
    if (!match) continue;
    ++a.seen;
    if (a.fault.nth != 0 && a.seen != a.fault.nth) continue;
    ++injected_;
    errno = a.fault.err;
    return a.fault.err;
  }
  return 0;
}

int FaultFileEnv::OpenAt(int dir_fd, const std::string& name, int flags, mode_t mode) {
  if (Fault(FileOp::kOpen, {FilePathAt(dir_fd, name)}) != 0) return -1;
  return base_->OpenAt(dir_fd, name, flags, mode);
}

ssize_t FaultFileEnv::Write(int fd, const void* data, size_t size) {
  if (Fault(FileOp::kWrite, {FdPath(fd)}) != 0) return -1;
  return base_->Write(fd, data, size);
}

int FaultFileEnv::Fsync(int fd) {
  if (Fault(FileOp::kFsync, {FdPath(fd)}) != 0) return -1;
  return base_->Fsync(fd);
}

int FaultFileEnv::RenameAt(int from_dir, const std::string& from, int to_dir, const std::string& to,
                           unsigned flags) {
  if (Fault(FileOp::kRename, {FilePathAt(from_dir, from), FilePathAt(to_dir, to)}) != 0) return -1;
  return base_->RenameAt(from_dir, from, to_dir, to, flags);
}

int FaultFileEnv::LinkAt(int from_dir, const std::string& from, int to_dir, const std::string& to) {
  if (Fault(FileOp::kLink, {FilePathAt(from_dir, from), FilePathAt(to_dir, to)}) != 0) return -1;
  return base_->LinkAt(from_dir, from, to_dir, to);
}

int FaultFileEnv::MkdirAt(int dir_fd, const std::string& name, mode_t mode) {
  if (Fault(FileOp::kMkdir, {FilePathAt(dir_fd, name)}) != 0) return -1;
  return base_->MkdirAt(dir_fd, name, mode);
}

int FaultFileEnv::UnlinkAt(int dir_fd, const std::string& name, int flags) {
  if (Fault(FileOp::kUnlink, {FilePathAt(dir_fd, name)}) != 0) return -1;
  return base_->UnlinkAt(dir_fd, name, flags);
}

int FaultFileEnv::StatAt(int dir_fd, const std::string& name, struct stat* st, int flags) {
  if (Fault(FileOp::kStat, {FilePathAt(dir_fd, name)}) != 0) return -1;
  return base_->StatAt(dir_fd, name, st, flags);
}

}  // namespace trainctl
