#include "worker/daemon/cgroup_limits.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/daemon/oom_events.h"

namespace trainctl::worker {
namespace {

// CFS period written with a quota (the kernel's default, 100 ms).
constexpr int64_t kCpuPeriodUs = 100000;
// Filesystem magics of cgroupfs (linux/magic.h).
constexpr long kCgroupMagic = 0x27e0eb;
constexpr long kCgroup2Magic = 0x63677270;

std::string ReadSmallFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return "";
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 && out.size() < (1 << 20))
    out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

bool IsDir(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// mkdir -p without following links: every component must be a directory.
absl::Status MakeDirs(const std::string& path) {
  std::string so_far;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    absl::StrAppend(&so_far, "/", part);
    if (::mkdir(so_far.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create ", so_far, ": ", std::strerror(errno)));
    }
    if (!IsDir(so_far))
      return absl::FailedPreconditionError(absl::StrCat(so_far, " is not a directory"));
  }
  return absl::OkStatus();
}

// The controllers a cgroup2 directory offers (its cgroup.controllers).
std::vector<std::string> Controllers(const std::string& dir) {
  return absl::StrSplit(absl::StripAsciiWhitespace(ReadSmallFile(dir + "/cgroup.controllers")), ' ',
                        absl::SkipEmpty());
}

bool Has(const std::vector<std::string>& v, absl::string_view x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// "/a/b" -> "/a"; "/a" -> "/"; "/" -> "/".
std::string ParentPath(const std::string& p) {
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos || slash == 0) return "/";
  return p.substr(0, slash);
}

std::string JoinPath(const std::string& mount, const std::string& path) {
  if (path.empty() || path == "/") return mount;
  return absl::StrCat(mount, absl::StartsWith(path, "/") ? "" : "/", path);
}

// Where a cgroup directory for the daemon's path lies under `mount`: the
// path itself, or the mount's root where the path is not visible (a
// container whose cgroup namespace starts at its own cgroup).
std::string VisiblePath(const std::string& mount, const std::string& path) {
  const std::string full = JoinPath(mount, path);
  return IsDir(full) ? path : "/";
}

bool Writable(const std::string& dir, std::string* why) {
  if (::access(dir.c_str(), W_OK) == 0) return true;
  *why = absl::StrCat(dir, " is not writable (", std::strerror(errno), ")");
  return false;
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 200 || name[0] == '.') return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

std::optional<int64_t> ReadNumber(const std::string& path) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadSmallFile(path)), &v)) return std::nullopt;
  return v;
}

// Removes one cgroup directory: processes still in it are killed (they left
// the rank's process group, or the rank is not reaped yet), then rmdir is
// retried for up to ~0.5 s.
absl::Status RemoveDir(const std::string& dir) {
  if (dir.empty() || !IsDir(dir)) return absl::OkStatus();
  for (int i = 0; i < 50; ++i) {
    if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
    const int err = errno;
    struct statfs fs {};
    const bool cgroupfs =
        ::statfs(dir.c_str(), &fs) == 0 && (static_cast<long>(fs.f_type) == kCgroupMagic ||
                                            static_cast<long>(fs.f_type) == kCgroup2Magic);
    if (err == ENOTEMPTY && !cgroupfs) {
      // A plain directory standing in for cgroupfs (the unit tests' fake
      // root): its files are ours to delete; never through a link.
      if (DIR* d = ::opendir(dir.c_str())) {
        while (dirent* e = ::readdir(d)) {
          if (e->d_type == DT_REG) ::unlinkat(dirfd(d), e->d_name, 0);
        }
        ::closedir(d);
      }
      continue;
    }
    if (err != EBUSY)
      return absl::InternalError(
          absl::StrCat("cannot remove cgroup ", dir, ": ", std::strerror(err)));
    if (::access((dir + "/cgroup.kill").c_str(), F_OK) == 0) {
      (void)WriteCgroupFile(dir + "/cgroup.kill", "1");
    } else {
      for (absl::string_view line :
           absl::StrSplit(ReadSmallFile(dir + "/cgroup.procs"), '\n', absl::SkipEmpty())) {
        int pid = 0;
        if (absl::SimpleAtoi(line, &pid) && pid > 1) ::kill(pid, SIGKILL);
      }
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("cannot remove cgroup ", dir, ": processes are still in it"));
}

}  // namespace

