#include "common/codepack/code_pack.h"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/codepack/ignore_rules.h"
#include "common/format_bytes.h"
#include "common/safe_file.h"
#include "common/status_macros.h"

namespace trainctl::codepack {
namespace {

constexpr size_t kBlock = 512;
constexpr size_t kIoBuffer = size_t{1} << 20;

std::string Errno(int err) { return std::strerror(err); }

// --- the walk ---------------------------------------------------------------------

struct Entry {
  std::string name;    // relative to the root, '/'-separated, no trailing '/'
  std::string source;  // the path to read (through in-tree links)
  bool is_dir = false;
  bool executable = false;
  int64_t size = 0;
};

class Walker {
 public:
  Walker(std::string root, std::string root_real)
      : root_(std::move(root)), root_real_(std::move(root_real)) {}

  absl::Status Walk(const std::string& dir_path, const std::string& rel,
                    std::vector<IgnoreFile> ignores, std::set<std::pair<dev_t, ino_t>> ancestors) {
    struct stat dir_st;
    if (stat(dir_path.c_str(), &dir_st) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(dir_path, ": ", Errno(errno)));
    }
    if (!ancestors.insert({dir_st.st_dev, dir_st.st_ino}).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir_path,
          ": a symlink loop (the directory contains itself); remove the link or ignore it"));
    }
    for (const char* ignore_name : {".gitignore", ".trainctlignore"}) {
      const std::string path = absl::StrCat(dir_path, "/", ignore_name);
      struct stat st;
      if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      std::ifstream in(path, std::ios::binary);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (in.bad()) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read"));
      ignores.push_back(IgnoreFile{rel, ParseIgnore(text)});
    }
    TRAINCTL_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(dir_path));
    for (const std::string& name : names) {
      const std::string path = absl::StrCat(dir_path, "/", name);
      const std::string child_rel = rel.empty() ? name : absl::StrCat(rel, "/", name);
      struct stat lst;
      if (lstat(path.c_str(), &lst) != 0)
        return absl::InvalidArgumentError(absl::StrCat(path, ": ", Errno(errno)));
      struct stat st = lst;
      if (S_ISLNK(lst.st_mode)) {
        // An ignored link is never followed (git sees a link as a file).
        if (AlwaysSkipped(name, false) || Ignored(ignores, child_rel, false)) continue;
        TRAINCTL_ASSIGN_OR_RETURN(st, FollowLink(path));
      }
      const bool is_dir = S_ISDIR(st.st_mode);
      if (AlwaysSkipped(name, is_dir) || Ignored(ignores, child_rel, is_dir)) continue;
      if (is_dir) {
        entries_.push_back(Entry{child_rel, path, true, false, 0});
        TRAINCTL_RETURN_IF_ERROR(Walk(path, child_rel, ignores, ancestors));
      } else if (S_ISREG(st.st_mode)) {
        entries_.push_back(Entry{child_rel, path, false, (st.st_mode & S_IXUSR) != 0,
                                 static_cast<int64_t>(st.st_size)});
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": a ",
                         S_ISSOCK(st.st_mode)   ? "socket"
                         : S_ISFIFO(st.st_mode) ? "FIFO"
                                                : "device",
                         " cannot be packed; remove it or list it in .trainctlignore"));
      }
    }
    return absl::OkStatus();
  }

  std::vector<Entry>& entries() { return entries_; }

 private:
  static absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir_path) {
    std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(dir_path.c_str()), closedir);
    if (d == nullptr) return absl::InvalidArgumentError(absl::StrCat(dir_path, ": ", Errno(errno)));
    std::vector<std::string> names;
    errno = 0;
    while (const dirent* e = readdir(d.get())) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    if (errno != 0) return absl::InvalidArgumentError(absl::StrCat(dir_path, ": ", Errno(errno)));
    std::sort(names.begin(), names.end());
    return names;
  }

  // The stat of what the link at `path` names, when that lies inside the root.
  absl::StatusOr<struct stat> FollowLink(const std::string& path) const {
    char target[PATH_MAX + 1];
    const ssize_t n = readlink(path.c_str(), target, PATH_MAX);
    const std::string target_text = n >= 0 ? std::string(target, static_cast<size_t>(n)) : "?";
    std::unique_ptr<char, void (*)(void*)> real(realpath(path.c_str(), nullptr), std::free);
    if (real == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("symlink ", path, " -> ", target_text, ": ",
                                                     Errno(errno),
                                                     "; remove it or list it in .trainctlignore"));
    }
    const std::string resolved = real.get();
    if (resolved != root_real_ &&
        !absl::StartsWith(resolved, root_real_ == "/" ? "/" : root_real_ + "/")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "symlink ", path, " -> ", target_text, " points outside ", root_, " (", resolved,
          "): only links inside the packed directory are followed; copy the target in, list the "
          "link in "
          ".trainctlignore, or use --no-upload with a shared directory"));
    }
    struct stat st;
    if (stat(resolved.c_str(), &st) != 0)
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", Errno(errno)));
    return st;
  }

  std::string root_;
  std::string root_real_;
  std::vector<Entry> entries_;
};

