#include "worker/daemon/cgroup_limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/subprocess.h"
#include "common/temp_dir.h"

namespace trainctl::worker {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

void Write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

std::string Read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

v1::ResourceSpec Limits(double cpus, int64_t memory, int64_t pids) {
  v1::ResourceSpec r;
  r.set_cpus(cpus);
  r.set_memory(memory);
  r.set_pids(pids);
  return r;
}

// Fake roots: plain directories laid out as cgroupfs is (no privilege needed).
class CgroupLimitsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_.path(), ec);
  }
  struct Dir {
    std::string p = MakeTempDir("cgroup-limits");
    const std::string& path() const { return p; }
  } dir_;
};

TEST(FormatBytes, NamesUnits) {
  EXPECT_EQ(FormatBytes(64 << 20), "64 MiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 29), "1.5 GiB");
  EXPECT_EQ(FormatBytes(1000), "1000 bytes");
  EXPECT_EQ(FormatBytes(2048), "2 KiB");
}

TEST_F(CgroupLimitsTest, V1FakeRootGetsLimitsPerControllerUnderTheDaemonsCgroup) {
  const fs::path root = fs::path(dir_.path()) / "cg";
  for (const char* c : {"memory", "cpu", "pids"}) fs::create_directories(root / c / "svc" / "w1");
  CgroupLimits cg = CgroupLimits::Detect(root.string(),
                                         "4:memory:/svc/w1\n1:cpu:/svc/w1\n8:pids:/svc/w1\n0::/\n");
  ASSERT_EQ(cg.version(), CgroupLimits::Version::kV1) << cg.Describe();
  EXPECT_EQ(cg.v1_base("memory"), (root / "memory/svc/w1/trainctl").string());
  absl::StatusOr<RankCgroup> g = cg.Create("j-1-1-rank0", Limits(1.5, 64 << 20, 100));
  ASSERT_TRUE(g.ok()) << g.status();
  const fs::path mem = root / "memory/svc/w1/trainctl/j-1-1-rank0";
  EXPECT_EQ(Read(mem / "memory.limit_in_bytes"), absl::StrCat(64 << 20));
  EXPECT_EQ(Read(root / "cpu/svc/w1/trainctl/j-1-1-rank0/cpu.cfs_quota_us"), "150000");
  EXPECT_EQ(Read(root / "cpu/svc/w1/trainctl/j-1-1-rank0/cpu.cfs_period_us"), "100000");
  EXPECT_EQ(Read(root / "pids/svc/w1/trainctl/j-1-1-rank0/pids.max"), "100");
  EXPECT_EQ(g->procs_fds().size(), 3u);
  EXPECT_EQ(g->memory_limit(), 64 << 20);
  // OOM evidence, as the kernel writes it.
  EXPECT_EQ(g->OomKills(), std::nullopt);
  Write(mem / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n");
  Write(mem / "memory.failcnt", "7\n");
  Write(mem / "memory.max_usage_in_bytes", absl::StrCat(64 << 20));
  EXPECT_EQ(g->OomKills(), 2);
  EXPECT_TRUE(g->MemoryLimitHit());
  EXPECT_EQ(g->PeakMemoryBytes(), 64 << 20);
  ASSERT_TRUE(g->Remove().ok());
  EXPECT_FALSE(fs::exists(mem));
  EXPECT_FALSE(fs::exists(root / "pids/svc/w1/trainctl/j-1-1-rank0"));
  EXPECT_TRUE(g->Remove().ok());  // idempotent
}

// Accounting (RankStatus.cpu_seconds): v1 keeps CPU time in the cpuacct
// hierarchy, a separate mount here, so the rank gets a cpuacct cgroup too
// (joined like the others, removed with them); v2's cpu.stat has it.
TEST_F(CgroupLimitsTest, CpuTimeComesFromV1CpuacctOrV2CpuStat) {
  const fs::path root = fs::path(dir_.path()) / "cg";
  for (const char* c : {"memory", "cpu", "pids", "cpuacct"}) fs::create_directories(root / c);
  CgroupLimits cg = CgroupLimits::Detect(root.string(), "4:memory:/\n1:cpu:/\n2:cpuacct:/\n0::/\n");
  ASSERT_EQ(cg.version(), CgroupLimits::Version::kV1) << cg.Describe();
  absl::StatusOr<RankCgroup> g = cg.Create("j-3-1-rank0", Limits(1, 64 << 20, 0));
  ASSERT_TRUE(g.ok()) << g.status();
  const fs::path acct = root / "cpuacct/trainctl/j-3-1-rank0";
  ASSERT_TRUE(fs::is_directory(acct));
  EXPECT_EQ(g->procs_fds().size(), 3u) << "memory, cpu and cpuacct";
  EXPECT_EQ(g->CpuSeconds(), 0) << "nothing counted yet: unknown";
  Write(acct / "cpuacct.usage", "2500000000\n");
  EXPECT_DOUBLE_EQ(g->CpuSeconds(), 2.5);
  ASSERT_TRUE(g->Remove().ok());
  EXPECT_FALSE(fs::exists(acct));

  // No cpuacct hierarchy: the figure is unknown, the limits still work.
  fs::remove_all(root / "cpuacct");
  CgroupLimits plain = CgroupLimits::Detect(root.string(), "4:memory:/\n1:cpu:/\n0::/\n");
  absl::StatusOr<RankCgroup> h = plain.Create("j-3-1-rank1", Limits(1, 0, 0));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->CpuSeconds(), 0);
  ASSERT_TRUE(h->Remove().ok());

  const fs::path root2 = fs::path(dir_.path()) / "cg2";
  Write(root2 / "cgroup.controllers", "cpu memory pids\n");
  fs::create_directories(root2 / "w");
  CgroupLimits v2 = CgroupLimits::Detect(root2.string(), "0::/w\n");
  ASSERT_EQ(v2.version(), CgroupLimits::Version::kV2) << v2.Describe();
  absl::StatusOr<RankCgroup> k = v2.Create("j-3-1-rank2", Limits(0, 64 << 20, 0));
  ASSERT_TRUE(k.ok()) << k.status();
  Write(root2 / "trainctl/j-3-1-rank2/cpu.stat",
        "usage_usec 1250000\nuser_usec 1000000\nsystem_usec 250000\n");
  EXPECT_DOUBLE_EQ(k->CpuSeconds(), 1.25);
  ASSERT_TRUE(k->Remove().ok());
}

TEST_F(CgroupLimitsTest, OnlyTheControllersAskedForAreUsed) {
  const fs::path root = fs::path(dir_.path()) / "cg";
  for (const char* c : {"memory", "cpu", "pids"}) fs::create_directories(root / c);
  CgroupLimits cg = CgroupLimits::Detect(root.string(), "4:memory:/\n");
  absl::StatusOr<RankCgroup> g = cg.Create("r", Limits(0, 2 << 20, 0));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->dirs(), std::vector<std::string>{(root / "memory/trainctl/r").string()});
  EXPECT_FALSE(fs::exists(root / "cpu/trainctl/r"));
  ASSERT_TRUE(g->Remove().ok());
}

