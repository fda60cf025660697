#include "worker/daemon/oom_events.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace trainctl::worker {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::optional<int64_t> ParseKeyedValue(absl::string_view text, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t v = 0;
    if (words.size() == 2 && words[0] == key && absl::SimpleAtoi(words[1], &v)) return v;
  }
  return std::nullopt;
}

std::vector<ProcCgroupLine> ParseProcSelfCgroup(absl::string_view text) {
  std::vector<ProcCgroupLine> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    ProcCgroupLine& l = out.emplace_back();
    l.v2 = parts[0] == "0" && parts[1].empty();
    if (!l.v2) l.controllers = absl::StrSplit(parts[1], ',');
    l.path = std::string(parts[2]);
  }
  return out;
}

std::string OomEventsFile(const std::string& cgroup_root, absl::string_view proc_self_cgroup) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // Candidates: (file relative to the hierarchy, hierarchy mount, cgroup path).
  struct Candidate {
    std::string mount;
    std::string file;
    std::string path;
  };
  std::vector<Candidate> candidates;
  for (const ProcCgroupLine& l : ParseProcSelfCgroup(proc_self_cgroup)) {
    if (l.v2) {
      candidates.push_back({cgroup_root, "memory.events", l.path});
      candidates.push_back({cgroup_root + "/unified", "memory.events", l.path});
    } else {
      for (const std::string& c : l.controllers) {
        if (c == "memory")
          candidates.push_back({cgroup_root + "/memory", "memory.oom_control", l.path});
      }
    }
  }
  for (const Candidate& c : candidates) {
    // The full path first, then shorter suffixes of it: a container sees its
    // own cgroup at the mount root while /proc/self/cgroup names the host's.
    absl::string_view path = c.path;
    while (true) {
      std::string file =
          c.mount + std::string(path) + (absl::EndsWith(path, "/") ? "" : "/") + c.file;
      if (fs::exists(file, ec) && ParseOomKillCount(ReadFile(file)).has_value()) return file;
      if (path.empty() || path == "/") break;
      size_t slash = path.find('/', 1);
      path = slash == absl::string_view::npos ? absl::string_view("/") : path.substr(slash);
    }
  }
  return "";
}

std::optional<int64_t> ReadOomKillCount() {
  static const std::string file = OomEventsFile("/sys/fs/cgroup", ReadFile("/proc/self/cgroup"));
  if (file.empty()) return std::nullopt;
  return ParseOomKillCount(ReadFile(file));
}

}  // namespace trainctl::worker