// --- ustar ----------------------------------------------------------------------------

// `value` as `width - 1` octal digits and a NUL.
void PutOctal(char* field, size_t width, uint64_t value) {
  for (size_t i = width - 1; i-- > 0;) {
    field[i] = static_cast<char>('0' + (value & 7));
    value >>= 3;
  }
  field[width - 1] = '\0';
}

unsigned HeaderChecksum(const char* block) {
  unsigned sum = 0;
  for (size_t i = 0; i < kBlock; ++i) {
    sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(block[i]);
  }
  return sum;
}

// Splits `name` into ustar's prefix (<= 155) and name (<= 100) at a '/'.
absl::StatusOr<std::pair<std::string, std::string>> SplitName(const std::string& name) {
  if (name.size() <= 100) return std::make_pair(std::string(), name);
  for (size_t slash = name.find('/'); slash != std::string::npos;
       slash = name.find('/', slash + 1)) {
    if (slash <= 155 && name.size() - slash - 1 <= 100 && slash + 1 < name.size()) {
      return std::make_pair(name.substr(0, slash), name.substr(slash + 1));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      name,
      ": the path is too long for the archive (ustar holds up to 255 bytes, split at a '/' into "
      "at most 155 + 100); shorten it or list it in .trainctlignore"));
}

absl::StatusOr<std::string> Header(const Entry& e) {
  TRAINCTL_ASSIGN_OR_RETURN(auto split, SplitName(e.name));
  // A directory's name ends in '/' (as tar writes it) where the field has
  // room; typeflag '5' says it is one either way.
  if (e.is_dir && split.second.size() < 100) split.second += '/';
  std::string block(kBlock, '\0');
  char* h = block.data();
  std::memcpy(h, split.second.data(), split.second.size());
  PutOctal(h + 100, 8, e.is_dir || e.executable ? 0755 : 0644);
  PutOctal(h + 108, 8, 0);  // uid
  PutOctal(h + 116, 8, 0);  // gid
  PutOctal(h + 124, 12, static_cast<uint64_t>(e.size));
  PutOctal(h + 136, 12, 0);  // mtime
  h[156] = e.is_dir ? '5' : '0';
  std::memcpy(h + 257, "ustar", 6);  // with its NUL
  std::memcpy(h + 263, "00", 2);
  PutOctal(h + 329, 8, 0);  // devmajor
  PutOctal(h + 337, 8, 0);  // devminor
  std::memcpy(h + 345, split.first.data(), split.first.size());
  PutOctal(h + 148, 7, HeaderChecksum(h));  // six digits, NUL
  h[155] = ' ';
  return block;
}

int64_t Padded(int64_t size) {
  return (size + int64_t{kBlock} - 1) / int64_t{kBlock} * int64_t{kBlock};
}

// Streaming SHA-256.
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
    if (ctx_ == nullptr || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1) std::abort();
  }
  void Update(absl::string_view data) {
    if (EVP_DigestUpdate(ctx_.get(), data.data(), data.size()) != 1) std::abort();
  }
  std::string Digest() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), md, &len) != 1) std::abort();
    return absl::StrCat(
        "sha256:", absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(md), len)));
  }

 private:
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx_;
};

// Writes through a SafeFileWriter and hashes what it writes.
class ArchiveOut {
 public:
  explicit ArchiveOut(SafeFileWriter* writer) : writer_(writer) {}
  absl::Status Write(absl::string_view data) {
    sha_.Update(data);
    return writer_->Append(data);
  }
  std::string Digest() { return sha_.Digest(); }

 private:
  SafeFileWriter* writer_;
  Sha256 sha_;
};