TEST_F(CgroupLimitsTest, ContainerPathNotVisibleFallsBackToTheMountRoot) {
  const fs::path root = fs::path(dir_.path()) / "cg";
  fs::create_directories(root / "memory");
  CgroupLimits cg = CgroupLimits::Detect(root.string(), "4:memory:/docker/abc\n");
  ASSERT_TRUE(cg.available()) << cg.Describe();
  EXPECT_EQ(cg.v1_base("memory"), (root / "memory/trainctl").string());
  // A job asking for a controller this host lacks is told which.
  absl::StatusOr<RankCgroup> g = cg.Create("r", Limits(2, 0, 0));
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(g.status().message(), HasSubstr("no usable cgroup v1 cpu hierarchy"));
}

TEST_F(CgroupLimitsTest, V2FakeRootEnablesControllersInTheParentAndWritesOneCgroup) {
  const fs::path root = fs::path(dir_.path()) / "cg2";
  Write(root / "cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma\n");
  fs::create_directories(root / "system.slice/worker.service");
  Write(root / "system.slice/cgroup.controllers", "cpu memory pids\n");
  CgroupLimits cg = CgroupLimits::Detect(root.string(), "0::/system.slice/worker.service\n");
  ASSERT_EQ(cg.version(), CgroupLimits::Version::kV2) << cg.Describe();
  EXPECT_EQ(cg.v2_base(), (root / "system.slice/trainctl").string());
  absl::StatusOr<RankCgroup> g = cg.Create("j-2-1-rank1", Limits(0.5, 256 << 20, 64));
  ASSERT_TRUE(g.ok()) << g.status();
  // The daemon's parent delegates the controllers to trainctl/, which
  // delegates them to the rank's cgroup (one write per controller: the last
  // one stays in a plain file).
  EXPECT_EQ(Read(root / "system.slice/cgroup.subtree_control"), "+pids");
  EXPECT_EQ(Read(root / "system.slice/trainctl/cgroup.subtree_control"), "+pids");
  const fs::path d = root / "system.slice/trainctl/j-2-1-rank1";
  EXPECT_EQ(Read(d / "memory.max"), absl::StrCat(256 << 20));
  EXPECT_EQ(Read(d / "cpu.max"), "50000 100000");
  EXPECT_EQ(Read(d / "pids.max"), "64");
  EXPECT_EQ(g->procs_fds().size(), 1u);
  Write(d / "memory.events", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n");
  Write(d / "memory.peak", "268435456\n");
  EXPECT_EQ(g->OomKills(), 1);
  EXPECT_TRUE(g->MemoryLimitHit());
  EXPECT_EQ(g->PeakMemoryBytes(), 268435456);
  ASSERT_TRUE(g->Remove().ok());
  EXPECT_FALSE(fs::exists(d));
}

TEST_F(CgroupLimitsTest, V2WithoutAMemoryControllerAndNoV1IsUnavailable) {
  const fs::path root = fs::path(dir_.path()) / "empty";
  fs::create_directories(root / "unified");
  Write(root / "unified/cgroup.controllers", "\n");
  CgroupLimits cg = CgroupLimits::Detect(root.string(), "0::/\n");
  EXPECT_FALSE(cg.available());
  EXPECT_THAT(cg.unavailable_reason(), HasSubstr("no usable cgroup"));
  absl::StatusOr<RankCgroup> g = cg.Create("r", Limits(0, 2 << 20, 0));
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(CgroupLimits::Detect("", "").available());
}

TEST_F(CgroupLimitsTest, NamesThatWouldLeaveTheBaseAreRefused) {
  const fs::path root = fs::path(dir_.path()) / "cg";
  fs::create_directories(root / "memory");
  CgroupLimits cg = CgroupLimits::Detect(root.string(), "");
  for (const char* bad : {"", "..", ".hidden", "a/b", "../x", "a b"}) {
    EXPECT_EQ(cg.Create(bad, Limits(0, 2 << 20, 0)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST_F(CgroupLimitsTest, NeverWritesThroughALink) {
  const fs::path root = fs::path(dir_.path()) / "cg";
  fs::create_directories(root / "memory/trainctl/r");
  Write(fs::path(dir_.path()) / "victim", "keep");
  // A leftover directory holding a link where a limit file goes: the
  // leftover is removed (its plain files with it) and made afresh; a link
  // at the file itself is never followed.
  fs::create_symlink(fs::path(dir_.path()) / "victim",
                     root / "memory/trainctl/r/memory.limit_in_bytes");
  EXPECT_FALSE(
      WriteCgroupFile((root / "memory/trainctl/r/memory.limit_in_bytes").string(), "1").ok());
  EXPECT_EQ(Read(fs::path(dir_.path()) / "victim"), "keep");
}

TEST(Allocatable, CpusAndMemoryWithinTheDaemonsOwnLimits) {
  const std::string meminfo = "MemTotal:       16314220 kB\nMemFree:  1000 kB\n";
  v1::Allocatable a = ComputeAllocatable(8, 0, meminfo, 0, true);
  EXPECT_EQ(a.cpus(), 8);
  EXPECT_EQ(a.memory_bytes(), int64_t{16314220} * 1024);
  EXPECT_TRUE(a.enforces_limits());
  // A container's quota and limit bound them; v1's "no limit" does not.
  a = ComputeAllocatable(8, 2.5, meminfo, int64_t{4} << 30, false);
  EXPECT_EQ(a.cpus(), 2.5);
  EXPECT_EQ(a.memory_bytes(), int64_t{4} << 30);
  EXPECT_FALSE(a.enforces_limits());
  a = ComputeAllocatable(8, 0, meminfo, 9223372036854771712, true);
  EXPECT_EQ(a.memory_bytes(), int64_t{16314220} * 1024);
  // This host: something sensible.
  a = AllocatableHere("/sys/fs/cgroup");
  EXPECT_GE(a.cpus(), 0.01);
  EXPECT_GT(a.memory_bytes(), 0);
}

// The real thing: a process over its memory limit is killed by the OOM
// killer inside its cgroup, which says so; a sibling is untouched.
TEST(CgroupLimitsRealTest, OverTheLimitIsKilledAndCounted) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to create cgroups";
  CgroupLimits cg = CgroupLimits::DetectHere("/sys/fs/cgroup");
  if (!cg.available()) GTEST_SKIP() << "no writable cgroups here: " << cg.unavailable_reason();
  const std::string name = absl::StrCat("test-", ::getpid());
  absl::StatusOr<RankCgroup> g = cg.Create(name, Limits(0, 32 << 20, 64));
  if (!g.ok()) GTEST_SKIP() << "cannot create a cgroup here: " << g.status();
  SpawnOptions o;
  // The shell's child inherits the cgroup: the limit covers the whole tree.
  o.argv = {"/bin/sh", "-c", "python3 -c 'b = bytearray(256 << 20); print(len(b))'; exit $?"};
  o.cgroup_procs_fds = g->procs_fds();
  absl::StatusOr<Subprocess> p = Subprocess::Spawn(o);
  ASSERT_TRUE(p.ok()) << p.status();
  g->CloseProcsFds();
  ExitStatus st = p->Wait();
  EXPECT_FALSE(st.success()) << st.ToString();
  std::optional<int64_t> kills = g->OomKills();
  if (kills.has_value()) {
    EXPECT_GE(*kills, 1);
  } else {
    EXPECT_TRUE(g->MemoryLimitHit());
  }
  const std::vector<std::string> dirs = g->dirs();
  ASSERT_TRUE(g->Remove().ok());
  for (const std::string& d : dirs) {
    EXPECT_FALSE(fs::exists(d)) << d;
    ::rmdir(fs::path(d).parent_path().c_str());  // trainctl/, when nothing else uses it
  }
}

}  // namespace
}  // namespace trainctl::worker
