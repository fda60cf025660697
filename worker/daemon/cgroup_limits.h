// CgroupLimits: a rank's resource limits (job.yaml `resources`), enforced
// with a cgroup of its own that the rank's process joins before it executes
// anything, so that everything it starts (DataLoader workers, a torchrun
// child, a shell pipeline) is inside the same limits.
//
// Where the cgroups go (Detect):
//  - cgroup v2, when the root (normally /sys/fs/cgroup) is a cgroup2 mount
//    whose cgroup.controllers has memory, cpu and pids: under
//    <parent of the daemon's cgroup>/trainctl/<name>. v2 forbids processes
//    in a cgroup whose controllers are delegated to children, so the
//    daemon's own cgroup cannot hold the ranks' cgroups; its parent and
//    <parent>/trainctl get "+memory +cpu +pids" in cgroup.subtree_control.
//  - cgroup v1 otherwise, per controller (memory, cpu, pids) mounted at
//    <root>/<controller>: <mount>/<the daemon's cgroup>/trainctl/<name>
//    (the mount's root when the daemon's path is not visible there, as in
//    a container).
//  - none (unavailable_reason says why): no hierarchy with the controllers,
//    or not writable (not root, read-only). A job that asks for limits then
//    fails to launch with that reason (rank_launch.cc): limits a user asked
//    for are never silently dropped.
//
// Files are written without following links (O_NOFOLLOW) and names are
// checked ([A-Za-z0-9_.-], not starting with '.'): the daemon runs as root.
//
// Not thread-safe: the daemon's RankTable uses it from its event loop.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/format_bytes.h"
#include "trainctl/v1/job.pb.h"
#include "trainctl/v1/worker_service.pb.h"

namespace trainctl::worker {

using ::trainctl::FormatBytes;  // common/format_bytes.h

// One rank's cgroup (a directory per v1 controller, one for v2), created by
// CgroupLimits::Create. Movable; the destructor only closes fds: Remove()
// deletes the cgroup.
class RankCgroup {
 public:
  RankCgroup() = default;
  ~RankCgroup();
  RankCgroup(RankCgroup&& other) noexcept;
  RankCgroup& operator=(RankCgroup&& other) noexcept;
  RankCgroup(const RankCgroup&) = delete;
  RankCgroup& operator=(const RankCgroup&) = delete;

  // Open cgroup.procs files (O_WRONLY|O_CLOEXEC): the rank's child writes
  // "0" to each before it executes (SpawnOptions::cgroup_procs_fds), which
  // moves it and everything it later starts in.
  const std::vector<int>& procs_fds() const { return procs_fds_; }
  // After the spawn: the parent's copies are no longer needed.
  void CloseProcsFds();

  // The memory limit written (0: none).
  int64_t memory_limit() const { return memory_limit_; }
  // How many processes the OOM killer has killed in this cgroup (v1
  // memory.oom_control, v2 memory.events), or nullopt when unknown (no
  // memory limit, or the file cannot be read).
  std::optional<int64_t> OomKills() const;
  // Whether the memory limit was hit (v1 memory.failcnt > 0, v2
  // memory.events "max" > 0): evidence where the kernel has no oom_kill line.
  bool MemoryLimitHit() const;
  // The process limit written (0: none).
  int64_t pids_limit() const { return pids_limit_; }
  // How many forks (or threads) the pids limit refused (pids.events "max",
  // v1 and v2), or nullopt when unknown (no pids limit, or unreadable).
  std::optional<int64_t> PidsLimitHits() const;
  // The peak memory use the cgroup saw (v1 memory.max_usage_in_bytes, v2
  // memory.peak), or 0 when unknown.
  int64_t PeakMemoryBytes() const;
  // The CPU time the cgroup's processes used, in seconds (v2 cpu.stat
  // usage_usec; v1 cpuacct.usage of the rank's cpuacct cgroup, made beside
  // the limits where a cpuacct hierarchy is writable), or 0 when unknown.
  // For accounting (RankStatus.cpu_seconds).
  double CpuSeconds() const;

