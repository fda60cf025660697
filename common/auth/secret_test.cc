// Token files (common/auth/secret.h): written 0600 and whole or not at all,
// also when the disk fails under them (the file writer's fault seam).
#include "common/auth/secret.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>

#include "common/safe_file.h"
#include "common/temp_dir.h"

namespace trainctl::auth {
namespace {

TEST(TokenFileTest, ATokenFileIsPrivateAndAFailedRewriteKeepsTheOldToken) {
  const std::string dir = MakeTempDir("secret_test");
  ASSERT_FALSE(dir.empty());
  const std::string path = dir + "/admin.token";
  bool created = false;
  absl::StatusOr<std::string> first = ReadOrCreateTokenFile(path, &created);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(created);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // The disk fills, then a rename fails: the token on disk is the old one,
  // whole, and the error names the file.
  for (int err : {ENOSPC, EIO}) {
    SetSafeFileFaultForTest([&](SafeFileStep step, const std::string& p, int64_t) {
      if (p != path) return 0;
      return (err == ENOSPC && step == SafeFileStep::kWrite) || (err == EIO && step == SafeFileStep::kRename) ? err : 0;
    });
    absl::Status s = WritePrivateFile(path, "tct_replacement\n");
    SetSafeFileFaultForTest(nullptr);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(SafeFileErrno(s), err) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(path));
    absl::StatusOr<std::string> again = ReadTokenFile(path);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, *first);
  }
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 1)
      << "no temporary file left";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trainctl::auth