absl::Status WriteCgroupFile(const std::string& path, absl::string_view value) {
  // O_CREAT: cgroupfs files exist already (create fails there); a plain
  // directory standing in for one gets the file.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  const ssize_t n = ::write(fd, value.data(), value.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(value.size())) {
    return absl::FailedPreconditionError(absl::StrCat("cannot write '", value, "' to ", path, ": ",
                                                      n < 0 ? std::strerror(err) : "short write"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// RankCgroup

RankCgroup::~RankCgroup() { CloseProcsFds(); }

RankCgroup::RankCgroup(RankCgroup&& o) noexcept
    : v2_(o.v2_),
      memory_dir_(std::move(o.memory_dir_)),
      cpu_dir_(std::move(o.cpu_dir_)),
      pids_dir_(std::move(o.pids_dir_)),
      acct_dir_(std::move(o.acct_dir_)),
      procs_fds_(std::move(o.procs_fds_)),
      memory_limit_(o.memory_limit_),
      pids_limit_(o.pids_limit_) {
  o.procs_fds_.clear();
}

RankCgroup& RankCgroup::operator=(RankCgroup&& o) noexcept {
  if (this != &o) {
    CloseProcsFds();
    v2_ = o.v2_;
    memory_dir_ = std::move(o.memory_dir_);
    cpu_dir_ = std::move(o.cpu_dir_);
    pids_dir_ = std::move(o.pids_dir_);
    acct_dir_ = std::move(o.acct_dir_);
    procs_fds_ = std::move(o.procs_fds_);
    o.procs_fds_.clear();
    memory_limit_ = o.memory_limit_;
    pids_limit_ = o.pids_limit_;
  }
  return *this;
}

void RankCgroup::CloseProcsFds() {
  for (int fd : procs_fds_) ::close(fd);
  procs_fds_.clear();
}

std::optional<int64_t> RankCgroup::OomKills() const {
  if (memory_dir_.empty()) return std::nullopt;
  return ParseOomKillCount(
      ReadSmallFile(memory_dir_ + (v2_ ? "/memory.events" : "/memory.oom_control")));
}

bool RankCgroup::MemoryLimitHit() const {
  if (memory_dir_.empty()) return false;
  std::optional<int64_t> n =
      v2_ ? ParseKeyedValue(ReadSmallFile(memory_dir_ + "/memory.events"), "max")
          : ReadNumber(memory_dir_ + "/memory.failcnt");
  return n.value_or(0) > 0;
}

std::optional<int64_t> RankCgroup::PidsLimitHits() const {
  if (pids_dir_.empty() || pids_limit_ <= 0) return std::nullopt;
  return ParseKeyedValue(ReadSmallFile(pids_dir_ + "/pids.events"), "max");
}

int64_t RankCgroup::PeakMemoryBytes() const {
  if (memory_dir_.empty()) return 0;
  return ReadNumber(memory_dir_ + (v2_ ? "/memory.peak" : "/memory.max_usage_in_bytes"))
      .value_or(0);
}

double RankCgroup::CpuSeconds() const {
  if (v2_) {
    if (cpu_dir_.empty()) return 0;
    return static_cast<double>(
               ParseKeyedValue(ReadSmallFile(cpu_dir_ + "/cpu.stat"), "usage_usec").value_or(0)) /
           1e6;
  }
  if (acct_dir_.empty()) return 0;
  return static_cast<double>(ReadNumber(acct_dir_ + "/cpuacct.usage").value_or(0)) / 1e9;
}

std::vector<std::string> RankCgroup::dirs() const {
  std::vector<std::string> out;
  for (const std::string* d : {&memory_dir_, &cpu_dir_, &pids_dir_, &acct_dir_}) {
    if (!d->empty() && std::find(out.begin(), out.end(), *d) == out.end()) out.push_back(*d);
  }
  return out;
}

absl::Status RankCgroup::Remove() {
  CloseProcsFds();
  absl::Status result;
  for (const std::string& d : dirs()) result.Update(RemoveDir(d));
  memory_dir_.clear();
  cpu_dir_.clear();
  pids_dir_.clear();
  acct_dir_.clear();
  return result;
}

// ---------------------------------------------------------------------------
// CgroupLimits

CgroupLimits CgroupLimits::Detect(const std::string& root, absl::string_view proc_self_cgroup) {
  CgroupLimits c;
  if (root.empty()) {
    c.reason_ = "cgroups are off on this worker (--cgroup-root \"\")";
    return c;
  }
  std::string v2_path = "/";
  std::map<std::string, std::string> v1_paths;
  for (const ProcCgroupLine& l : ParseProcSelfCgroup(proc_self_cgroup)) {
    if (l.v2) {
      v2_path = l.path;
    } else {
      for (const std::string& ctl : l.controllers) v1_paths[ctl] = l.path;
    }
  }
  // cgroup v2: the root itself (unified), or <root>/unified with controllers.
  for (const std::string& mount : {root, root + "/unified"}) {
    if (mount != root && IsDir(root + "/memory")) break;  // hybrid: v1 owns the controllers
    std::vector<std::string> ctl = Controllers(mount);
    if (!Has(ctl, "memory")) continue;
    const std::string own = VisiblePath(mount, v2_path);
    c.v2_parent_ = JoinPath(mount, ParentPath(own));
    if (own == "/") c.v2_parent_ = mount;
    c.v2_base_ = c.v2_parent_ + "/trainctl";
    std::string why;
    if (!Writable(IsDir(c.v2_base_) ? c.v2_base_ : c.v2_parent_, &why)) {
      c.reason_ = absl::StrCat("cgroup v2 at ", mount, ": ", why);
      return c;
    }
    c.version_ = Version::kV2;
    return c;
  }
  // cgroup v1: a hierarchy per controller.
  std::vector<std::string> problems;
  for (auto [controller, base] : {std::pair<const char*, std::string*>{"memory", &c.v1_memory_},
                                  {"cpu", &c.v1_cpu_},
                                  {"pids", &c.v1_pids_}}) {
    const std::string mount = absl::StrCat(root, "/", controller);
    if (!IsDir(mount) && !IsDir(mount + "/")) {
      problems.push_back(absl::StrCat("no ", controller, " hierarchy at ", mount));
      continue;
    }
    auto it = v1_paths.find(controller);
    const std::string own = VisiblePath(mount, it == v1_paths.end() ? "/" : it->second);
    const std::string parent = JoinPath(mount, own);
    std::string why;
    if (!Writable(IsDir(parent + "/trainctl") ? parent + "/trainctl" : parent, &why)) {
      problems.push_back(why);
      continue;
    }
    *base = parent + "/trainctl";
  }
  if (c.v1_memory_.empty() && c.v1_cpu_.empty() && c.v1_pids_.empty()) {
    c.reason_ = problems.empty() ? absl::StrCat("no cgroup hierarchy under ", root)
                                 : absl::StrCat("no usable cgroup under ", root, ": ",
                                                absl::StrJoin(problems, "; "));
    return c;
  }
  // Accounting only (CpuSeconds): its absence is no problem.
  if (const std::string mount = root + "/cpuacct"; IsDir(mount)) {
    auto it = v1_paths.find("cpuacct");
    const std::string parent =
        JoinPath(mount, VisiblePath(mount, it == v1_paths.end() ? "/" : it->second));
    std::string why;
    if (Writable(IsDir(parent + "/trainctl") ? parent + "/trainctl" : parent, &why)) {
      c.v1_cpuacct_ = parent + "/trainctl";
    }
  }
  c.version_ = Version::kV1;
  c.reason_ = absl::StrJoin(problems, "; ");  // what is missing, if anything
  return c;
}

CgroupLimits CgroupLimits::DetectHere(const std::string& root) {
  std::ifstream in("/proc/self/cgroup");
  std::stringstream ss;
  ss << in.rdbuf();
  return Detect(root, ss.str());
}

const std::string& CgroupLimits::v1_base(absl::string_view controller) const {
  static const std::string kNone;
  if (controller == "memory") return v1_memory_;
  if (controller == "cpu") return v1_cpu_;
  if (controller == "pids") return v1_pids_;
  return kNone;
}

std::string CgroupLimits::Describe() const {
  switch (version_) {
    case Version::kV2:
      return absl::StrCat("cgroup v2 (", v2_base_, ")");
    case Version::kV1: {
      std::vector<std::string> parts;
      for (const std::string* b : {&v1_memory_, &v1_cpu_, &v1_pids_}) {
        if (!b->empty()) parts.push_back(*b);
      }
      return absl::StrCat("cgroup v1 (", absl::StrJoin(parts, ", "), ")",
                          reason_.empty() ? "" : absl::StrCat("; ", reason_));
    }
    default:
      return absl::StrCat("no cgroups: ", reason_);
  }
}

absl::Status CgroupLimits::PrepareV2() {
  if (v2_prepared_) return absl::OkStatus();
  const std::vector<std::string> offered = Controllers(v2_parent_);
  std::vector<std::string> enable;
  for (const char* c : {"memory", "cpu", "pids"}) {
    if (Has(offered, c)) enable.push_back(absl::StrCat("+", c));
  }
  // One write per controller: one the parent cannot delegate does not stop
  // the others (Create names it when a job needs it).
  for (const std::string& e : enable)
    (void)WriteCgroupFile(v2_parent_ + "/cgroup.subtree_control", e);
  if (absl::Status s = MakeDirs(v2_base_); !s.ok()) return s;
  for (const std::string& e : enable)
    (void)WriteCgroupFile(v2_base_ + "/cgroup.subtree_control", e);
  v2_prepared_ = true;
  return absl::OkStatus();
}

absl::StatusOr<RankCgroup> CgroupLimits::Create(const std::string& name,
                                                const v1::ResourceSpec& r) {
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cgroup name '", name, "': only [A-Za-z0-9_.-], not starting with '.'"));
  }
  if (!available()) return absl::FailedPreconditionError(reason_);
  RankCgroup g;
  g.v2_ = version_ == Version::kV2;
  // Made one directory at a time; whatever was made is removed on error.
  auto fail = [&g](absl::Status s) {
    (void)g.Remove();
    return s;
  };
  auto make = [&](const std::string& base) -> absl::StatusOr<std::string> {
    if (absl::Status s = MakeDirs(base); !s.ok()) return s;
    const std::string dir = base + "/" + name;
    if (IsDir(dir)) {
      // A leftover of a daemon that died with a rank of this name.
      if (absl::Status s = RemoveDir(dir); !s.ok()) return s;
    }
    if (::mkdir(dir.c_str(), 0755) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create cgroup ", dir, ": ", std::strerror(errno)));
    }
    return dir;
  };
  const int64_t quota =
      r.cpus() > 0 ? std::max<int64_t>(1000, std::llround(r.cpus() * kCpuPeriodUs)) : 0;
  if (g.v2_) {
    if (absl::Status s = PrepareV2(); !s.ok()) return s;
    const std::vector<std::string> ctl = Controllers(v2_base_);
    for (auto [need, c] : {std::pair<bool, const char*>{r.memory() > 0, "memory"},
                           {r.cpus() > 0, "cpu"},
                           {r.pids() > 0, "pids"}}) {
      // A fake root has no cgroup.controllers below the parent: trust the parent's.
      if (need && !Has(ctl, c) && IsDir(v2_base_) &&
          ::access((v2_base_ + "/cgroup.controllers").c_str(), F_OK) == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("cgroup v2 at ", v2_base_, " has no ", c,
                         " controller (its parent does not delegate it)"));
      }
    }
    absl::StatusOr<std::string> dir = make(v2_base_);
    if (!dir.ok()) return dir.status();
    g.memory_dir_ = g.cpu_dir_ = g.pids_dir_ = *dir;
    if (r.memory() > 0) {
      if (absl::Status s = WriteCgroupFile(*dir + "/memory.max", absl::StrCat(r.memory())); !s.ok())
        return fail(s);
      // No swap beyond the limit (as Kubernetes): the limit is the limit.
      if (::access((*dir + "/memory.swap.max").c_str(), F_OK) == 0)
        (void)WriteCgroupFile(*dir + "/memory.swap.max", "0");
      g.memory_limit_ = r.memory();
    }
    if (quota > 0) {
      if (absl::Status s =
              WriteCgroupFile(*dir + "/cpu.max", absl::StrCat(quota, " ", kCpuPeriodUs));
          !s.ok()) {
        return fail(s);
      }
    }
    if (r.pids() > 0) {
      if (absl::Status s = WriteCgroupFile(*dir + "/pids.max", absl::StrCat(r.pids())); !s.ok())
        return fail(s);
      g.pids_limit_ = r.pids();
    }
  } else {
    for (auto [need, c] : {std::pair<bool, const char*>{r.memory() > 0, "memory"},
                           {r.cpus() > 0, "cpu"},
                           {r.pids() > 0, "pids"}}) {
      if (need && v1_base(c).empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("no usable cgroup v1 ", c, " hierarchy: ", reason_));
      }
    }
    if (r.memory() > 0) {
      absl::StatusOr<std::string> dir = make(v1_memory_);
      if (!dir.ok()) return fail(dir.status());
      g.memory_dir_ = *dir;
      if (absl::Status s =
              WriteCgroupFile(*dir + "/memory.limit_in_bytes", absl::StrCat(r.memory()));
          !s.ok()) {
        return fail(s);
      }
      // Memory plus swap to the same limit where the kernel accounts swap.
      if (::access((*dir + "/memory.memsw.limit_in_bytes").c_str(), F_OK) == 0) {
        (void)WriteCgroupFile(*dir + "/memory.memsw.limit_in_bytes", absl::StrCat(r.memory()));
      }
      g.memory_limit_ = r.memory();
    }
    if (quota > 0) {
      absl::StatusOr<std::string> dir = make(v1_cpu_);
      if (!dir.ok()) return fail(dir.status());
      g.cpu_dir_ = *dir;
      if (absl::Status s = WriteCgroupFile(*dir + "/cpu.cfs_period_us", absl::StrCat(kCpuPeriodUs));
          !s.ok()) {
        return fail(s);
      }
      if (absl::Status s = WriteCgroupFile(*dir + "/cpu.cfs_quota_us", absl::StrCat(quota));
          !s.ok())
        return fail(s);
    }
    // CPU time for accounting: the cpu cgroup when cpuacct shares its
    // hierarchy, else a cpuacct cgroup of its own where one can be made (a
    // failure costs only the figure).
    if (!g.cpu_dir_.empty() && ::access((g.cpu_dir_ + "/cpuacct.usage").c_str(), F_OK) == 0) {
      g.acct_dir_ = g.cpu_dir_;
    } else if (!v1_cpuacct_.empty()) {
      absl::StatusOr<std::string> dir = make(v1_cpuacct_);
      if (dir.ok()) g.acct_dir_ = *dir;
    }
    if (r.pids() > 0) {
      absl::StatusOr<std::string> dir = make(v1_pids_);
      if (!dir.ok()) return fail(dir.status());
      g.pids_dir_ = *dir;
      if (absl::Status s = WriteCgroupFile(*dir + "/pids.max", absl::StrCat(r.pids())); !s.ok())
        return fail(s);
      g.pids_limit_ = r.pids();
    }
  }
  for (const std::string& d : g.dirs()) {
    const std::string procs = d + "/cgroup.procs";
    const int fd = ::open(procs.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
      return fail(absl::FailedPreconditionError(
          absl::StrCat("cannot open ", procs, ": ", std::strerror(errno))));
    g.procs_fds_.push_back(fd);
  }
  return g;
}

v1::Allocatable ComputeAllocatable(int online_cpus, double cpu_quota, absl::string_view meminfo,
                                   int64_t memory_limit, bool enforces_limits) {
  v1::Allocatable a;
  double cpus = std::max(0, online_cpus);
  if (cpu_quota > 0 && (cpus == 0 || cpu_quota < cpus)) cpus = cpu_quota;
  a.set_cpus(cpus);
  // "MemTotal:       16314220 kB"
  int64_t total = 0;
  for (absl::string_view line : absl::StrSplit(meminfo, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemTotal:")) continue;
    line = absl::StripAsciiWhitespace(line);
    const bool kb = absl::ConsumeSuffix(&line, "kB");
    int64_t v = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &v)) total = kb ? v * 1024 : v;
  }
  if (memory_limit > 0 && (total == 0 || memory_limit < total)) total = memory_limit;
  a.set_memory_bytes(total);
  a.set_enforces_limits(enforces_limits);
  return a;
}

