#include "worker/daemon/oom_events.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace trainctl::worker {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

TEST(OomEvents, ParsesV1AndV2Counts) {
  EXPECT_EQ(ParseOomKillCount("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"), 2);
  EXPECT_EQ(ParseOomKillCount("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n"), 7);
  EXPECT_EQ(ParseOomKillCount("oom_kill_disable 0\nunder_oom 0\n"), std::nullopt);  // kernel < 4.13
  EXPECT_EQ(ParseOomKillCount(""), std::nullopt);
  EXPECT_EQ(ParseOomKillCount("oom_kill x\n"), std::nullopt);
}

TEST(OomEvents, FindsTheFileOfThisCgroupOrTheContainersRoot) {
  const fs::path root = fs::path(testing::TempDir()) / "oom_events_cgroup";
  fs::remove_all(root);
  // cgroup v2: the full path exists.
  Write(root / "app/worker/memory.events", "oom 1\noom_kill 1\n");
  EXPECT_EQ(OomEventsFile(root.string(), "0::/app/worker\n"),
            (root / "app/worker/memory.events").string());
  // cgroup v1 in a container: /proc/self/cgroup names the host's path, the
  // mount shows the container's cgroup at its root.
  Write(root / "memory/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n");
  EXPECT_EQ(OomEventsFile(root.string(), "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n"),
            (root / "memory/memory.oom_control").string());
  // A child cgroup of the container's (a test put the daemon there).
  Write(root / "memory/job7/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n");
  EXPECT_EQ(OomEventsFile(root.string(), "4:memory:/process_api/abc/job7\n"),
            (root / "memory/job7/memory.oom_control").string());
  // No memory controller: unknown.
  EXPECT_EQ(OomEventsFile(root.string(), "3:cpuset:/\n"), "");
  fs::remove_all(root);
}

}  // namespace
}  // namespace trainctl::worker
