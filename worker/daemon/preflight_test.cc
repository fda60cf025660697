#include "worker/daemon/preflight.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "worker/daemon/job_dir.h"

namespace trainctl::worker {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class PreflightTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / "preflight_test";
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    ctx_.job_id = "j-1";
    ctx_.base_dir = dir_.string();
    ctx_.work_dir = (dir_ / "work").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Write(const std::string& rel, const std::string& bytes) {
    std::ofstream(dir_ / rel, std::ios::binary) << bytes;
  }
  static v1::JobSpec Spec(const std::string& yaml) {
    ParsedJobSpec p = ParseJobSpecYaml(yaml, "t.yaml", {});
    EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
    return p.spec;
  }
  static std::string Idx(int dims) {
    return std::string("\0\0\x08", 3) + std::string(1, static_cast<char>(dims)) + "rest";
  }

  fs::path dir_;
  PreflightContext ctx_;
};

const char kIdxJob[] =
    "name: t\nmodel: {name: mlp, input_dim: 4, classes: 2}\n"
    "data: {train: {format: idx, images: data/img, labels: data/lbl}}\n";

TEST_F(PreflightTest, PresentFilesWithTheirHeadersPass) {
  Write("data/img", Idx(3));
  Write("data/lbl",
        std::string("\x1f\x8b\x08\0gz", 6));  // gzip IDX (MNIST's .gz): inflated by the rank
  EXPECT_THAT(PreflightProblems(Spec(kIdxJob), ctx_), IsEmpty());
  EXPECT_TRUE(fs::is_directory(dir_ / "work/jobs/j-1/checkpoints"));
}

TEST_F(PreflightTest, MissingFileAndWrongHeaderAreEachNamed) {
  Write("data/img", Idx(1));  // labels where images belong
  EXPECT_THAT(PreflightProblems(Spec(kIdxJob), ctx_),
              ElementsAre("data.train.images " + (dir_ / "data/img").string() +
                              ": is an IDX file of 1 dimensions, expected 3",
                          "data.train.labels " + (dir_ / "data/lbl").string() + ": no such file"));
  Write("data/img", "P5 28 28");
  Write("data/lbl", Idx(1));
  EXPECT_THAT(PreflightProblems(Spec(kIdxJob), ctx_),
              ElementsAre(HasSubstr("data.train.images " + (dir_ / "data/img").string() +
                                    ": has no IDX header")));
}

TEST_F(PreflightTest, CsvMustBeNonEmptyAndCheckpointDirWritable) {
  Write("data/t.csv", "");
  Write("blocker", "a file where a directory should be");
  v1::JobSpec spec = Spec(
      "name: t\nmodel: {name: mlp, input_dim: 4, classes: 2}\n"
      "data: {train: {format: csv, path: data/t.csv}}\ncheckpoint: {dir: blocker/ckpt}\n");
  std::vector<std::string> problems = PreflightProblems(spec, ctx_);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[0], "data.train.path " + (dir_ / "data/t.csv").string() + ": is empty");
  EXPECT_THAT(problems[1], HasSubstr("checkpoint.dir"));
  EXPECT_THAT(problems[1], HasSubstr("blocker/ckpt"));
}

TEST_F(PreflightTest, NoRoomForOneCheckpointIsAProblem) {
  Write("data/img", Idx(3));
  Write("data/lbl", Idx(1));
  ctx_.checkpoint_bytes = int64_t{1} << 60;  // an exabyte: no disk has it free
  std::vector<std::string> problems = PreflightProblems(Spec(kIdxJob), ctx_);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_THAT(problems[0], HasSubstr("bytes free, one checkpoint needs 1152921504606846976"));
}

