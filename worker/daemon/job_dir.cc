#include "worker/daemon/job_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/jobspec/artifact_names.h"
#include "common/safe_file.h"
#include "common/status_macros.h"
#include "worker/daemon/rank_files.h"

namespace trainctl::worker {
namespace {

constexpr char kClaimHeader[] = "trainctl checkpoint dir 1";
constexpr char kJobHeader[] = "trainctl job 1";
// Manifests are a few lines; anything larger is not one.
constexpr off_t kMaxManifestBytes = 4096;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void release() { fd_ = -1; }

 private:
  int fd_;
};

absl::Status Errno(const std::string& what, int err) {
  return absl::Status(
      err == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kFailedPrecondition,
      absl::StrCat(what, ": ", std::strerror(err)));
}

// A small regular file `name` in `dirfd`, not through a link; its stat in *st.
absl::StatusOr<std::string> ReadSmallFileAt(int dirfd, const std::string& name, struct stat* st) {
  Fd fd(::openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (const int e = errno; fd.get() < 0) return Errno(name, e);
  if (::fstat(fd.get(), st) != 0) {
    const int e = errno;
    return Errno(name, e);
  }
  if (!S_ISREG(st->st_mode) || st->st_size > kMaxManifestBytes) {
    return absl::DataLossError(
        absl::StrCat(name, ": not a trainctl manifest (not a small regular file)"));
  }
  std::string out(static_cast<size_t>(st->st_size), '\0');
  ssize_t n = ::pread(fd.get(), out.data(), out.size(), 0);
  if (const int e = errno; n < 0) return Errno(name, e);
  out.resize(static_cast<size_t>(n));
  return out;
}

// "key value" lines after `header`; values C-escaped. Nullopt when the
// header is not there.
std::optional<std::vector<std::pair<std::string, std::string>>> ParseManifest(
    const std::string& text, const char* header) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  if (lines.empty() || lines[0] != header) return std::nullopt;
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::pair<std::string, std::string> kv = absl::StrSplit(lines[i], absl::MaxSplits(' ', 1));
    std::string value;
    if (!absl::CUnescape(kv.second, &value)) return std::nullopt;
    out.emplace_back(kv.first, value);
  }
  return out;
}

std::string Manifest(const char* header,
                     const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string out = absl::StrCat(header, "\n");
  for (const auto& [k, v] : fields) absl::StrAppend(&out, k, " ", absl::CEscape(v), "\n");
  return out;
}

std::string Field(const std::vector<std::pair<std::string, std::string>>& fields,
                  const std::string& key) {
  for (const auto& [k, v] : fields) {
    if (k == key) return v;
  }
  return "";
}

int OpenDir(const std::string& dir) {
  return ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

}  // namespace

// 0600, created without following links in the checked directory, whole or
// not at all (common/safe_file.h).
absl::Status WriteFileAt(int dirfd, const std::string& name, const std::string& content,
                         bool replace, FileEnv* env) {
  SafeWriteOptions options = PrivateFile(replace);
  options.env = env;
  return WriteFileSafelyAt(dirfd, name, content, options);
}

absl::StatusOr<std::optional<DirClaim>> ReadDirClaimAt(int dirfd, const ManifestWriters& writers) {
  struct stat st {};
  absl::StatusOr<std::string> text = ReadSmallFileAt(dirfd, kDirManifestName, &st);
  if (absl::IsNotFound(text.status())) return std::nullopt;
  if (!text.ok()) return text.status();
  if (!writers.Trusts(st.st_uid)) {
    return absl::DataLossError(
        absl::StrCat(kDirManifestName, ": written by uid ", st.st_uid,
                     ", neither this worker's user nor one it runs ranks as"));
  }
  auto fields = ParseManifest(*text, kClaimHeader);
  if (!fields)
    return absl::DataLossError(absl::StrCat(kDirManifestName, ": not a trainctl directory claim"));
  return DirClaim{Field(*fields, "owner"), Field(*fields, "job")};
}

absl::StatusOr<std::optional<DirClaim>> ReadDirClaim(const std::string& dir,
                                                     const ManifestWriters& writers) {
  Fd dfd(OpenDir(dir));
  if (const int e = errno; dfd.get() < 0) {
    if (e == ENOENT) return std::nullopt;  // nobody claimed what does not exist
    return Errno(dir, e);
  }
  return ReadDirClaimAt(dfd.get(), writers);
}

absl::Status CheckDirClaim(const std::string& dir, const DirClaim& claim, const std::string& owner,
                           const std::string& resume_owner) {
  if (claim.owner.empty() || claim.owner == owner ||
      (!resume_owner.empty() && claim.owner == resume_owner)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("checkpoint.dir ", dir, " belongs to '", claim.owner, "' (claimed by job ",
                   claim.job_id, "); a job of '", owner,
                   "' may not write there: use a directory of your own, or resume a job of '",
                   claim.owner, "' (resume_from) with a token allowed to"));
}

