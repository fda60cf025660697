#include "common/jobspec/artifact_names.h"

#include <gtest/gtest.h>

namespace trainctl {
namespace {

TEST(ArtifactNamesTest, CheckpointNamesCarryTheJobAndOnlyDigits) {
  EXPECT_TRUE(IsCheckpointFileName("j-1", "j-1.ckpt-epoch-000002.pt"));
  EXPECT_TRUE(IsCheckpointFileName("j-1", "j-1.ckpt-epoch-000000-0000000030.pt"));
  EXPECT_FALSE(IsCheckpointFileName("j-1", "j-2.ckpt-epoch-000002.pt")) << "another job's";
  EXPECT_FALSE(IsCheckpointFileName("j", "j-1.ckpt-epoch-000002.pt"));
  EXPECT_FALSE(IsCheckpointFileName("j-1", "j-1.ckpt-epoch-.pt"));
  EXPECT_FALSE(IsCheckpointFileName("j-1", "j-1.ckpt-epoch-0001/../worker.key.pt"));
  EXPECT_FALSE(IsCheckpointFileName("j-1", "j-1.ckpt-epoch-000002.txt"));
  EXPECT_FALSE(IsCheckpointFileName("j-1", "worker.key"));
  EXPECT_FALSE(IsCheckpointFileName("", ".ckpt-epoch-000002.pt"));
  EXPECT_FALSE(IsCheckpointFileName("j-1", "j-1.ckpt-epoch-1234567890123.pt")) << "over 12 digits";
}

// A per-host copy names its writer, so hosts sharing one directory never
// write one path (#30 "one writer per path").
TEST(ArtifactNamesTest, PerHostCopiesCarryTheirWriter) {
  EXPECT_TRUE(IsCheckpointFileName("j-1", "j-1.ckpt-epoch-000002.w-ab12.pt"));
  EXPECT_TRUE(IsCheckpointFileName("j-1", "j-1.ckpt-epoch-000000-0000000030.host.example_1.pt"));
  EXPECT_FALSE(IsCheckpointFileName("j-1", "j-1.ckpt-epoch-000002..pt")) << "an empty writer";
  EXPECT_FALSE(IsCheckpointFileName("j-1", "j-1.ckpt-epoch-000002.a b.pt"));
  EXPECT_FALSE(IsCheckpointFileName("j-1", "j-1.ckpt-epoch-000002.a/b.pt"));
  EXPECT_FALSE(IsCheckpointFileName("j-1", "j-1.ckpt-epoch-00000x.w.pt"));
  std::optional<CheckpointNameParts> p = ParseCheckpointStem("000003-0000000640.w-1");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->epochs_done, 3);
  EXPECT_EQ(p->epoch_consumed, 640);
  EXPECT_EQ(p->writer, "w-1");
  p = ParseCheckpointStem("000004");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->writer, "");
  EXPECT_FALSE(ParseCheckpointStem("4-5-6").has_value());
  EXPECT_EQ(CheckpointWriterTag("w-1.host"), "w-1.host");
  EXPECT_EQ(CheckpointWriterTag("a/b"), "a_b");
}

TEST(ArtifactNamesTest, FinalModelAndManifestNamesCarryTheJob) {
  EXPECT_EQ(FinalModelFileName("j-1"), "j-1.model.pt");
  EXPECT_TRUE(IsFinalModelFileName("j-1", "j-1.model.pt"));
  EXPECT_FALSE(IsFinalModelFileName("j-1", "model.pt"));
  EXPECT_FALSE(IsFinalModelFileName("", ".model.pt"));
  EXPECT_EQ(JobManifestName("j-1"), "j-1.trainctl-job");
}

TEST(ArtifactNamesTest, OwnerComponentIsOneSafeName) {
  EXPECT_EQ(OwnerPathComponent("alice"), "alice");
  EXPECT_EQ(OwnerPathComponent("a/../b c"), "a_.._b_c");
  EXPECT_EQ(OwnerPathComponent(".."), "_..");
  EXPECT_EQ(OwnerPathComponent(""), "_");
}

TEST(ArtifactNamesTest, NormalDirPathIsLexical) {
  EXPECT_EQ(NormalDirPath("/a/b/"), "/a/b");
  EXPECT_EQ(NormalDirPath("/a//b/./c/../d"), "/a/b/d");
  EXPECT_EQ(NormalDirPath("/"), "/");
  EXPECT_EQ(NormalDirPath("ck/x/"), "ck/x");
}

}  // namespace
}  // namespace trainctl
