// Fresh scratch directories for tests, test harnesses and benchmarks.
//
// Threading: thread-safe (mkdtemp picks a unique name); a ScopedTempDir is
// owned by one thread.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace trainctl {

// Creates "$TMPDIR/<prefix>_XXXXXX" (/tmp when TMPDIR is unset or empty),
// mode 0700, and returns its path; "" when it cannot.
std::string MakeTempDir(absl::string_view prefix);

// MakeTempDir, and the directory is removed with everything in it when this
// process exits through exit() or a return from main (not in a child that
// forked from it, nor on a crash): for test helpers that hand out a path.
std::string MakeTempDirRemovedAtExit(absl::string_view prefix);

// A MakeTempDir directory that the destructor removes with everything in it,
// so that a test leaves nothing behind in /tmp. path() is "" when it could
// not be made.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(absl::string_view prefix) : path_(MakeTempDir(prefix)) {}
  ~ScopedTempDir();
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string File(absl::string_view name) const;

 private:
  std::string path_;
};

}  // namespace trainctl
