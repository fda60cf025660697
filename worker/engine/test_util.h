// Helpers shared by this folder's tests only: a per-test temp directory,
// file writers, and the testdata location. Test-only; used from the test
// thread only.
#pragma once

#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/temp_dir.h"
#include "gtest/gtest.h"

namespace trainctl::engine::testing_util {

inline std::string SourceDir() {
  const char* src = std::getenv("TRAINCTL_SOURCE_DIR");
  return src != nullptr ? src : ".";
}

inline std::string TestDataPath(const std::string& name) {
  return SourceDir() + "/worker/engine/testdata/" + name;
}

// A fresh directory for the running test, removed by the destructor.
class TempDir : public ScopedTempDir {
 public:
  TempDir() : ScopedTempDir("trainctl_engine") {
    if (path().empty()) ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
  }
};

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline void WriteGzipFile(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

}  // namespace trainctl::engine::testing_util
