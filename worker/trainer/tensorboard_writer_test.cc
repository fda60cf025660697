#include "worker/trainer/tensorboard_writer.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainctl::trainer {
namespace {

TEST(TensorBoardWriter, Crc32cOfTheStandardCheckString) {
  // The CRC-32C check value (RFC 3720, appendix B.4).
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST(TensorBoardWriter, FramingIsLengthCrcDataCrc) {
  std::string r = FrameRecord("abc");
  ASSERT_EQ(r.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(r.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(r.substr(12, 3), "abc");
}

// The file decoded by an independent reader (Python: its own CRC-32C and
// Google's protobuf runtime on TensorBoard's schema).
TEST(TensorBoardWriter, AnIndependentReaderDecodesTheScalars) {
  const char* src = std::getenv("TRAINCTL_SOURCE_DIR");
  if (src == nullptr || access("/usr/bin/python3", X_OK) != 0 ||
      access("/usr/bin/protoc", X_OK) != 0) {
    GTEST_SKIP() << "needs TRAINCTL_SOURCE_DIR, /usr/bin/python3 and protoc";
  }
  char tmpl[] = "/tmp/tensorboard_writer_test_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  {
    auto w = TensorBoardWriter::Open(dir + "/tb");
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Write(10, {{"train/loss", 0.5f}, {"train/lr", 0.001f}}).ok());
    ASSERT_TRUE((*w)->Write(20, {{"eval/accuracy", 0.875f}}).ok());
  }
  const std::string out = dir + "/out.jsonl";
  const std::string cmd = absl::StrCat("/usr/bin/python3 ", src, "/tests/support/read_tfevents.py ",
                                       dir, "/tb > ", out, " 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::string text;
  {
    FILE* f = std::fopen(out.c_str(), "r");
    ASSERT_NE(f, nullptr);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    std::fclose(f);
  }
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << text;
  EXPECT_EQ(lines[0], "{\"file_version\": \"brain.Event:2\"}");
  EXPECT_NE(lines[1].find("\"step\": 10"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("\"train/loss\": 0.5"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("\"train/lr\": 0.0010000000474974513"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find("\"step\": 20"), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find("\"eval/accuracy\": 0.875"), std::string::npos) << lines[2];
  std::filesystem::remove_all(dir);
}

TEST(TensorBoardWriter, AnUnwritableDirectoryIsNamed) {
  auto w = TensorBoardWriter::Open("/proc/self/no/such/dir");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(std::string(w.status().message()).find("tensorboard.dir '/proc/self/no/such/dir'"),
            std::string::npos)
      << w.status();
}

TEST(TensorBoardWriter, ALinkInTheDirectoryPathIsNotFollowed) {
  char tmpl[] = "/tmp/tbwriter-link-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string target = dir + "/target";
  std::filesystem::create_directory(target);
  std::filesystem::create_directory_symlink(target, dir + "/link");
  for (const std::string& p : {dir + "/link", dir + "/link/tb"}) {
    auto w = TensorBoardWriter::Open(p);
    ASSERT_FALSE(w.ok()) << p;
    EXPECT_NE(std::string(w.status().message()).find("symbolic link"), std::string::npos)
        << w.status();
  }
  EXPECT_TRUE(std::filesystem::is_empty(target)) << "nothing made through the link";
  std::filesystem::remove_all(dir);
}

// The one tag table: an engine rank's window writes every field (a 0 is a
// value there); a command job's report only what its line named (a 0 it
// named included), plus its own scalars under their own names; its eval
// report only eval tags.
TEST(TensorBoardTest, MetricScalarsTagEngineWindowsAndCommandReports) {
  rankproto::RankMetric m;
  m.loss = 0.5;
  m.lr = 0.1;
  auto tags = [](const std::vector<std::pair<std::string, float>>& v) {
    std::vector<std::string> out;
    for (const auto& [tag, value] : v) out.push_back(tag);
    return out;
  };
  EXPECT_EQ(tags(MetricScalars(m)),
            (std::vector<std::string>{"train/loss", "train/lr", "train/samples_per_sec",
                                      "train/step_ms/data", "train/step_ms/compute",
                                      "train/step_ms/comm"}));
  m.kind = "epoch_end";
  m.has_eval = true;
  m.eval_accuracy = 0.9;
  EXPECT_EQ(tags(MetricScalars(m)), (std::vector<std::string>{"epoch/loss", "epoch/samples_per_sec",
                                                              "eval/loss", "eval/accuracy"}));

  auto parsed = [](const char* line) {
    absl::StatusOr<rankproto::StatusMessage> msg = rankproto::ParseStatusLine(line);
    EXPECT_TRUE(msg.ok()) << msg.status();
    return msg.ok() ? msg->metric : rankproto::RankMetric{};
  };
  std::vector<std::pair<std::string, float>> reported =
      MetricScalars(parsed("metric kind=train epoch=0 step=3 loss=0 lr=0.1 s.val_f1=0.75"));
  EXPECT_EQ(tags(reported), (std::vector<std::string>{"train/loss", "train/lr", "val_f1"}));
  EXPECT_FLOAT_EQ(reported.front().second, 0.0f);
  EXPECT_FLOAT_EQ(reported.back().second, 0.75f);
  EXPECT_EQ(
      tags(MetricScalars(parsed("metric kind=eval epoch=1 step=8 eval_accuracy=0.5 s.val_f1=0.8"))),
      (std::vector<std::string>{"eval/accuracy", "val_f1"}));
  EXPECT_EQ(tags(MetricScalars(
                parsed("metric kind=eval epoch=1 step=8 steps_per_epoch=4 eval_loss=0.2"))),
            (std::vector<std::string>{"eval/loss"}));
}

}  // namespace
}  // namespace trainctl::trainer
