// OomKillCounter: how many processes the kernel's OOM killer has killed in
// the memory cgroup this daemon (and so every rank it launches) runs in.
//
// A rank that dies of SIGKILL the daemon did not send was killed from
// outside; when this count rose between the rank's launch and its exit, the
// OOM killer did it, and the failure is FAILURE_KIND_OUT_OF_MEMORY instead
// of a crash (docs/failures.md). Reads cgroup v2 `memory.events` (the
// `oom_kill` line) or cgroup v1 `memory.oom_control` (its `oom_kill` line,
// kernels >= 4.13), for the path /proc/self/cgroup names; in a container
// whose cgroup filesystem is mounted at its own cgroup's root, the path
// resolves to the mount root.
//
// Not a guarantee: another process of the same cgroup may have been the
// one killed. The daemon reports "killed by the OOM killer" only for a
// SIGKILL it did not send, which makes a false attribution unlikely.
//
// Stateless functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace trainctl::worker {

// The value of the `key N` line of a flat keyed cgroup file (memory.events,
// memory.oom_control), or nullopt when it has none.
std::optional<int64_t> ParseKeyedValue(absl::string_view text, absl::string_view key);
// The `oom_kill N` value of a memory.events / memory.oom_control text, or
// nullopt when it has none.
inline std::optional<int64_t> ParseOomKillCount(absl::string_view text) {
  return ParseKeyedValue(text, "oom_kill");
}

// One line of /proc/self/cgroup: "0::/path" (cgroup v2) or
// "4:memory,cpu:/path" (v1: the hierarchy's controllers).
struct ProcCgroupLine {
  bool v2 = false;
  std::vector<std::string> controllers;  // v1 only
  std::string path;
};
// The well-formed lines of a /proc/self/cgroup text.
std::vector<ProcCgroupLine> ParseProcSelfCgroup(absl::string_view text);

// The memory cgroup's events file of this process (under `cgroup_root`,
// normally /sys/fs/cgroup), or "" when none can be found. `proc_self_cgroup`
// is the text of /proc/self/cgroup.
std::string OomEventsFile(const std::string& cgroup_root, absl::string_view proc_self_cgroup);

// The current count for this process's cgroup, or nullopt when unknown.
std::optional<int64_t> ReadOomKillCount();

}  // namespace trainctl::worker
