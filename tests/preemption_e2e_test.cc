// Queues end to end (docs/queues.md) with a real coordinator and two real
// worker daemons of 2 CPU slots each: team b's 4-rank job borrows team a's
// idle quota in their cohort; team a submits a 2-rank job within its quota
// -> b's job is preempted (its ranks get SIGTERM, its attempt ends
// CANCELLED naming a's job, no restart counted), a's job runs and SUCCEEDS,
// then b's job runs again and SUCCEEDS. Command jobs (a shell script), so no
// LibTorch is needed. And with trainctl-rank (a LibTorch build): a training
// job preempted mid-epoch stops at a step its ranks agree on, checkpoints
// there, its next attempt resumes from that checkpoint, and its final
// parameters are bitwise those of the same job run without a preemption.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/jobspec/job_spec.h"
#include "common/time_util.h"
#include "tests/support/cluster.h"
#include "tests/support/source_dir.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using trainctl::testing::Cluster;

class PreemptionE2ETest : public ::testing::Test {
 protected:
  // A coordinator and workers w0, w1 of `slots` CPU slots each, running
  // `rank_binary` for training jobs.
  void StartCluster(int slots, const std::string& rank_binary) {
    build_ = trainctl::testing::BuildDirOfThisTest();
    cluster_ = std::make_unique<Cluster>(build_, rank_binary);
    ASSERT_TRUE(cluster_->StartCoordinator({"--preemption_grace_s=60"}));
    ASSERT_TRUE(cluster_->StartWorker("w0", slots, false, {"--allow_commands"}));
    ASSERT_TRUE(cluster_->StartWorker("w1", slots, false, {"--allow_commands"}));
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
  ASSERT_NO_FATAL_FAILURE(StartCluster(2, "/bin/false"));
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

TEST_F(PreemptionE2ETest, APreemptedTrainingJobCheckpointsAtAnAgreedStepAndResumesFromIt) {
  const std::string rank = trainctl::testing::BuildDirOfThisTest() + "/worker/trainer/trainctl-rank";
  if (!std::filesystem::exists(rank)) GTEST_SKIP() << "no trainctl-rank (a build without LibTorch)";
  ASSERT_NO_FATAL_FAILURE(StartCluster(1, rank));
  std::string out;
  ASSERT_EQ(Cli({"queue", "create", "team-a", "--cpu", "1", "--cohort", "lab"}, &out), 0) << out;
  ASSERT_EQ(Cli({"queue", "create", "team-b", "--cpu", "1", "--cohort", "lab"}, &out), 0) << out;

  // b: the classic example made slow (1,000 steps an epoch), 2 ranks, with
  // no periodic checkpoint inside an epoch.
  const std::string src = trainctl::testing::SourceDir();
  ParsedJobSpec slow = ParseJobSpecFile(src + "/examples/mlp-synthetic.yaml",
                                        {"training.epochs=1", "data.train.length=60000", "model.hidden=[64]",
                                         "device=cpu"});
  ASSERT_TRUE(slow.ok()) << (slow.errors.empty() ? "" : slow.errors[0].ToString());
  slow.spec.set_queue("team-b");
  const std::string borrower = cluster_->Submit(slow.spec);
  ASSERT_FALSE(borrower.empty());
  v1::Job b = cluster_->WaitFor(borrower, [](const v1::Job& j) {
    return j.state() >= v1::JOB_STATE_SUCCEEDED || (j.state() == v1::JOB_STATE_RUNNING && j.progress().step() >= 25);
  });
  ASSERT_EQ(b.state(), v1::JOB_STATE_RUNNING) << "the test acts inside the epoch; " << b.state_reason();

  ParsedJobSpec small = ParseJobSpecFile(src + "/examples/mlp-synthetic.yaml",
                                         {"world_size=1", "training.epochs=1", "device=cpu"});
  ASSERT_TRUE(small.ok());
  small.spec.set_queue("team-a");
  const std::string lender = cluster_->Submit(small.spec);
  ASSERT_FALSE(lender.empty());
  const v1::Job a = cluster_->WaitState(lender, v1::JOB_STATE_SUCCEEDED, absl::Seconds(120));
  ASSERT_EQ(a.state(), v1::JOB_STATE_SUCCEEDED) << a.state_reason();

  b = cluster_->WaitState(borrower, v1::JOB_STATE_SUCCEEDED, absl::Seconds(240));
  ASSERT_EQ(b.state(), v1::JOB_STATE_SUCCEEDED) << b.state_reason();
  ASSERT_EQ(b.attempts_size(), 2);
  EXPECT_EQ(b.attempts(0).preempted_for(), lender);
  EXPECT_EQ(b.restarts(), 0);
  // Attempt 2 resumed from the checkpoint the preemption wrote: attempt 1's,
  // inside the epoch, at a step both ranks agreed on.
  const v1::Attempt& resumed = b.attempts(1);
  ASSERT_TRUE(resumed.has_resume()) << "resumed from nothing";
  EXPECT_EQ(resumed.resume().attempt(), 1);
  EXPECT_GT(resumed.resume().epoch_consumed(), 0);
  EXPECT_EQ(resumed.resume().global_step() % 10, 0) << resumed.resume().global_step();
  const std::string log0 = cluster_->RankLog(borrower, 1, 0), log1 = cluster_->RankLog(borrower, 1, 1);
  EXPECT_THAT(log0, HasSubstr(absl::StrCat("(global step ", resumed.resume().global_step(), ")"))) << log0;
  EXPECT_THAT(log1, HasSubstr(absl::StrCat("(global step ", resumed.resume().global_step(), ")"))) << log1;
  EXPECT_THAT(cluster_->RankLog(borrower, 2, 0), HasSubstr("resumed from"));

  // The same job run without a preemption ends with bitwise the same
  // parameters: the preemption lost no work and no sample.
  slow.spec.set_name("mlp-reference");
  const std::string reference = cluster_->Submit(slow.spec);
  ASSERT_FALSE(reference.empty());
  const v1::Job r = cluster_->WaitState(reference, v1::JOB_STATE_SUCCEEDED, absl::Seconds(240));
  ASSERT_EQ(r.state(), v1::JOB_STATE_SUCCEEDED) << r.state_reason();
  ASSERT_EQ(r.attempts_size(), 1);
  ASSERT_FALSE(b.final_model().empty());
  ASSERT_FALSE(r.final_model().empty());
  const std::string compare =
      "/usr/bin/python3 -c \"import sys, torch; p = [dict(torch.jit.load(f).named_parameters()) for f in sys.argv[1:]]; "
      "assert p[0].keys() == p[1].keys() and p[0], 'parameter names differ'; "
      "d = [k for k in p[0] if not torch.equal(p[0][k], p[1][k])]; assert not d, 'differ: %s' % d\" " +
      b.final_model() + " " + r.final_model();
  EXPECT_EQ(std::system(compare.c_str()), 0) << compare;
}

}  // namespace
}  // namespace trainctl