absl::StatusOr<int> OpenCheckpointDir(const std::string& dir, const std::string& owner,
                                      const std::string& resume_owner,
                                      const ManifestWriters& writers, bool as_rank_user, int* err,
                                      FileEnv* env) {
  const char* const as = as_rank_user ? " as the rank user" : "";
  auto failed = [&](const char* what, const absl::Status& s) {
    const int e = SafeFileErrno(s);
    if (err != nullptr) *err = e;
    const std::string why = e != 0 && e != ELOOP ? std::strerror(e) : std::string(s.message());
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint.dir ", dir, ": ", what, as, " (", why, ")"));
  };
  absl::StatusOr<int> opened = OpenOrMakeDirNoFollow(dir, 0777, env);
  if (!opened.ok()) return failed("cannot be created", opened.status());
  Fd dfd(*opened);
  // The probe first: only a directory this identity can write in is
  // claimed, and no claim is read from one it cannot.
  if (absl::Status probe = ProbeWritableDirAt(dfd.get(), dir, ".trainctl-claim-probe", "", env);
      !probe.ok()) {
    return failed("not writable", probe);
  }
  absl::StatusOr<std::optional<DirClaim>> claim = ReadDirClaimAt(dfd.get(), writers);
  if (!claim.ok())
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint.dir ", dir, ": ", claim.status().message()));
  if (claim->has_value())
    TRAINCTL_RETURN_IF_ERROR(CheckDirClaim(dir, **claim, owner, resume_owner));
  const int fd = dfd.get();
  dfd.release();
  return fd;
}

namespace {

// ClaimCheckpointDir with the calling thread's identity.
absl::Status ClaimHere(const std::string& dir, const std::string& job_id, const std::string& owner,
                       const std::string& resume_owner, const ManifestWriters& writers,
                       bool as_rank_user, FileEnv* env) {
  absl::StatusOr<int> opened =
      OpenCheckpointDir(dir, owner, resume_owner, writers, as_rank_user, nullptr, env);
  if (!opened.ok()) return opened.status();
  Fd dfd(*opened);
  absl::StatusOr<std::optional<DirClaim>> claim = ReadDirClaimAt(dfd.get(), writers);
  if (claim.ok() && !claim->has_value()) {
    absl::Status w = WriteFileAt(dfd.get(), kDirManifestName,
                                 Manifest(kClaimHeader, {{"owner", owner}, {"job", job_id}}),
                                 /*replace=*/false, env);
    if (!w.ok() && !absl::IsAlreadyExists(w)) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint.dir ", dir, ": ", w.message()));
    }
    // Claimed now, by this job or (a race lost) by another: read who.
    claim = ReadDirClaimAt(dfd.get(), writers);
    if (claim.ok() && !claim->has_value())
      claim = absl::DataLossError("its claim cannot be read back");
  }
  if (!claim.ok())
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint.dir ", dir, ": ", claim.status().message()));
  if (absl::Status s = CheckDirClaim(dir, **claim, owner, resume_owner); !s.ok()) return s;
  if (CheckJobManifestAt(dfd.get(), job_id, writers).ok()) return absl::OkStatus();
  absl::Status w =
      WriteFileAt(dfd.get(), JobManifestName(job_id),
                  Manifest(kJobHeader, {{"job", job_id}, {"owner", owner}}), /*replace=*/true, env);
  if (!w.ok())
    return absl::FailedPreconditionError(absl::StrCat("checkpoint.dir ", dir, ": ", w.message()));
  return absl::OkStatus();
}

}  // namespace

absl::Status ClaimCheckpointDir(const std::string& dir, const std::string& job_id,
                                const std::string& owner, const std::string& resume_owner,
                                const std::optional<RunAs>& made_as, const ManifestWriters& writers,
                                FileEnv* env) {
  AsRankUser as_rank_user(made_as);
  if (!as_rank_user.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint.dir ", dir, ": cannot take on the ranks' identity to make it"));
  }
  // What the ranks' user writes here is trusted back, whatever the caller said.
  ManifestWriters trusted = writers;
  if (made_as.has_value() && !trusted.Trusts(made_as->uid)) trusted.rank_user = made_as->uid;
  return ClaimHere(dir, job_id, owner, resume_owner, trusted, made_as.has_value(), env);
}

absl::Status CheckJobManifestAt(int dirfd, const std::string& job_id,
                                const ManifestWriters& writers) {
  struct stat st {};
  absl::StatusOr<std::string> text = ReadSmallFileAt(dirfd, JobManifestName(job_id), &st);
  if (!text.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no manifest of job ", job_id, " in this directory (", text.status().message(), ")"));
  }
  if (!writers.Trusts(st.st_uid)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the manifest of job ", job_id, " was written by uid ", st.st_uid,
                     ", neither this worker's user nor one it runs ranks as"));
  }
  auto fields = ParseManifest(*text, kJobHeader);
  if (!fields || Field(*fields, "job") != job_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("the manifest ", JobManifestName(job_id), " does not name job ", job_id));
  }
  return absl::OkStatus();
}

std::optional<std::string> JobArtifactReport(const std::string& reported, const std::string& job_id,
                                             const std::string& dir, const std::string& named_dir,
                                             bool final_model) {
  const size_t slash = reported.rfind('/');
  if (slash == std::string::npos || slash == 0 || dir.empty()) return std::nullopt;
  const std::string parent = reported.substr(0, slash);
  const std::string name = reported.substr(slash + 1);
  const bool named =
      final_model ? IsFinalModelFileName(job_id, name) : IsCheckpointFileName(job_id, name);
  if (!named || (parent != dir && parent != named_dir)) return std::nullopt;
  return absl::StrCat(named_dir.empty() ? dir : named_dir, "/", name);
}

}  // namespace trainctl::worker
