#include "common/daemon_flags.h"

#include <gtest/gtest.h>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, some_test_flag, "x-y", "a flag for the help test");

namespace trainctl {
namespace {

TEST(DaemonFlags, KebabNamesBecomeAbseilsSpellingValuesUntouched) {
  EXPECT_EQ(SnakeCaseFlagArg("--work-dir=/a-b/c-d"), "--work_dir=/a-b/c-d");
  EXPECT_EQ(SnakeCaseFlagArg("--gone-worker-ttl-s"), "--gone_worker_ttl_s");
  EXPECT_EQ(SnakeCaseFlagArg("--work_dir=x"), "--work_dir=x");
  EXPECT_EQ(SnakeCaseFlagArg("a-value"), "a-value");
  EXPECT_EQ(SnakeCaseFlagArg("-h"), "-h");
  EXPECT_EQ(SnakeCaseFlagArg("--"), "--");
  EXPECT_EQ(SnakeCaseFlagArg("---x-y"), "---x-y");
}

TEST(DaemonFlags, HelpListsOnlyThisFilesFlagsInKebabCase) {
  std::string help = DaemonFlagsHelp("usage line", "common/daemon_flags_test.cc");
  EXPECT_NE(help.find("usage line"), std::string::npos);
  EXPECT_NE(help.find("--some-test-flag (default: \"x-y\")\n      a flag for the help test"),
            std::string::npos)
      << help;
  EXPECT_EQ(help.find("some_test_flag"), std::string::npos) << help;
}

TEST(DaemonFlags, BothSpellingsParse) {
  std::string a0 = "prog", a1 = "--some-test-flag=kebab";
  char* argv[] = {a0.data(), a1.data()};
  ParseDaemonFlags(2, argv, "usage", "common/daemon_flags_test.cc");
  EXPECT_EQ(absl::GetFlag(FLAGS_some_test_flag), "kebab");
}

TEST(DaemonFlags, UmaskIsOctalUpTo0777) {
  EXPECT_EQ(*ParseUmask("0077"), 077u);
  EXPECT_EQ(*ParseUmask("027"), 027u);
  EXPECT_EQ(*ParseUmask("0"), 0u);
  for (const char* bad : {"", "8", "0o77", "77777", "-1", "0x1f", "1777"}) {
    absl::StatusOr<mode_t> m = ParseUmask(bad);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(m.status().message().find("--umask"), std::string::npos);
  }
}

}  // namespace
}  // namespace trainctl