// A file's `size` bytes (as the walk saw it) and its padding.
absl::Status CopyFile(const Entry& e, ArchiveOut& out, std::string& buffer) {
  const int fd = open(e.source.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::InvalidArgumentError(absl::StrCat(e.source, ": ", Errno(errno)));
  std::unique_ptr<int, void (*)(int*)> closer(new int(fd), [](int* p) {
    close(*p);
    delete p;
  });
  int64_t left = e.size;
  while (left > 0) {
    const ssize_t n = read(fd, buffer.data(),
                           static_cast<size_t>(std::min<int64_t>(left, int64_t(buffer.size()))));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat(e.source, ": ", Errno(errno)));
    if (n == 0) break;
    TRAINCTL_RETURN_IF_ERROR(out.Write(absl::string_view(buffer.data(), static_cast<size_t>(n))));
    left -= n;
  }
  char extra;
  if (left != 0 || read(fd, &extra, 1) != 0) {
    return absl::AbortedError(
        absl::StrCat(e.source, ": the file changed size while it was packed; try again"));
  }
  return out.Write(std::string(static_cast<size_t>(Padded(e.size) - e.size), '\0'));
}

std::string Quoted(absl::string_view name) {
  return absl::StrCat("\"", absl::CHexEscape(name), "\"");
}

}  // namespace

absl::StatusOr<PackedCode> PackDirectory(const std::string& dir, const std::string& archive_path,
                                         const PackOptions& options) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0)
    return absl::InvalidArgumentError(absl::StrCat(dir, ": ", Errno(errno)));
  if (!S_ISDIR(st.st_mode))
    return absl::InvalidArgumentError(absl::StrCat(dir, ": not a directory"));
  std::unique_ptr<char, void (*)(void*)> real(realpath(dir.c_str(), nullptr), std::free);
  if (real == nullptr) return absl::InvalidArgumentError(absl::StrCat(dir, ": ", Errno(errno)));

  Walker walker(dir, real.get());
  TRAINCTL_RETURN_IF_ERROR(walker.Walk(dir, "", {}, {}));
  std::vector<Entry>& entries = walker.entries();
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.name < b.name; });

  PackedCode packed;
  int64_t total = 2 * int64_t{kBlock};  // the end-of-archive marker
  for (const Entry& e : entries) {
    total += int64_t{kBlock} + Padded(e.size);
    if (!e.is_dir) ++packed.files;
  }
  if (total > options.max_bytes) {
    std::vector<const Entry*> files;
    for (const Entry& e : entries) {
      if (!e.is_dir) files.push_back(&e);
    }
    const size_t shown = std::min<size_t>(3, files.size());
    std::partial_sort(files.begin(), files.begin() + static_cast<ptrdiff_t>(shown), files.end(),
                      [](const Entry* a, const Entry* b) { return a->size > b->size; });
    std::vector<std::string> biggest;
    for (size_t i = 0; i < shown; ++i) {
      biggest.push_back(absl::StrCat(files[i]->name, " (", FormatBytes(files[i]->size), ")"));
    }
    return absl::ResourceExhaustedError(
        absl::StrCat(dir, ": the code archive would be ", FormatBytes(total), " (", packed.files,
                     " files), over the limit of ", FormatBytes(options.max_bytes),
                     "; the biggest files: ", absl::StrJoin(biggest, ", "),
                     ". List what the job does not need in .trainctlignore (or .gitignore)"));
  }

  TRAINCTL_ASSIGN_OR_RETURN(std::unique_ptr<SafeFileWriter> writer,
                            SafeFileWriter::Create(archive_path));
  ArchiveOut out(writer.get());
  std::string buffer(kIoBuffer, '\0');
  for (const Entry& e : entries) {
    TRAINCTL_ASSIGN_OR_RETURN(std::string header, Header(e));
    TRAINCTL_RETURN_IF_ERROR(out.Write(header));
    if (!e.is_dir) TRAINCTL_RETURN_IF_ERROR(CopyFile(e, out, buffer));
  }
  TRAINCTL_RETURN_IF_ERROR(out.Write(std::string(2 * kBlock, '\0')));
  TRAINCTL_RETURN_IF_ERROR(writer->Commit());
  packed.digest = out.Digest();
  packed.size_bytes = total;
  return packed;
}

// --- unpacking --------------------------------------------------------------------------