TEST_F(PreflightTest, CommandChecksWorkingDirAndProgram) {
  ctx_.allow_commands = true;
  EXPECT_THAT(PreflightProblems(Spec("name: t\ncommand: {argv: [sh, -c, 'true']}\n"), ctx_),
              IsEmpty());
  EXPECT_THAT(PreflightProblems(Spec("name: t\ncommand: {argv: [no-such-program-xyz]}\n"), ctx_),
              ElementsAre(absl::StrCat(
                  "command.argv[0] no-such-program-xyz: not found on this worker's PATH (",
                  std::getenv("PATH"), ")")));
  // The interpreter of `trainctl run/submit train.py` says where it came from.
  EXPECT_THAT(
      PreflightProblems(Spec("name: t\ncommand: {argv: [python9.99-nothere, t.py]}\n"), ctx_),
      ElementsAre(
          AllOf(HasSubstr("command.argv[0] python9.99-nothere: not found on this worker's PATH"),
                HasSubstr("(the Python interpreter: `trainctl run/submit --python`)"))));
  EXPECT_THAT(
      PreflightProblems(Spec("name: t\ncommand: {argv: [/opt/nothere/bin/python3, t.py]}\n"), ctx_),
      ElementsAre("command.argv[0] /opt/nothere/bin/python3: no such file (the Python interpreter: "
                  "`trainctl run/submit --python`)"));
  EXPECT_THAT(PreflightProblems(
                  Spec("name: t\ncommand: {argv: [./train.py], working_dir: nowhere}\n"), ctx_),
              ElementsAre("command.working_dir " + (dir_ / "nowhere").string() +
                          ": not a directory on this worker"));
  EXPECT_THAT(
      PreflightProblems(Spec("name: t\ncommand: {argv: [./train.py], working_dir: data}\n"), ctx_),
      ElementsAre("command.argv[0] " + (dir_ / "data/train.py").string() + ": no such file"));
  ctx_.allow_commands = false;
  EXPECT_THAT(PreflightProblems(Spec("name: t\ncommand: {argv: [sh]}\n"), ctx_),
              ElementsAre(HasSubstr("this worker does not run commands")));
}

TEST_F(PreflightTest, GpuSlotWithoutItsDeviceNodeIsNamed) {
  Write("data/img", Idx(3));
  Write("data/lbl", Idx(1));
  fs::create_directories(dir_ / "dev");
  std::ofstream(dir_ / "dev/nvidia0") << "";
  ctx_.dev_dir = (dir_ / "dev").string();
  ctx_.gpu_indices = {0, 1};
  std::vector<std::string> problems = PreflightProblems(Spec(kIdxJob), ctx_);
  ASSERT_FALSE(problems.empty());
  EXPECT_EQ(problems[0], "GPU 1: " + (dir_ / "dev/nvidia1").string() +
                             " is missing (the device is not visible to this worker)");
  // NCCL: whether it loads depends on the host; when it does not, it is named.
  for (size_t i = 1; i < problems.size(); ++i) {
    EXPECT_THAT(problems[i], HasSubstr("NCCL: libnccl.so.2 does not load on this worker"));
  }
}

TEST_F(PreflightTest, AnotherOwnersCheckpointDirIsRefusedNamingTheOwner) {
  Write("data/img", Idx(3));
  Write("data/lbl", std::string("\x1f\x8b\x08\0gz", 6));
  const std::string team = (dir_ / "team").string();
  ASSERT_TRUE(ClaimCheckpointDir(team, "a-1", "alice", "").ok());
  const v1::JobSpec spec = Spec(std::string(kIdxJob) + "checkpoint: {dir: team}\n");
  ctx_.owner = "bob";
  std::vector<std::string> problems = PreflightProblems(spec, ctx_);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_THAT(problems[0],
              HasSubstr("checkpoint.dir " + team + " belongs to 'alice' (claimed by job a-1)"));
  ctx_.resume_owner = "alice";
  EXPECT_THAT(PreflightProblems(spec, ctx_), IsEmpty()) << "bob resumes alice's job";
  ctx_.owner = "alice";
  ctx_.resume_owner = "";
  EXPECT_THAT(PreflightProblems(spec, ctx_), IsEmpty());
}

TEST_F(PreflightTest, WithACheckpointRootTheDefaultDirIsTheOwnersOwn) {
  Write("data/img", Idx(3));
  Write("data/lbl", std::string("\x1f\x8b\x08\0gz", 6));
  fs::create_directories(dir_ / "roots");
  ctx_.checkpoint_roots = {fs::canonical(dir_ / "roots").string()};
  ctx_.owner = "al/ice";
  EXPECT_THAT(PreflightProblems(Spec(kIdxJob), ctx_), IsEmpty());
  EXPECT_TRUE(fs::is_directory(dir_ / "roots/al_ice/j-1"));
}

}  // namespace
}  // namespace trainctl::worker
