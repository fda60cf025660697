#include "worker/daemon/rank_files.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/log.h"

namespace trainctl::worker {
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// mkdir `path` (mode 0700 whatever the umask lets through: the owner and
// mode are set after), then opens it without following a link.
absl::StatusOr<int> MakeAndOpen(FileEnv* env, const std::string& path) {
  if (env->MkdirAt(AT_FDCWD, path, 0700) != 0 && errno != EEXIST)
    return Errno("cannot create", path);
  const int fd = env->OpenAt(AT_FDCWD, path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    return errno == ELOOP || errno == ENOTDIR
               ? absl::FailedPreconditionError(absl::StrCat(path, ": not a directory (a link?)"))
               : Errno("cannot open", path);
  }
  return fd;
}

// Gives the open directory `fd` its owner and mode.
absl::Status Own(int fd, const std::string& path, uid_t uid, gid_t gid, mode_t mode) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Errno("cannot stat", path);
  if ((st.st_uid != uid || st.st_gid != gid) && ::fchown(fd, uid, gid) != 0)
    return Errno("cannot chown", path);
  if ((st.st_mode & 07777) != mode && ::fchmod(fd, mode) != 0) return Errno("cannot chmod", path);
  return absl::OkStatus();
}

// A file of the daemon's in the work dir: 0600 (never following a link).
absl::Status PrivateFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return errno == ENOENT ? absl::OkStatus() : Errno("cannot open", path);
  struct stat st {};
  absl::Status s = absl::OkStatus();
  if (::fstat(fd, &st) != 0) {
    s = Errno("cannot stat", path);
  } else if (S_ISREG(st.st_mode) && (st.st_mode & 077) != 0 && ::fchmod(fd, 0600) != 0) {
    s = Errno("cannot chmod", path);
  }
  ::close(fd);
  return s;
}

// Whether this process may hand files to another user at all.
bool Privileged() { return ::geteuid() == 0; }

}  // namespace

absl::StatusOr<RankUidRange> ParseRankUids(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, '-');
  uint32_t first = 0, last = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &first) ||
      !absl::SimpleAtoi(parts[1], &last)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank-uids: '", text, "' is not FIRST-LAST (e.g. 61000-61999)"));
  }
  if (first < 1 || last < first || last >= (1u << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank-uids: ", text,
                     ": needs 1 <= FIRST <= LAST < 2147483648 (root's 0 is never a rank's)"));
  }
  if (last - first >= 65536) {
    return absl::InvalidArgumentError(absl::StrCat("--rank-uids: ", text, ": ", last - first + 1,
                                                   " ids; at most 65536 (one per job owner)"));
  }
  return RankUidRange{first, last};
}

absl::Status CheckRankUidsUnused(const RankUidRange& range) {
  auto in_range = [&](uint32_t id) { return id >= range.first && id <= range.last; };
  std::string taken;
  ::setpwent();
  while (const passwd* pw = ::getpwent()) {
    if (in_range(pw->pw_uid)) {
      taken = absl::StrCat("user ", pw->pw_name, " has uid ", pw->pw_uid);
      break;
    }
  }
  ::endpwent();
  if (taken.empty()) {
    ::setgrent();
    while (const group* gr = ::getgrent()) {
      if (in_range(gr->gr_gid)) {
        taken = absl::StrCat("group ", gr->gr_name, " has gid ", gr->gr_gid);
        break;
      }
    }
    ::endgrent();
  }
  if (taken.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("--rank-uids ", range.first, "-", range.last, ": ", taken,
                   " on this host; choose ids no user or group has"));
}

absl::StatusOr<RunAs> OwnerIdentity(const RankUidRange& range, int64_t owner_number,
                                    const RunAs& rank_user, const std::string& homes_dir) {
  if (owner_number <= 0) {
    return absl::FailedPreconditionError(
        "this worker runs each job owner's ranks as a uid of their own (--rank-uids) and the "
        "coordinator "
        "sent no owner number (a coordinator older than the worker, or its store failed: see its "
        "log)");
  }
  const int64_t size = static_cast<int64_t>(range.last) - range.first + 1;
  if (owner_number > size) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job's owner is number ", owner_number, " and --rank-uids ", range.first,
                     "-", range.last, " has ", size, " ids: widen the range on this worker"));
  }
  RunAs r;
  r.uid = static_cast<uid_t>(range.first + owner_number - 1);
  r.gid = static_cast<gid_t>(r.uid);
  r.name = absl::StrCat("trainctl-", r.uid);
  r.home = absl::StrCat(homes_dir, "/", r.uid);
  r.groups.push_back(r.gid);
  for (gid_t g : rank_user.groups) {
    if (g != r.gid) r.groups.push_back(g);
  }
  return r;
}

