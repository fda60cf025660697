#include "common/safe_file.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <streambuf>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/random_secret.h"

namespace trainctl {
namespace {

constexpr char kErrnoPayload[] = "trainctl.dev/errno";

absl::Status ErrnoStatus(const std::string& message, int err) {
  absl::Status s(SafeFileCode(err), message);
  s.SetPayload(kErrnoPayload, absl::Cord(absl::StrCat(err)));
  return s;
}

// Splits "a/b/c" into ("a/b", "c"); "c" into (".", "c"); "/c" into ("/", "c").
std::pair<std::string, std::string> SplitPath(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

std::string RandomSuffix() { return absl::BytesToHexString(RandomBytes(8)); }

int OpenDir(FileEnv* env, const std::string& dir) {
  return env->OpenAt(AT_FDCWD, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

// Creates `name` in `dir_fd` without following a link and without touching
// an existing file: EEXIST when anything is there.
int CreateExclusive(FileEnv* env, int dir_fd, const std::string& name, mode_t mode) {
  int fd;
  do {
    fd = env->OpenAt(dir_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// write(2) all of `data`; 0 or the errno (a zero-byte write counts as ENOSPC).
int WriteAll(FileEnv* env, int fd, const char* data, size_t size) {
  size_t off = 0;
  while (off < size) {
    ssize_t n = env->Write(fd, data + off, size - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : ENOSPC;
    off += static_cast<size_t>(n);
  }
  return 0;
}

// Renames without replacing: renameat2(RENAME_NOREPLACE), or where the
// filesystem lacks it, link + unlink (link never replaces either).
int RenameNoReplace(FileEnv* env, int dir_fd, const std::string& from, const std::string& to) {
#ifdef RENAME_NOREPLACE
  if (env->RenameAt(dir_fd, from, dir_fd, to, RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return errno;
#endif
  if (env->LinkAt(dir_fd, from, dir_fd, to) != 0) return errno;
  env->UnlinkAt(dir_fd, from, 0);
  return 0;
}

}  // namespace

absl::StatusCode SafeFileCode(int err) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return absl::StatusCode::kResourceExhausted;
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::StatusCode::kPermissionDenied;
    case EEXIST:
      return absl::StatusCode::kAlreadyExists;
    case ENOENT:
    case ENOTDIR:
      return absl::StatusCode::kNotFound;
    default:
      return absl::StatusCode::kInternal;
  }
}

int SafeFileErrno(const absl::Status& status) {
  auto p = status.GetPayload(kErrnoPayload);
  int err = 0;
  if (!p.has_value() || !absl::SimpleAtoi(std::string(*p), &err)) return 0;
  return err;
}

// A std::streambuf over the writer's fd, buffered; the first failed write
// is kept in the writer (Commit reports it).
class SafeFileWriter::FdBuf : public std::streambuf {
 public:
  explicit FdBuf(SafeFileWriter* w) : w_(w) { setp(buf_, buf_ + sizeof buf_); }
  ~FdBuf() override = default;
  int sync() override { return Flush() ? 0 : -1; }

 protected:
  int_type overflow(int_type ch) override {
    if (!Flush()) return traits_type::eof();
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(ch);
      pbump(1);
    }
    return traits_type::not_eof(ch);
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (n >= static_cast<std::streamsize>(sizeof buf_)) {  // large pieces go straight through
      if (!Flush() || !w_->Append(absl::string_view(s, static_cast<size_t>(n))).ok()) return 0;
      return n;
    }
    return std::streambuf::xsputn(s, n);
  }

 private:
  bool Flush() {
    const size_t n = static_cast<size_t>(pptr() - pbase());
    setp(buf_, buf_ + sizeof buf_);
    return n == 0 || w_->Append(absl::string_view(buf_, n)).ok();
  }
  SafeFileWriter* w_;
  char buf_[1 << 16];
};

SafeFileWriter::SafeFileWriter(std::string path, SafeWriteOptions options)
    : path_(std::move(path)), options_(options), env_(FileEnv::Or(options.env)) {}

SafeFileWriter::~SafeFileWriter() { Abandon(); }

absl::Status SafeFileWriter::Error(const std::string& what, int err) const {
  return ErrnoStatus(absl::StrCat(what, " '", path_, "': ", std::strerror(err)), err);
}

void SafeFileWriter::Abandon() {
  stream_.reset();
  buf_.reset();
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    env_->UnlinkAt(dir_fd_, temp_name_, 0);
  }
  if (dir_fd_ >= 0) {
    ::close(dir_fd_);
    dir_fd_ = -1;
  }
}

absl::StatusOr<std::unique_ptr<SafeFileWriter>> SafeFileWriter::Create(
    const std::string& path, const SafeWriteOptions& options) {
  std::unique_ptr<SafeFileWriter> w(new SafeFileWriter(path, options));
  auto [dir, name] = SplitPath(path);
  if (name.empty() || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' does not name a file"));
  }
  w->name_ = name;
  w->dir_fd_ = OpenDir(w->env_, dir);
  if (w->dir_fd_ < 0) {
    const int e = errno;
    return ErrnoStatus(
        absl::StrCat("cannot open the directory of '", path, "': ", std::strerror(e)), e);
  }
  return CreateTemp(std::move(w), path.find('/') == std::string::npos ? "" : std::string(dir));
}

absl::StatusOr<std::unique_ptr<SafeFileWriter>> SafeFileWriter::CreateAt(
    int dir_fd, const std::string& name, const SafeWriteOptions& options) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a plain file name"));
  }
  std::unique_ptr<SafeFileWriter> w(new SafeFileWriter(name, options));
  w->name_ = name;
  w->dir_fd_ = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  if (w->dir_fd_ < 0) {
    const int e = errno;
    return ErrnoStatus(absl::StrCat("cannot use the directory of '", name, "': ", std::strerror(e)),
                       e);
  }
  return CreateTemp(std::move(w), "");
}

absl::StatusOr<std::unique_ptr<SafeFileWriter>> SafeFileWriter::CreateTemp(
    std::unique_ptr<SafeFileWriter> w, const std::string& dir) {
  // A random name: nobody can plant something there in advance; EEXIST
  // (a collision, or a guess) just takes another.
  int err = 0;
  for (int tries = 0; tries < 8; ++tries) {
    w->temp_name_ = absl::StrCat(w->name_, ".tmp.", RandomSuffix());
    w->fd_ = CreateExclusive(w->env_, w->dir_fd_, w->temp_name_, w->options_.mode);
    err = w->fd_ < 0 ? errno : 0;
    if (err != EEXIST) break;
  }
  w->temp_path_ =
      dir.empty() ? w->temp_name_ : absl::StrCat(dir == "/" ? "" : dir, "/", w->temp_name_);
  if (w->fd_ < 0) return w->Error("cannot create a file for", err);
  return w;
}

absl::Status SafeFileWriter::Append(absl::string_view data) {
  if (fd_ < 0)
    return absl::FailedPreconditionError(
        absl::StrCat("'", path_, "': already committed or abandoned"));
  if (write_errno_ != 0) return Error("writing", write_errno_);
  write_errno_ = WriteAll(env_, fd_, data.data(), data.size());
  if (write_errno_ != 0) return Error("writing", write_errno_);
  written_ += static_cast<int64_t>(data.size());
  return absl::OkStatus();
}

std::ostream& SafeFileWriter::stream() {
  if (stream_ == nullptr) {
    buf_ = std::make_unique<FdBuf>(this);
    stream_ = std::make_unique<std::ostream>(buf_.get());
  }
  return *stream_;
}

absl::Status SafeFileWriter::Commit() {
  if (fd_ < 0)
    return absl::FailedPreconditionError(
        absl::StrCat("'", path_, "': already committed or abandoned"));
  if (stream_ != nullptr) stream_->flush();
  absl::Status failed;
  if (write_errno_ != 0) {
    failed = Error("writing", write_errno_);
  } else if (stream_ != nullptr && !*stream_) {
    failed = absl::InternalError(absl::StrCat("writing '", path_, "' failed"));
  } else if (options_.sync && env_->Fsync(fd_) != 0) {
    failed = Error("fsync of", errno);
  }
  if (failed.ok()) {
    const int rc = ::close(fd_);  // NFS reports a failed write at close
    fd_ = -1;
    if (rc != 0) {
      failed = Error("closing", errno);
      env_->UnlinkAt(dir_fd_, temp_name_, 0);
    }
  }
  if (!failed.ok()) {
    Abandon();
    return failed;
  }
  int err = 0;
  if (options_.replace) {
    // rename replaces whatever is at the final name, a link included, and
    // never writes through it.
    if (env_->RenameAt(dir_fd_, temp_name_, dir_fd_, name_) != 0) err = errno;
  } else {
    err = RenameNoReplace(env_, dir_fd_, temp_name_, name_);
  }
  if (err != 0) {
    env_->UnlinkAt(dir_fd_, temp_name_, 0);
    Abandon();
    if (err == EEXIST) {
      return ErrnoStatus(absl::StrCat("'", path_, "' already exists (not overwritten)"), err);
    }
    return Error("renaming a new file into", err);
  }
  if (options_.sync && env_->Fsync(dir_fd_) != 0) {
    const int e = errno;
    Abandon();
    return ErrnoStatus(absl::StrCat("fsync of the directory of '", path_, "': ", std::strerror(e)),
                       e);
  }
  Abandon();
  return absl::OkStatus();
}

absl::Status WriteFileSafely(const std::string& path, absl::string_view contents,
                             const SafeWriteOptions& options) {
  absl::StatusOr<std::unique_ptr<SafeFileWriter>> w = SafeFileWriter::Create(path, options);
  if (!w.ok()) return w.status();
  if (absl::Status s = (*w)->Append(contents); !s.ok()) return s;
  return (*w)->Commit();
}

absl::Status WriteFileSafelyAt(int dir_fd, const std::string& name, absl::string_view contents,
                               const SafeWriteOptions& options) {
  absl::StatusOr<std::unique_ptr<SafeFileWriter>> w =
      SafeFileWriter::CreateAt(dir_fd, name, options);
  if (!w.ok()) return w.status();
  if (absl::Status s = (*w)->Append(contents); !s.ok()) return s;
  return (*w)->Commit();
}

absl::Status ProbeWritableDir(const std::string& dir, const std::string& name,
                              absl::string_view contents, FileEnv* env) {
  env = FileEnv::Or(env);
  const int dir_fd = OpenDir(env, dir);
  if (dir_fd < 0) {
    const int e = errno;
    return ErrnoStatus(absl::StrCat("cannot open directory '", dir, "': ", std::strerror(e)), e);
  }
  absl::Status s = ProbeWritableDirAt(dir_fd, dir, name, contents, env);
  ::close(dir_fd);
  return s;
}

absl::StatusOr<int> OpenOrMakeDirNoFollow(const std::string& path, mode_t mode, FileEnv* env) {
  env = FileEnv::Or(env);
  if (path.empty()) return ErrnoStatus("cannot open a directory with an empty name", EINVAL);
  // Components on the way are opened O_PATH: passing through needs search
  // permission only (a 0710 directory of another user's group), as a path
  // lookup would; the last is opened for reading.
  constexpr int kPassFlags = O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  constexpr int kLastFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  std::vector<std::string> parts;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (part != ".") parts.emplace_back(part);
  }
  int fd = env->OpenAt(AT_FDCWD, path[0] == '/' ? "/" : ".",
                       (parts.empty() ? O_RDONLY : O_PATH) | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    return ErrnoStatus(absl::StrCat("cannot open the start of '", path, "': ", std::strerror(e)),
                       e);
  }
  std::string walked = path[0] == '/' ? "" : ".";
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& name = parts[i];
    const int flags = i + 1 == parts.size() ? kLastFlags : kPassFlags;
    walked = absl::StrCat(walked, "/", name);
    int next = -1;
    int e = 0;
    if (name == "..") {
      e = EINVAL;
    } else {
      next = env->OpenAt(fd, name, flags);
      e = errno;
      if (next < 0 && e == ENOENT) {
        // Made here, or by someone else just now: either way opened
        // again without following a link.
        if (env->MkdirAt(fd, name, mode) == 0 || errno == EEXIST) {
          next = env->OpenAt(fd, name, flags);
          e = errno;
        } else {
          e = errno;
        }
      }
    }
    if (next < 0 && e == ENOTDIR) {
      // O_DIRECTORY|O_NOFOLLOW on a link says ENOTDIR: name it as a link.
      struct stat st {};
      if (env->StatAt(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) e = ELOOP;
    }
    ::close(fd);
    if (next < 0) {
      const char* why = e == ELOOP ? "a symbolic link (not followed)" : std::strerror(e);
      return ErrnoStatus(absl::StrCat("cannot open or make '", walked, "': ", why), e);
    }
    fd = next;
  }
  return fd;
}

absl::Status ProbeWritableDirAt(int dir_fd, const std::string& dir, const std::string& name,
                                absl::string_view contents, FileEnv* env) {
  env = FileEnv::Or(env);
  std::string probe = name;
  int fd = CreateExclusive(env, dir_fd, probe, 0600);
  // Something (maybe a planted link) holds the name: leave it, use another.
  for (int tries = 0; fd < 0 && errno == EEXIST && tries < 8; ++tries) {
    probe = absl::StrCat(name, ".", RandomSuffix());
    fd = CreateExclusive(env, dir_fd, probe, 0600);
  }
  if (fd < 0) {
    const int e = errno;
    return ErrnoStatus(absl::StrCat("cannot create a file in '", dir, "': ", std::strerror(e)), e);
  }
  const int err = WriteAll(env, fd, contents.data(), contents.size());
  ::close(fd);
  env->UnlinkAt(dir_fd, probe, 0);
  if (err != 0)
    return ErrnoStatus(absl::StrCat("cannot write a file in '", dir, "': ", std::strerror(err)),
                       err);
  return absl::OkStatus();
}

}  // namespace trainctl
