#include "common/log.h"

#include <gtest/gtest.h>

namespace trainctl {
namespace {

TEST(LogTest, OneLineWithQuotedValuesWhereNeeded) {
  EXPECT_EQ(
      FormatLogLine("2026-01-01T00:00:00.000Z", LogLevel::kWarn, "worker",
                    "coordinator_unreachable",
                    {{"coordinator", "10.0.0.1:7070"},
                     {"reason", "failed to connect: Connection refused"},
                     {"retry_in", "400ms"},
                     {"quote", "say \"hi\"\nbye"},
                     {"empty", ""}}),
      "2026-01-01T00:00:00.000Z WARN worker coordinator_unreachable coordinator=10.0.0.1:7070 "
      "reason=\"failed to connect: Connection refused\" retry_in=400ms quote=\"say "
      "\\\"hi\\\"\\nbye\" empty=\"\"");
}

TEST(LogTest, LevelsParseAndFilter) {
  LogLevel l;
  ASSERT_TRUE(ParseLogLevel("debug", &l));
  EXPECT_EQ(l, LogLevel::kDebug);
  ASSERT_TRUE(ParseLogLevel("warning", &l));
  EXPECT_EQ(l, LogLevel::kWarn);
  EXPECT_FALSE(ParseLogLevel("verbose", &l));
  SetLogLevel(LogLevel::kError);
  EXPECT_EQ(GetLogLevel(), LogLevel::kError);
  testing::internal::CaptureStderr();
  LogEvent(LogLevel::kInfo, "test", "dropped");
  LogEvent(LogLevel::kError, "test", "kept", {{"k", "v"}});
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("dropped"), std::string::npos);
  EXPECT_NE(err.find(" ERROR test kept k=v\n"), std::string::npos) << err;
  SetLogLevel(LogLevel::kInfo);
}

TEST(LogTest, LogLevelFlagSetsTheLevelOrNamesTheFlag) {
  ASSERT_TRUE(SetLogLevelFlag("warn").ok());
  EXPECT_EQ(GetLogLevel(), LogLevel::kWarn);
  absl::Status bad = SetLogLevelFlag("verbose");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "--log-level: 'verbose' is not one of debug, info, warn, error");
  EXPECT_EQ(GetLogLevel(), LogLevel::kWarn);
  SetLogLevel(LogLevel::kInfo);
}

}  // namespace
}  // namespace trainctl