v1::Allocatable AllocatableHere(const std::string& cgroup_root) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int online = ::sched_getaffinity(0, sizeof set, &set) == 0
                         ? CPU_COUNT(&set)
                         : static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  double quota = 0;
  int64_t limit = 0;
  if (!cgroup_root.empty()) {
    // This daemon's own cgroup's limits (a container's, a systemd unit's).
    for (const ProcCgroupLine& l : ParseProcSelfCgroup(ReadSmallFile("/proc/self/cgroup"))) {
      if (l.v2) {
        const std::string dir = JoinPath(cgroup_root, VisiblePath(cgroup_root, l.path));
        if (std::optional<int64_t> v = ReadNumber(dir + "/memory.max")) limit = *v;  // "max": none
        std::vector<std::string> cpu_max =
            absl::StrSplit(absl::StripAsciiWhitespace(ReadSmallFile(dir + "/cpu.max")), ' ');
        int64_t q = 0, p = 0;
        if (cpu_max.size() == 2 && absl::SimpleAtoi(cpu_max[0], &q) &&
            absl::SimpleAtoi(cpu_max[1], &p) && p > 0) {
          quota = static_cast<double>(q) / static_cast<double>(p);
        }
        continue;
      }
      for (const std::string& ctl : l.controllers) {
        const std::string mount = absl::StrCat(cgroup_root, "/", ctl);
        const std::string dir = JoinPath(mount, VisiblePath(mount, l.path));
        if (ctl == "memory") {
          // v1 says "no limit" with a huge number: above MemTotal, ignored.
          limit = ReadNumber(dir + "/memory.limit_in_bytes").value_or(0);
        } else if (ctl == "cpu") {
          const int64_t q = ReadNumber(dir + "/cpu.cfs_quota_us").value_or(-1);
          const int64_t p = ReadNumber(dir + "/cpu.cfs_period_us").value_or(0);
          if (q > 0 && p > 0) quota = static_cast<double>(q) / static_cast<double>(p);
        }
      }
    }
  }
  const CgroupLimits cg = CgroupLimits::DetectHere(cgroup_root);
  v1::Allocatable a =
      ComputeAllocatable(online, quota, ReadSmallFile("/proc/meminfo"), limit, cg.available());
  if (!cg.available()) a.set_limits_off_reason(cg.unavailable_reason());
  return a;
}

}  // namespace trainctl::worker