namespace {

// A NUL-terminated (or full) fixed-width field.
std::string Field(const char* block, size_t offset, size_t width) {
  const char* p = block + offset;
  return std::string(p, strnlen(p, width));
}

// An octal field (spaces and NULs around the digits allowed); nullopt when
// it is not one (GNU's base-256 included).
std::optional<uint64_t> ParseOctal(const char* block, size_t offset, size_t width) {
  const char* p = block + offset;
  size_t i = 0;
  while (i < width && p[i] == ' ') ++i;
  uint64_t v = 0;
  size_t digits = 0;
  for (; i < width && p[i] >= '0' && p[i] <= '7'; ++i, ++digits) {
    if (v > (uint64_t{1} << 60)) return std::nullopt;
    v = v * 8 + static_cast<uint64_t>(p[i] - '0');
  }
  for (; i < width; ++i) {
    if (p[i] != ' ' && p[i] != '\0') return std::nullopt;
  }
  if (digits == 0) return std::nullopt;
  return v;
}

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  int get() const { return fd_; }
  void reset(int fd) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// Reads exactly `n` bytes; false at end of file (or short).
absl::StatusOr<bool> ReadFull(int fd, char* buf, size_t n, const std::string& path) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return absl::DataLossError(absl::StrCat(path, ": ", Errno(errno)));
    if (r == 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

namespace {

// UnpackArchive's work on an open archive; `archive_path` names it in errors.
absl::Status UnpackFrom(int in_fd, const std::string& archive_path, const std::string& dest_dir,
                        const UnpackOptions& options) {
  FileEnv* const env = FileEnv::Or(options.env);
  FdCloser dest(env->OpenAt(AT_FDCWD, dest_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dest.get() < 0) return absl::InvalidArgumentError(absl::StrCat(dest_dir, ": ", Errno(errno)));
  {
    std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(dest_dir.c_str()), closedir);
    if (d == nullptr) return absl::InvalidArgumentError(absl::StrCat(dest_dir, ": ", Errno(errno)));
    while (const dirent* e = readdir(d.get())) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat(dest_dir, ": not empty (unpacking needs an empty directory)"));
      }
    }
  }

