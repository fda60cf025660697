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
