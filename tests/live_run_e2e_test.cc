// Issue #44 item 6: a local run still going answers `--run RUN` itself
// (status, describe, metrics, checkpoints, logs -f) through the live.txt it
// keeps in its directory, with no token to type; once it is over, --run reads
// its database as before; a live.txt left by a killed run, or one whose
// address no longer answers, falls back to the database within seconds.
//
// The job is a script that waits for a file the test creates: the run lasts
// exactly as long as the test needs, on any machine.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/support/cluster.h"
#include "tests/support/ports.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Rank 0 says hello and reports a loss, then waits for the file named by its
// first argument, says bye and exits 0.
constexpr char kScript[] =
    "import os, sys, time\n"
    "import trainctl\n"
    "print('hello from rank ' + os.environ['RANK'], flush=True)\n"
    "trainctl.report(step=1, epoch=0, loss=0.625)\n"
    "while not os.path.exists(sys.argv[1]):\n"
    "    time.sleep(0.05)\n"
    "print('bye from rank ' + os.environ['RANK'], flush=True)\n";

constexpr absl::Duration kDeadline = absl::Seconds(120);

class LiveRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
    char tmpl[] = "/tmp/trainctl-live-run-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream(dir_ + "/live.py") << kScript;
  }
  void TearDown() override {
    // Whatever a killed run left waiting ends.
    for (const std::string& go : gos_) std::ofstream(go) << "";
    if (!dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }

  // `trainctl ARGS...` with this test's runs directory, started.
  std::unique_ptr<trainctl::testing::Process> Start(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"/usr/bin/env", "TRAINCTL_RUNS_DIR=" + dir_ + "/runs",
                                     trainctl::testing::BuildDirOfThisTest() + "/client/trainctl"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto p = std::make_unique<trainctl::testing::Process>(
        argv, absl::StrCat(dir_, "/cli-", ++n_, ".log"), dir_);
    EXPECT_TRUE(p->Start());
    return p;
  }
  // Runs `trainctl ARGS...` to its end: exit code (-1: not exited within
  // the deadline, or killed) and output.
  std::pair<int, std::string> Cli(const std::vector<std::string>& args,
                                  absl::Duration deadline = kDeadline) {
    std::unique_ptr<trainctl::testing::Process> p = Start(args);
    const int status = p->Wait(deadline);
    return {status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1, p->ReadLog()};
  }
  // Polls `done` until it holds or the deadline passes.
  static bool WaitFor(const std::function<bool()>& done, absl::Duration deadline = kDeadline) {
    const absl::Time end = absl::Now() + deadline;
    while (absl::Now() < end) {
      if (done()) return true;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return done();
  }
  // A `trainctl run` of the script, waiting for `go`, once rank 0 said hello.
  std::unique_ptr<trainctl::testing::Process> StartRun(const std::string& go) {
    gos_.push_back(go);
    std::unique_ptr<trainctl::testing::Process> run =
        Start({"run", "--nproc-per-node", "1", "--python", "/usr/bin/python3", "live.py", go});
    EXPECT_TRUE(WaitFor([&] { return absl::StrContains(run->ReadLog(), "hello from rank 0"); }))
        << run->ReadLog();
    return run;
  }
  // The only run's directory under the runs directory.
  std::string RunDir(const std::string& job) {
    auto [code, out] = Cli({"runs"});
    std::smatch m;
    const std::string pattern = absl::StrCat("(\\S+) +", job);
    if (code != 0 || !std::regex_search(out, m, std::regex(pattern))) return "";
    return absl::StrCat(dir_, "/runs/", m[1].str());
  }

  std::string dir_;
  std::vector<std::string> gos_;
  int n_ = 0;
};

std::string JobOf(const std::string& run_log) {
  std::smatch m;
  return std::regex_search(run_log, m, std::regex("submitted job (\\S+)")) ? m[1].str() : "";
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0;
}

TEST_F(LiveRunTest, ARunningRunAnswersRunVerbsAndAfterItEndsItsDatabaseDoes) {
  const std::string go = dir_ + "/go";
  std::unique_ptr<trainctl::testing::Process> run = StartRun(go);
  const std::string job = JobOf(run->ReadLog());
  ASSERT_FALSE(job.empty()) << run->ReadLog();

  // Ranks report ready a little after their first line: RUNNING soon.
  std::string out;
  int code = -1;
  ASSERT_TRUE(WaitFor([&] {
    std::tie(code, out) = Cli({"--run", "latest", "status"});
    return code == 0 && absl::StrContains(out, "RUNNING");
  })) << code
      << "\n"
      << out << "\n"
      << run->ReadLog();
  EXPECT_THAT(out, HasSubstr(job));
  EXPECT_THAT(out, Not(HasSubstr("locked")));

  const std::string run_dir = RunDir(job);
  ASSERT_FALSE(run_dir.empty());
  EXPECT_EQ(ModeOf(run_dir + "/live.txt"), 0600u) << "only this user reads the live run's token";
  EXPECT_EQ(ModeOf(run_dir), 0700u);
  std::tie(code, out) = Cli({"runs"});
  EXPECT_THAT(out, testing::ContainsRegex(absl::StrCat(job, " +live"))) << out;

  // By its name too, and every reading verb.
  const std::string run_name = run_dir.substr(run_dir.rfind('/') + 1);
  std::tie(code, out) = Cli({"describe", "--run", run_name});
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr(job));
  std::tie(code, out) = Cli({"checkpoints", "--run", "latest"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("no checkpoint"));
  // The live run's token only reads: cancel is refused, saying how to stop it.
  std::tie(code, out) = Cli({"--run", "latest", "cancel", job});
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr("has role viewer"));
  EXPECT_THAT(out, HasSubstr("stop the run with Ctrl-C"));
  ASSERT_TRUE(WaitFor([&] {
    std::tie(code, out) = Cli({"metrics", "--run", "latest", "-o", "csv"});
    return code == 0 && absl::StrContains(out, "0.625");
  })) << code
      << "\n"
      << out;

  // logs -f streams the run's lines as they come, and ends with the job.
  std::unique_ptr<trainctl::testing::Process> logs = Start({"logs", "-f", "--run", "latest"});
  ASSERT_TRUE(WaitFor([&] { return absl::StrContains(logs->ReadLog(), "hello from rank 0"); }))
      << logs->ReadLog();
  EXPECT_THAT(logs->ReadLog(), Not(HasSubstr("bye from rank 0")));
  std::ofstream(go) << "";
  int status = logs->Wait(kDeadline);
  ASSERT_TRUE(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n"
                                                                            << logs->ReadLog();
  EXPECT_THAT(logs->ReadLog(), HasSubstr("bye from rank 0"));

  status = run->Wait(kDeadline);
  ASSERT_TRUE(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n"
                                                                            << run->ReadLog();
  EXPECT_NE(access((run_dir + "/live.txt").c_str(), F_OK), 0)
      << "the live record goes with the run";

  // Over: the database answers.
  std::tie(code, out) = Cli({"--run", "latest", "status"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("SUCCEEDED"));

  // A live record whose process is there (this test's) but whose address
  // answers nothing: the database, after a bounded wait.
  const int port = trainctl::testing::UnusedPort();
  std::ofstream(run_dir + "/live.txt")
      << "address=127.0.0.1:" << port << "\ntoken=tct_t-00000000_00\npid=" << getpid() << "\n";
  const absl::Time asked = absl::Now();
  std::tie(code, out) = Cli({"--run", "latest", "status"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("SUCCEEDED"));
  EXPECT_LT(absl::Now() - asked, absl::Seconds(60))
      << "bounded by the live connect timeout (3 s), not a hang";
}

TEST_F(LiveRunTest, AKilledRunsLiveRecordFallsBackToTheDatabase) {
  std::unique_ptr<trainctl::testing::Process> run = StartRun(dir_ + "/go-killed");
  const std::string job = JobOf(run->ReadLog());
  ASSERT_FALSE(job.empty()) << run->ReadLog();
  std::string out;
  int code = -1;
  ASSERT_TRUE(WaitFor([&] {
    std::tie(code, out) = Cli({"--run", "latest", "status"});
    return code == 0 && absl::StrContains(out, "RUNNING");
  })) << code
      << "\n"
      << out;

  run->Kill(SIGKILL);
  ASSERT_GE(run->Wait(kDeadline), 0);
  const std::string run_dir = RunDir(job);
  ASSERT_FALSE(run_dir.empty());
  EXPECT_EQ(access((run_dir + "/live.txt").c_str(), F_OK), 0) << "SIGKILL leaves the record behind";

  const absl::Time asked = absl::Now();
  std::tie(code, out) = Cli({"--run", "latest", "status"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr(job)) << "read from the database the killed run left";
  EXPECT_LT(absl::Now() - asked, absl::Seconds(60)) << "a stale record never hangs";
}

}  // namespace
