#include "common/file_env.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>

namespace trainctl {
namespace {

namespace fs = std::filesystem;

class FileEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::canonical(::testing::TempDir()).string() + "/file_env_test_" +
           std::to_string(::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

// A name relative to a directory descriptor is matched by its full path;
// only the nth matching call fails, with the errno, and is not made.
TEST_F(FileEnvTest, TheNthMatchingCallFailsWithTheErrnoAndIsNotMade) {
  FaultFileEnv env;
  env.Inject({FileOp::kMkdir, dir_ + "/b", ENOSPC, /*nth=*/2});
  const int dfd = env.OpenAt(AT_FDCWD, dir_, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dfd, 0);
  EXPECT_EQ(FilePathAt(dfd, "x"), dir_ + "/x");
  EXPECT_EQ(env.MkdirAt(dfd, "a", 0700), 0) << "another prefix";
  EXPECT_EQ(env.MkdirAt(dfd, "b1", 0700), 0) << "the first match";
  errno = 0;
  EXPECT_EQ(env.MkdirAt(dfd, "b2", 0700), -1);
  EXPECT_EQ(errno, ENOSPC);
  EXPECT_FALSE(fs::exists(dir_ + "/b2"));
  EXPECT_EQ(env.MkdirAt(dfd, "b3", 0700), 0) << "the third match";
  EXPECT_EQ(env.injected(), 1);
  ::close(dfd);
}

// Every call of the operation fails while the fault is armed; a write's
// path is its descriptor's file; Clear ends the faults.
TEST_F(FileEnvTest, EveryMatchingCallFailsUntilCleared) {
  FaultFileEnv env;
  env.Inject({FileOp::kWrite, dir_ + "/f", EIO});
  const int fd = env.OpenAt(AT_FDCWD, dir_ + "/f", O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 3; ++i) {
    errno = 0;
    EXPECT_EQ(env.Write(fd, "x", 1), -1);
    EXPECT_EQ(errno, EIO);
  }
  env.Clear();
  EXPECT_EQ(env.Write(fd, "x", 1), 1);
  EXPECT_EQ(env.injected(), 3);
  ::close(fd);
  EXPECT_EQ(fs::file_size(dir_ + "/f"), 1u);
}

// A rename fails when either name matches; stat by path.
TEST_F(FileEnvTest, RenameMatchesEitherNameAndStatMatchesItsPath) {
  FaultFileEnv env;
  ASSERT_EQ(env.MkdirAt(AT_FDCWD, dir_ + "/src", 0700), 0);
  env.Inject({FileOp::kRename, dir_ + "/dst", EACCES});
  env.Inject({FileOp::kStat, dir_ + "/src", EIO});
  EXPECT_EQ(env.RenameAt(AT_FDCWD, dir_ + "/src", AT_FDCWD, dir_ + "/dst"), -1);
  EXPECT_EQ(errno, EACCES);
  struct stat st {};
  EXPECT_EQ(env.StatAt(AT_FDCWD, dir_ + "/src", &st), -1);
  EXPECT_EQ(errno, EIO);
  EXPECT_EQ(FileEnv::Default()->StatAt(AT_FDCWD, dir_ + "/src", &st), 0)
      << "the real env is untouched";
  EXPECT_EQ(env.RenameAt(AT_FDCWD, dir_ + "/src", AT_FDCWD, dir_ + "/other"), 0);
  EXPECT_TRUE(fs::is_directory(dir_ + "/other"));
}

}  // namespace
}  // namespace trainctl
