// Queues end to end (docs/queues.md) with a real coordinator and two real
// worker daemons of 2 CPU slots each: team b's 4-rank job borrows team a's
// idle quota in their cohort; team a submits a 2-rank job within its quota
// -> b's job is preempted (its ranks get SIGTERM, its attempt ends
// CANCELLED naming a's job, no restart counted), a's job runs and SUCCEEDS,
// then b's job runs again and SUCCEEDS. Command jobs (a shell script), so no
// LibTorch is needed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/jobspec/job_spec.h"
#include "common/time_util.h"
#include "tests/support/cluster.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using trainctl::testing::Cluster;

class PreemptionE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    build_ = trainctl::testing::BuildDirOfThisTest();
    cluster_ = std::make_unique<Cluster>(build_, "/bin/false");
    ASSERT_TRUE(cluster_->StartCoordinator({"--preemption_grace_s=30"}));
    ASSERT_TRUE(cluster_->StartWorker("w0", 2, false, {"--allow_commands"}));
    ASSERT_TRUE(cluster_->StartWorker("w1", 2, false, {"--allow_commands"}));
    ASSERT_TRUE(cluster_->WaitWorkers(2));
  }

  // Runs the CLI as the admin; its exit code, `out` its output.
  int Cli(std::vector<std::string> args, std::string* out = nullptr) {
    std::vector<std::string> argv = {build_ + "/client/trainctl", "--coordinator", cluster_->address(), "--token",
                                     cluster_->admin_token()};
    argv.insert(argv.end(), args.begin(), args.end());
    trainctl::testing::Process p(argv, absl::StrCat(cluster_->dir(), "/cli-", ++cli_runs_, ".log"), cluster_->dir());
    if (!p.Start()) return -1;
    const int status = p.Wait(absl::Seconds(30));
    if (out != nullptr) *out = p.ReadLog();
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // A command job of `world_size` ranks in `queue` running `script` (sh).
  v1::JobSpec Job(const std::string& name, int world_size, const std::string& queue, const std::string& script) {
    const std::string path = absl::StrCat(cluster_->dir(), "/", name, ".sh");
    std::ofstream(path) << script;
    ParsedJobSpec p = ParseJobSpecYaml(
        absl::StrCat("name: ", name, "\nworld_size: ", world_size, "\ndevice: cpu\nqueue: ", queue,
                     "\ncommand:\n  argv: [/bin/sh, ", path, "]\n  working_dir: ", cluster_->dir(),
                     "\nrestart: {max_restarts: 0}\n"),
        "job.yaml");
    EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
    return p.spec;
  }

  std::string build_;
  std::unique_ptr<Cluster> cluster_;
  int cli_runs_ = 0;
};

TEST_F(PreemptionE2ETest, ALenderTakesItsQuotaBackAndTheBorrowerRunsAgainAfter) {
  std::string out;
  ASSERT_EQ(Cli({"queue", "create", "team-a", "--cpu", "2", "--cohort", "lab"}, &out), 0) << out;
  ASSERT_EQ(Cli({"queue", "create", "team-b", "--cpu", "2", "--cohort", "lab"}, &out), 0) << out;

  // b's job: its first attempt runs until stopped (and says it got
  // SIGTERM), later attempts finish at once.
  const std::string borrower = cluster_->Submit(Job(
      "borrower", 4, "team-b",
      "if [ \"$TRAINCTL_ATTEMPT\" = 1 ]; then\n"
      "  trap 'echo \"rank $RANK got SIGTERM\"; exit 143' TERM\n"
      "  echo \"rank $RANK running\"\n"
      "  while :; do sleep 0.1; done\n"
      "fi\n"
      "echo \"rank $RANK attempt $TRAINCTL_ATTEMPT done\"\n"));
  ASSERT_FALSE(borrower.empty());
  v1::Job b = cluster_->WaitState(borrower, v1::JOB_STATE_RUNNING);
  ASSERT_EQ(b.state(), v1::JOB_STATE_RUNNING) << b.state_reason();
  ASSERT_EQ(b.attempts(0).ranks_size(), 4) << "b borrows a's idle quota: 4 slots on a nominal of 2";

  const absl::Time submitted = absl::Now();
  const std::string lender =
      cluster_->Submit(Job("lender", 2, "team-a", "echo \"rank $RANK of the lender\"; sleep 1\n"));
  ASSERT_FALSE(lender.empty());
  const v1::Job a = cluster_->WaitState(lender, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(a.state(), v1::JOB_STATE_SUCCEEDED) << a.state_reason();
  // Preempted and stopped well within the grace (the script exits on SIGTERM).
  EXPECT_LT(absl::Now() - submitted, absl::Seconds(30));

  b = cluster_->WaitState(borrower, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(b.state(), v1::JOB_STATE_SUCCEEDED) << b.state_reason();
  ASSERT_EQ(b.attempts_size(), 2);
  EXPECT_EQ(b.attempts(0).state(), v1::ATTEMPT_STATE_CANCELLED);
  EXPECT_EQ(b.attempts(0).preempted_for(), lender);
  EXPECT_EQ(b.restarts(), 0) << "a preemption is not a restart";
  EXPECT_GE(FromTimestamp(b.attempts(1).start_time()), FromTimestamp(a.end_time()))
      << "b runs again only after a's job gave the quota back";
  bool preempted = false;
  for (const v1::Event& e : cluster_->Events(borrower)) {
    if (e.type() != "preempted") continue;
    preempted = true;
    EXPECT_THAT(e.message(), HasSubstr("preempted for job " + lender + " (queue team-a"));
  }
  EXPECT_TRUE(preempted);
  EXPECT_THAT(cluster_->RankLog(borrower, 1, 0), HasSubstr("rank 0 got SIGTERM"));
  EXPECT_THAT(cluster_->RankLog(borrower, 2, 0), HasSubstr("rank 0 attempt 2 done"));
}

}  // namespace
}  // namespace trainctl
