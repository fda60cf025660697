#include "common/temp_dir.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"

namespace trainctl {

std::string MakeTempDir(absl::string_view prefix) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string pattern =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/", prefix, "_XXXXXX");
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) return "";
  return buf.data();
}

namespace {

struct AtExitDirs {
  std::mutex mu;
  std::vector<std::string> paths;
  pid_t owner = getpid();
};

// Never destroyed: the atexit handler may run after static destructors.
AtExitDirs& Dirs() {
  static AtExitDirs* dirs = new AtExitDirs;
  return *dirs;
}

void RemoveAtExitDirs() {
  AtExitDirs& d = Dirs();
  std::lock_guard<std::mutex> lock(d.mu);
  if (getpid() != d.owner) return;  // a forked child's exit: not its directories
  std::error_code ec;
  for (const std::string& p : d.paths) std::filesystem::remove_all(p, ec);
  d.paths.clear();
}

}  // namespace

std::string MakeTempDirRemovedAtExit(absl::string_view prefix) {
  std::string dir = MakeTempDir(prefix);
  if (dir.empty()) return dir;
  static std::once_flag registered;
  std::call_once(registered, [] {
    Dirs();
    std::atexit(RemoveAtExitDirs);
  });
  AtExitDirs& d = Dirs();
  std::lock_guard<std::mutex> lock(d.mu);
  d.paths.push_back(dir);
  return dir;
}

ScopedTempDir::~ScopedTempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

std::string ScopedTempDir::File(absl::string_view name) const {
  return absl::StrCat(path_, "/", name);
}

}  // namespace trainctl
