// The source tree, for tests that read examples/ or tests/support/ files:
// $TRAINCTL_SOURCE_DIR (set by ctest, trainctl_test in cmake/), else the
// path the test was built from (TRAINCTL_SOURCE_DIR_FALLBACK, a compile
// definition in tests/CMakeLists.txt).
#pragma once

#include <cstdlib>
#include <string>

namespace trainctl::testing {

inline std::string SourceDir() {
  const char* s = std::getenv("TRAINCTL_SOURCE_DIR");
  return s != nullptr ? s : TRAINCTL_SOURCE_DIR_FALLBACK;
}

}  // namespace trainctl::testing