  auto loss = [&](const std::string& entry, const std::string& why) {
    return absl::DataLossError(absl::StrCat(archive_path, ": entry ", Quoted(entry), ": ", why));
  };
  int64_t total = 0;
  int64_t index = 0;
  std::string buffer(kIoBuffer, '\0');
  char block[kBlock];
  while (true) {
    TRAINCTL_ASSIGN_OR_RETURN(bool have, ReadFull(in_fd, block, kBlock, archive_path));
    if (!have) {
      return absl::DataLossError(absl::StrCat(archive_path, ": truncated (it ends after ", index,
                                              " entries without the end-of-archive marker)"));
    }
    if (std::all_of(block, block + kBlock, [](char c) { return c == '\0'; })) break;
    ++index;
    const std::string prefix = Field(block, 345, 155);
    const std::string short_name = Field(block, 0, 100);
    const std::string name = prefix.empty() ? short_name : absl::StrCat(prefix, "/", short_name);
    const std::optional<uint64_t> checksum = ParseOctal(block, 148, 8);
    if (!checksum.has_value() || *checksum != HeaderChecksum(block)) {
      return loss(name, absl::StrCat("header ", index,
                                     ": bad checksum (not a tar archive, or a damaged one)"));
    }
    if (std::memcmp(block + 257, "ustar", 5) != 0) return loss(name, "not a ustar header");
    const char type = block[156];
    const bool is_dir = type == '5';
    if (type != '0' && type != '\0' && !is_dir) {
      const char* what = type == '2'   ? "a symlink"
                         : type == '1' ? "a hard link"
                                       : "not a regular file or directory";
      return loss(name, absl::StrCat("type '", absl::CHexEscape(std::string(1, type)), "' is ",
                                     what, " (only regular files and directories are unpacked)"));
    }
    const std::optional<uint64_t> size = ParseOctal(block, 124, 12);
    const std::optional<uint64_t> mode = ParseOctal(block, 100, 8);
    if (!size.has_value() || !mode.has_value()) return loss(name, "bad size or mode field");
    if (is_dir && *size != 0) return loss(name, "a directory with data");
    if (name.empty()) return loss(name, "empty name");
    if (name[0] == '/') return loss(name, "an absolute name");
    std::vector<std::string> parts;
    for (absl::string_view part : absl::StrSplit(name, '/', absl::SkipEmpty())) {
      if (part == "..")
        return loss(name, "a '..' component (it would write outside the directory)");
      if (part != ".") parts.emplace_back(part);
    }
    if (parts.empty()) {
      if (is_dir) continue;  // "./": the root itself
      return loss(name, "no file name");
    }
    if (static_cast<int64_t>(*size) > options.max_bytes - total) {
      return absl::ResourceExhaustedError(absl::StrCat(archive_path, ": entry ", Quoted(name),
                                                       ": the files would be over the limit of ",
                                                       FormatBytes(options.max_bytes)));
    }
    total += static_cast<int64_t>(*size);

    // Every directory is opened relative to its parent without following a
    // link, so nothing lands outside dest_dir whatever the archive holds.
    FdCloser parent(dup(dest.get()));
    const size_t dirs = is_dir ? parts.size() : parts.size() - 1;
    for (size_t i = 0; i < dirs; ++i) {
      if (env->MkdirAt(parent.get(), parts[i], 0755) != 0 && errno != EEXIST) {
        // The disk's fault, not the archive's: its class (a full disk, a
        // refused directory), naming where.
        const int e = errno;
        return absl::Status(SafeFileCode(e), absl::StrCat(dest_dir, ": making the directory of ",
                                                          name, ": ", Errno(e)));
      }
      const int next =
          env->OpenAt(parent.get(), parts[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (next < 0)
        return loss(name, absl::StrCat(parts[i], ": not a directory (", Errno(errno), ")"));
      if (i + 1 == dirs && is_dir && fchmod(next, 0755) != 0) {
        close(next);
        return loss(name, absl::StrCat("chmod: ", Errno(errno)));
      }
      parent.reset(next);
    }
    if (is_dir) continue;
    const mode_t file_mode = (*mode & 0100) != 0 ? 0755 : 0644;
    FdCloser file(env->OpenAt(parent.get(), parts.back(),
                              O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, file_mode));
    if (file.get() < 0) {
      if (errno == EEXIST) return loss(name, "a second entry of that name");
      const int e = errno;
      return absl::Status(SafeFileCode(e),
                          absl::StrCat(dest_dir, ": creating ", name, ": ", Errno(e)));
    }
    if (fchmod(file.get(), file_mode) != 0)
      return loss(name, absl::StrCat("chmod: ", Errno(errno)));
    int64_t left = static_cast<int64_t>(*size);
    int64_t pad = Padded(left) - left;
    while (left > 0) {
      const size_t n =
          static_cast<size_t>(std::min<int64_t>(left, static_cast<int64_t>(buffer.size())));
      TRAINCTL_ASSIGN_OR_RETURN(bool got, ReadFull(in_fd, buffer.data(), n, archive_path));
      if (!got) return loss(name, "truncated (the archive ends inside its data)");
      for (size_t off = 0; off < n;) {
        const ssize_t w = env->Write(file.get(), buffer.data() + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
          return absl::Status(SafeFileCode(errno),
                              absl::StrCat(dest_dir, ": writing ", name, ": ", Errno(errno)));
        }
        off += static_cast<size_t>(w);
      }
      left -= static_cast<int64_t>(n);
    }
    if (pad > 0) {
      TRAINCTL_ASSIGN_OR_RETURN(
          bool got, ReadFull(in_fd, buffer.data(), static_cast<size_t>(pad), archive_path));
      if (!got) return loss(name, "truncated (the archive ends inside its padding)");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status UnpackArchive(const std::string& archive_path, const std::string& dest_dir,
                           const UnpackOptions& options) {
  FdCloser in(open(archive_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.get() < 0) return absl::NotFoundError(absl::StrCat(archive_path, ": ", Errno(errno)));
  return UnpackFrom(in.get(), archive_path, dest_dir, options);
}

absl::Status UnpackArchiveFd(int fd, const std::string& dest_dir, const UnpackOptions& options) {
  return UnpackFrom(fd, "the code archive", dest_dir, options);
}

absl::StatusOr<std::string> FileDigest(const std::string& path) {
  FdCloser fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    return absl::Status(
        errno == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kInvalidArgument,
        absl::StrCat(path, ": ", Errno(errno)));
  }
  Sha256 sha;
  std::string buffer(kIoBuffer, '\0');
  while (true) {
    const ssize_t n = read(fd.get(), buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat(path, ": ", Errno(errno)));
    if (n == 0) break;
    sha.Update(absl::string_view(buffer.data(), static_cast<size_t>(n)));
  }
  return sha.Digest();
}

}  // namespace trainctl::codepack