  // Deletes the cgroup's directories: processes left in it (ones that left
  // the rank's process group) are killed first. Idempotent.
  absl::Status Remove();
  // The directories ("" entries skipped), for logs and tests.
  std::vector<std::string> dirs() const;

 private:
  friend class CgroupLimits;
  bool v2_ = false;
  // v2: memory_dir_ == cpu_dir_ == pids_dir_ (one directory) when set.
  std::string memory_dir_, cpu_dir_, pids_dir_;
  // v1: the directory whose cpuacct.usage counts the rank's CPU time (its
  // cpu cgroup where cpu and cpuacct share a hierarchy, else one of its own
  // under the cpuacct hierarchy); "" for v2 (cpu.stat) or none.
  std::string acct_dir_;
  std::vector<int> procs_fds_;
  int64_t memory_limit_ = 0;
  int64_t pids_limit_ = 0;
};

class CgroupLimits {
 public:
  enum class Version { kNone, kV1, kV2 };

  // Looks at `root` (normally /sys/fs/cgroup) and `proc_self_cgroup` (the
  // text of /proc/self/cgroup) to see where rank cgroups can go; nothing is
  // written until the first Create (v2's subtree_control included).
  static CgroupLimits Detect(const std::string& root, absl::string_view proc_self_cgroup);
  // Detect("/sys/fs/cgroup", this process's /proc/self/cgroup); "" as the
  // root: none ("cgroups are off (--cgroup-root \"\")").
  static CgroupLimits DetectHere(const std::string& root);

  Version version() const { return version_; }
  bool available() const { return version_ != Version::kNone; }
  // Why limits cannot be enforced (available() false).
  const std::string& unavailable_reason() const { return reason_; }
  // "cgroup v1 (/sys/fs/cgroup/memory/x/trainctl, ...)" or the reason.
  std::string Describe() const;
  // Where rank cgroups are made: v2 one directory; v1 memory, cpu, pids.
  const std::string& v2_base() const { return v2_base_; }
  const std::string& v1_base(absl::string_view controller) const;

  // A cgroup named `name` ([A-Za-z0-9_.-], 1-200 characters, not starting
  // with '.') holding the limits of `r` (0 fields: no limit). A leftover of
  // the same name (a daemon that died) is removed first. FAILED_PRECONDITION
  // naming the reason when cgroups are unavailable or a write fails;
  // INVALID_ARGUMENT for a bad name.
  absl::StatusOr<RankCgroup> Create(const std::string& name, const v1::ResourceSpec& r);

 private:
  absl::Status PrepareV2();
  Version version_ = Version::kNone;
  std::string reason_;
  std::string v2_base_;
  std::string v2_parent_;  // the daemon's parent cgroup (subtree_control)
  bool v2_prepared_ = false;
  std::string v1_memory_, v1_cpu_, v1_pids_;
  // Where v1 accounting cgroups go (cpuacct, for CpuSeconds); "" when there
  // is no writable cpuacct hierarchy (then CPU time is unknown, no error).
  std::string v1_cpuacct_;
};

// The CPUs and memory this host offers ranks: `online_cpus` (the daemon's
// affinity) within `cpu_quota` (its cgroup's quota in CPUs, 0 = none),
// `meminfo`'s MemTotal within `memory_limit` (its cgroup's limit, 0 or
// above MemTotal = none). Pure (AllocatableHere reads the files).
v1::Allocatable ComputeAllocatable(int online_cpus, double cpu_quota, absl::string_view meminfo,
                                   int64_t memory_limit, bool enforces_limits);
// ComputeAllocatable for this process, with cgroups found under
// `cgroup_root` ("" = none).
// Without enforcement, limits_off_reason says why.
v1::Allocatable AllocatableHere(const std::string& cgroup_root);

// Writes `value` to the file `path`, never through a link (O_NOFOLLOW). On
// cgroupfs only existing files can be opened (it refuses to create one);
// O_CREAT serves the unit tests' plain-directory roots.
absl::Status WriteCgroupFile(const std::string& path, absl::string_view value);

}  // namespace trainctl::worker
