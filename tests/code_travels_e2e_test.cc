// Code travels with the job (docs/command-jobs.md): `trainctl submit
// train.py` from a directory no worker reads packs it, the coordinator
// stores it once, and each worker that runs a rank fetches it and runs the
// script in its own copy. Real coordinator, two real worker daemons (one
// rank each, so both fetch), the real CLI.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/support/cluster.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using trainctl::testing::Cluster;
using trainctl::testing::Process;

class CodeTravelsE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string build = trainctl::testing::BuildDirOfThisTest();
    cluster_ = std::make_unique<Cluster>(build, "/bin/false");
    ASSERT_TRUE(cluster_->StartCoordinator());
    ASSERT_TRUE(cluster_->StartWorker("w0", 1, false, {"--allow_commands"}));
    ASSERT_TRUE(cluster_->StartWorker("w1", 1, false, {"--allow_commands"}));
    ASSERT_TRUE(cluster_->WaitWorkers(2));
    // The user's checkout: outside the cluster's directory, gone before
    // the job runs.
    project_ = absl::StrCat(cluster_->dir(), "-project");
    MakeProject();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(project_, ec);
  }

  void MakeProject() {
    fs::create_directories(project_ + "/data");
    std::ofstream(project_ + "/train.py")
        << "import os, sys\n"
           "import helper\n"
           "print('cwd', os.getcwd())\n"
           "print('data', open('data/words.txt').read().strip())\n"
           "print('helper', helper.NAME)\n"
           "print('ignored files here:', os.path.exists('big.bin'),"
           " os.path.exists('notes.txt'))\n";
    std::ofstream(project_ + "/helper.py") << "NAME = 'shipped helper'\n";
    std::ofstream(project_ + "/data/words.txt") << "hello from the laptop\n";
    std::ofstream(project_ + "/.gitignore") << "*.bin\n";
    std::ofstream(project_ + "/.trainctlignore") << "notes.txt\n";
    std::ofstream(project_ + "/big.bin") << std::string(1 << 20, 'x');
    std::ofstream(project_ + "/notes.txt") << "not for the cluster\n";
  }

  // `trainctl submit ARGS...` run in the project directory; its output.
  std::string Submit(const std::vector<std::string>& args, int* exit_code) {
    const std::string build = trainctl::testing::BuildDirOfThisTest();
    std::vector<std::string> argv = {build + "/client/trainctl", "--coordinator",
                                     cluster_->address(),        "--token-file",
                                     cluster_->AdminTokenFile(), "submit"};
    argv.insert(argv.end(), args.begin(), args.end());
    Process p(argv, absl::StrCat(cluster_->dir(), "/submit-", ++submits_, ".log"), project_);
    EXPECT_TRUE(p.Start());
    const int status = p.Wait(absl::Seconds(60));
    *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return p.ReadLog();
  }

  static std::string JobId(const std::string& out) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(out, m, std::regex("submitted job (\\S+)"))) << out;
    return m.empty() ? "" : m[1].str();
  }

  std::unique_ptr<Cluster> cluster_;
  std::string project_;
  int submits_ = 0;
};

TEST_F(CodeTravelsE2ETest, AScriptRunsFromItsShippedCodeOnEveryWorkerAndIsStoredOnce) {
  int code = -1;
  std::string out =
      Submit({"--nproc-per-node", "2", "--python", "/usr/bin/python3", "train.py"}, &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("uploaded"));
  const std::string id = JobId(out);
  // Nothing on any disk but what was shipped.
  fs::remove_all(project_);
  v1::Job job = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(90));
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_reason();
  EXPECT_TRUE(job.spec().command().code().digest().rfind("sha256:", 0) == 0)
      << job.spec().DebugString();
  EXPECT_TRUE(job.spec().command().working_dir().empty());
  for (int rank : {0, 1}) {
    const std::string log = cluster_->RankLog(id, 1, rank);
    EXPECT_THAT(log, HasSubstr("data hello from the laptop")) << log;
    EXPECT_THAT(log, HasSubstr("helper shipped helper"));
    EXPECT_THAT(log, HasSubstr("ignored files here: False False"));
    EXPECT_THAT(log, HasSubstr("/attempt-1/code"));
  }

  // The same tree again: nothing is sent, and it runs the same.
  MakeProject();
  out = Submit({"--nproc-per-node", "2", "--python", "/usr/bin/python3", "train.py"}, &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("already stored"));
  const std::string again = JobId(out);
  job = cluster_->WaitState(again, v1::JOB_STATE_SUCCEEDED, absl::Seconds(90));
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_reason();
  EXPECT_THAT(cluster_->RankLog(again, 1, 1), HasSubstr("data hello from the laptop"));
}

TEST_F(CodeTravelsE2ETest, ALinkOutOfTheTreeIsRefusedBeforeAnythingIsSent) {
  fs::create_symlink("/etc/hostname", project_ + "/outside");
  int code = -1;
  const std::string out = Submit({"--python", "/usr/bin/python3", "train.py"}, &code);
  EXPECT_NE(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("outside"));
  EXPECT_THAT(out, Not(HasSubstr("submitted job")));
}

}  // namespace
}  // namespace trainctl
