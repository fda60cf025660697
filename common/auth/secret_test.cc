// Token files (common/auth/secret.h): written 0600 and whole or not at all,
// also when the disk fails under them (the file writer's fault seam); and
// the loopback rule that keeps a token from crossing the network in clear.
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
    FaultFileEnv env;
    env.Inject({err == ENOSPC ? FileOp::kWrite : FileOp::kRename,
                std::filesystem::canonical(path).string(), err});
    absl::Status s = WritePrivateFile(path, "tct_replacement\n", &env);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(SafeFileErrno(s), err) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(path));
    absl::StatusOr<std::string> again = ReadTokenFile(path);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, *first);
  }
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            1)
      << "no temporary file left";
  std::filesystem::remove_all(dir);
}

// The one loopback rule (the coordinator's plaintext listener, clients'
// plaintext token): by address, never by a name that merely looks local.
TEST(LoopbackTest, OnlyAddressesOfThisHostAreLoopback) {
  for (const char* local : {"127.0.0.1:7070", "127.1.2.3:1", "localhost:7070", "LOCALHOST:1",
                            "[::1]:7070", "::1", "[::ffff:127.0.0.1]:80", "unix:/run/trainctl.sock",
                            "dns:///localhost:7070", "ipv4:127.0.0.1:7070", "127.0.0.1"}) {
    EXPECT_TRUE(IsLoopbackAddress(local)) << local;
  }
  for (const char* remote :
       {"10.0.0.1:7070", "192.0.2.2:7070", "0.0.0.0:7070", "[::]:7070", "coord:7070",
        "127.evil.example:7070", "localhost.evil.example:7070", "[fd00::2]:7070",
        "[::ffff:10.0.0.1]:7070", ":7070", "", "[::1", "dns:///coord:7070", "128.0.0.1:7070"}) {
    EXPECT_FALSE(IsLoopbackAddress(remote)) << remote;
  }
}

TEST(LoopbackTest, ATokenInClearTextGoesOnlyToLoopback) {
  EXPECT_TRUE(CheckTokenTransport("127.0.0.1:7070", "secret", "").ok());
  EXPECT_TRUE(CheckTokenTransport("coord:7070", "secret", "/etc/trainctl/ca.crt").ok()) << "TLS";
  EXPECT_TRUE(CheckTokenTransport("coord:7070", "", "").ok()) << "no token to leak";
  absl::Status refused = CheckTokenTransport("192.0.2.2:7070", "secret", "");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(),
              ::testing::HasSubstr("refusing to send the token in clear text to 192.0.2.2:7070"));
  EXPECT_THAT(refused.message(),
              ::testing::HasSubstr("--ca FILE, $TRAINCTL_CA or `ca:` in the config file"));
  EXPECT_THAT(refused.message(), ::testing::Not(::testing::HasSubstr("secret")));
}

}  // namespace
}  // namespace trainctl::auth