absl::Status MakeDaemonDir(const std::string& path, const std::optional<RunAs>& rank_user,
                           FileEnv* env) {
  absl::StatusOr<int> fd = MakeAndOpen(FileEnv::Or(env), path);
  if (!fd.ok()) return fd.status();
  struct stat st {};
  absl::Status s = absl::OkStatus();
  if (::fstat(*fd, &st) != 0) {
    s = Errno("cannot stat", path);
  } else if (st.st_uid != ::geteuid()) {
    // The rank user (or anyone else) must not own a directory the daemon
    // writes its files in.
    s = absl::FailedPreconditionError(absl::StrCat(
        path, ": owned by uid ", st.st_uid, ", not by this daemon's user (uid ", ::geteuid(), ")"));
  } else {
    s = rank_user.has_value() ? Own(*fd, path, ::geteuid(), rank_user->gid, 0710)
                              : Own(*fd, path, st.st_uid, st.st_gid, 0700);
  }
  ::close(*fd);
  return s;
}

absl::Status MakeRankDir(const std::string& path, const std::optional<RunAs>& rank_user,
                         FileEnv* env) {
  absl::StatusOr<int> fd = MakeAndOpen(FileEnv::Or(env), path);
  if (!fd.ok()) return fd.status();
  struct stat st {};
  absl::Status s = absl::OkStatus();
  if (::fstat(*fd, &st) != 0) {
    s = Errno("cannot stat", path);
  } else {
    s = rank_user.has_value() ? Own(*fd, path, rank_user->uid, rank_user->gid, 0700)
                              : Own(*fd, path, st.st_uid, st.st_gid, 0700);
  }
  ::close(*fd);
  return s;
}

absl::Status SecureWorkDir(const std::string& work_dir, const std::optional<RunAs>& rank_user) {
  const int fd = ::open(work_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("--work-dir: cannot open", work_dir);
  struct stat st {};
  absl::Status s = absl::OkStatus();
  if (::fstat(fd, &st) != 0) {
    s = Errno("--work-dir: cannot stat", work_dir);
  } else if (st.st_uid != ::geteuid()) {
    s = absl::FailedPreconditionError(absl::StrCat("--work-dir ", work_dir, ": owned by uid ",
                                                   st.st_uid, ", not by this daemon's user (uid ",
                                                   ::geteuid(), ")"));
  } else {
    // Its group stays: systemd's StateDirectory= chowns a tree whose top
    // has another group than the unit's, recursively, at every start.
    s = Own(fd, work_dir, st.st_uid, st.st_gid, rank_user.has_value() ? 0711 : 0700);
  }
  ::close(fd);
  if (!s.ok()) return s;
  for (const char* name :
       {"worker.key", "worker.crt", "worker-id", "worker-id.tmp", "worker.key.tmp"}) {
    if (absl::Status p = PrivateFile(absl::StrCat(work_dir, "/", name)); !p.ok()) return p;
  }
  return MakeDaemonDir(work_dir + "/jobs", rank_user);
}

AsRankUser::AsRankUser(const std::optional<RunAs>& rank_user) {
  if (!rank_user.has_value() || !Privileged()) return;
  const int n = ::getgroups(0, nullptr);
  saved_groups_.resize(n > 0 ? static_cast<size_t>(n) : 0);
  if (n < 0 || ::getgroups(n, saved_groups_.data()) != n) {
    ok_ = false;
    return;
  }
  // Raw system calls: the kernel keeps credentials per thread, and these
  // change the calling thread's only (glibc's setgroups would change every
  // thread's). The filesystem ids alone: the thread keeps its real and
  // effective uid 0, so it can switch back.
  if (syscall(SYS_setgroups, rank_user->groups.size(), rank_user->groups.data()) != 0) {
    ok_ = false;
    return;
  }
  active_ = true;
  syscall(SYS_setfsgid, rank_user->gid);
  syscall(SYS_setfsuid, rank_user->uid);
  // setfs[ug]id report no errors: asking again returns the current value.
  ok_ = static_cast<uid_t>(syscall(SYS_setfsuid, rank_user->uid)) == rank_user->uid &&
        static_cast<gid_t>(syscall(SYS_setfsgid, rank_user->gid)) == rank_user->gid;
}

AsRankUser::~AsRankUser() {
  if (!active_) return;
  const uid_t uid = ::geteuid();
  const gid_t gid = ::getegid();
  syscall(SYS_setfsuid, uid);
  syscall(SYS_setfsgid, gid);
  const bool restored = syscall(SYS_setgroups, saved_groups_.size(), saved_groups_.data()) == 0 &&
                        static_cast<uid_t>(syscall(SYS_setfsuid, uid)) == uid &&
                        static_cast<gid_t>(syscall(SYS_setfsgid, gid)) == gid;
  if (!restored) {
    LogEvent(LogLevel::kError, "worker", "identity_restore_failed", {{"then", "abort"}});
    std::abort();
  }
}

}  // namespace trainctl::worker
