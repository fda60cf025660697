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
// `trainctl usage` splits the slot-seconds between the two queues.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/jobspec/job_spec.h"
#include "common/time_util.h"
#include "tests/support/cluster.h"
#include "tests/support/metrics_page.h"
#include "tests/support/source_dir.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using trainctl::testing::Cluster;
using trainctl::testing::CoordinatorMetricsPage;
using trainctl::testing::PromSample;

class PreemptionE2ETest : public ::testing::Test {
 protected:
  // A coordinator and workers w0, w1 of `slots` CPU slots each, running
  // `rank_binary` for training jobs.
  // The coordinator also serves /metrics (on a port of its choosing).
  void StartCluster(int slots, const std::string& rank_binary) {
    build_ = trainctl::testing::BuildDirOfThisTest();
    cluster_ = std::make_unique<Cluster>(build_, rank_binary);
    ASSERT_TRUE(
        cluster_->StartCoordinator({"--preemption_grace_s=60", "--http_listen=127.0.0.1:0"}));
    ASSERT_TRUE(cluster_->StartWorker("w0", slots, false, {"--allow_commands"}));
    ASSERT_TRUE(cluster_->StartWorker("w1", slots, false, {"--allow_commands"}));
    ASSERT_TRUE(cluster_->WaitWorkers(2));
  }

  // Runs the CLI as the admin; its exit code, `out` its output.
  int Cli(std::vector<std::string> args, std::string* out = nullptr) {
    std::vector<std::string> argv = {build_ + "/client/trainctl", "--coordinator",
                                     cluster_->address(), "--token-file",
                                     cluster_->AdminTokenFile()};
    argv.insert(argv.end(), args.begin(), args.end());
    trainctl::testing::Process p(argv, absl::StrCat(cluster_->dir(), "/cli-", ++cli_runs_, ".log"),
                                 cluster_->dir());
    if (!p.Start()) return -1;
    const int status = p.Wait(absl::Seconds(30));
    if (out != nullptr) *out = p.ReadLog();
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // A command job of `world_size` ranks in `queue` running `script` (sh).
  v1::JobSpec Job(const std::string& name, int world_size, const std::string& queue,
                  const std::string& script) {
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

  // Ranks x seconds of every attempt of `job` that started and ended.
  static double SlotSeconds(const v1::Job& job) {
    double sum = 0;
    for (const v1::Attempt& at : job.attempts()) {
      if (!at.has_start_time() || !at.has_end_time()) continue;
      sum += absl::ToDoubleSeconds(FromTimestamp(at.end_time()) - FromTimestamp(at.start_time())) *
             at.ranks_size();
    }
    return sum;
  }

  // The most slot-seconds `job`'s attempts can have held: a stopped
  // attempt's ranks exit before the next attempt starts (it needs their
  // slots: every slot of this cluster), and the last attempt settles when
  // its last rank's end is recorded (1 s allowed for the two stamps).
  static double MaxSlotSeconds(const v1::Job& job) {
    double sum = 0;
    for (int i = 0; i < job.attempts_size(); ++i) {
      const v1::Attempt& at = job.attempts(i);
      if (!at.has_start_time() || !at.has_end_time()) continue;
      const absl::Time end = i + 1 < job.attempts_size() && job.attempts(i + 1).has_start_time()
                                 ? FromTimestamp(job.attempts(i + 1).start_time())
                                 : FromTimestamp(at.end_time()) + absl::Seconds(1);
      sum += absl::ToDoubleSeconds(end - FromTimestamp(at.start_time())) * at.ranks_size();
    }
    return sum;
  }

  // `trainctl usage -o csv`'s slot_seconds summed per queue (its header
  // checked).
  static std::map<std::string, double> UsageByQueue(const std::string& csv) {
    std::map<std::string, double> out;
    std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
    EXPECT_FALSE(lines.empty());
    if (lines.empty()) return out;
    EXPECT_EQ(lines[0],
              "queue,owner,kind,slot_seconds,slot_hours,attempts,jobs,gpu_seconds,wall_seconds,cpu_"
              "seconds,"
              "peak_memory_bytes");
    for (size_t i = 1; i < lines.size(); ++i) {
      std::vector<std::string> f = absl::StrSplit(lines[i], ',');
      double seconds = 0;
      EXPECT_EQ(f.size(), 11u) << lines[i];
      if (f.size() != 11 || !absl::SimpleAtod(f[3], &seconds)) {
        ADD_FAILURE() << "not a usage row: " << lines[i];
        continue;
      }
      out[f[0]] += seconds;
    }
    return out;
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
  const std::string borrower =
      cluster_->Submit(Job("borrower", 4, "team-b",
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

  // /metrics shows the borrowing per queue (nothing changes until a's job
  // is submitted: b's first attempt runs until preempted).
  std::string page = CoordinatorMetricsPage(*cluster_, cluster_->admin_token());
  EXPECT_EQ(PromSample(page, "trainctl_queue_nominal_slots{queue=\"team-b\",kind=\"cpu\"}"), 2)
      << page;
  EXPECT_EQ(PromSample(page, "trainctl_queue_used_slots{queue=\"team-b\",kind=\"cpu\"}"), 4)
      << page;
  EXPECT_EQ(PromSample(page, "trainctl_queue_borrowed_slots{queue=\"team-b\",kind=\"cpu\"}"), 2)
      << page;
  EXPECT_EQ(PromSample(page, "trainctl_queue_borrowed_slots{queue=\"team-b\",kind=\"gpu\"}"), 0)
      << page;
  // The API says the same (QueueStatus.borrowed_*; clients never compute it).
  ASSERT_EQ(Cli({"queue", "describe", "team-b", "-o", "json"}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("\"borrowedCpu\":2")) << out;
  EXPECT_THAT(out, Not(HasSubstr("borrowedGpu"))) << "0 is not printed: nothing borrowed of GPUs";
  EXPECT_EQ(PromSample(page, "trainctl_queue_used_slots{queue=\"team-a\",kind=\"cpu\"}"), 0)
      << page;
  EXPECT_EQ(PromSample(page, "trainctl_queue_running_jobs{queue=\"team-b\"}"), 1) << page;
  EXPECT_EQ(PromSample(page, "trainctl_queue_pending_jobs{queue=\"team-a\"}"), 0) << page;
  EXPECT_TRUE(
      std::isnan(PromSample(page, "trainctl_queue_nominal_slots{queue=\"team-b\",kind=\"gpu\"}")))
      << "an unlimited nominal has no sample";
  EXPECT_GT(PromSample(page, "trainctl_queue_slot_seconds_total{queue=\"team-b\",kind=\"cpu\"}"), 0)
      << page;
  EXPECT_EQ(PromSample(page, "trainctl_preemptions_total"), 0) << page;

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

  // Accounting: `trainctl usage` splits the slot-seconds between the two
  // queues, each as its jobs' attempts held them (both jobs ended, so the
  // sums no longer grow): from each attempt's start until its ranks exited,
  // so at least the attempt's recorded span, and a stopped attempt's grace
  // on top (however long its ranks took to exit on a loaded machine), but
  // never past the slots being free again (MaxSlotSeconds).
  const std::map<std::string, std::pair<double, double>> want = {
      {"team-a", {SlotSeconds(a), MaxSlotSeconds(a)}},
      {"team-b", {SlotSeconds(b), MaxSlotSeconds(b)}}};
  ASSERT_EQ(Cli({"usage", "-o", "csv"}, &out), 0) << out;
  std::map<std::string, double> got = UsageByQueue(out);
  ASSERT_EQ(got.size(), 2u) << out;
  for (const auto& [queue, bounds] : want) {
    EXPECT_GT(got[queue], 0) << queue << "\n" << out;
    EXPECT_GE(got[queue], bounds.first - 0.01) << queue << "\n" << out;
    EXPECT_LE(got[queue], bounds.second) << queue << "\n" << out;
  }
  const double usage_a = got["team-a"], usage_b = got["team-b"];
  ASSERT_EQ(Cli({"usage", "--queue", "team-a", "-o", "csv"}, &out), 0) << out;
  got = UsageByQueue(out);
  ASSERT_EQ(got.size(), 1u) << out;
  EXPECT_NEAR(got["team-a"], usage_a, 0.01) << out;
  ASSERT_EQ(Cli({"usage", "--since", "yesterday"}, &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("--since"));
  // /metrics counts the same slot-seconds; nothing is held any more.
  page = CoordinatorMetricsPage(*cluster_, cluster_->admin_token());
  EXPECT_NEAR(PromSample(page, "trainctl_queue_slot_seconds_total{queue=\"team-a\",kind=\"cpu\"}"),
              usage_a, 0.01)
      << page;
  EXPECT_NEAR(PromSample(page, "trainctl_queue_slot_seconds_total{queue=\"team-b\",kind=\"cpu\"}"),
              usage_b, 0.01)
      << page;
  EXPECT_EQ(PromSample(page, "trainctl_queue_used_slots{queue=\"team-b\",kind=\"cpu\"}"), 0)
      << page;
  EXPECT_EQ(PromSample(page, "trainctl_queue_running_jobs{queue=\"team-b\"}"), 0) << page;
  // The scheduler's own series: one preemption, and the passes that placed
  // b (twice) and a were timed.
  EXPECT_EQ(PromSample(page, "trainctl_preemptions_total"), 1) << page;
  EXPECT_GE(PromSample(page, "trainctl_scheduler_pass_seconds_count"), 3) << page;
}

// Per worker: 1 slot (a 2-rank job over two workers) or 2 (4 ranks: two
// hosts of two ranks, whose replicas must stay bit-identical over Gloo for
// the resume to continue every rank's exact state, #47 item 3).
class PreemptedTrainingTest : public PreemptionE2ETest,
                              public ::testing::WithParamInterface<int> {};

INSTANTIATE_TEST_SUITE_P(RanksPerWorker, PreemptedTrainingTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(2 * info.param, "Ranks");
                         });

TEST_P(PreemptedTrainingTest, APreemptedTrainingJobCheckpointsAtAnAgreedStepAndResumesFromIt) {
  const int per_worker = GetParam();
  const std::string rank =
      trainctl::testing::BuildDirOfThisTest() + "/worker/trainer/trainctl-rank";
  if (!std::filesystem::exists(rank)) GTEST_SKIP() << "no trainctl-rank (a build without LibTorch)";
  ASSERT_NO_FATAL_FAILURE(StartCluster(per_worker, rank));
  std::string out;
  const std::string quota = absl::StrCat(per_worker);
  ASSERT_EQ(Cli({"queue", "create", "team-a", "--cpu", quota, "--cohort", "lab"}, &out), 0) << out;
  ASSERT_EQ(Cli({"queue", "create", "team-b", "--cpu", quota, "--cohort", "lab"}, &out), 0) << out;

  // b: the classic example made long (10,000 steps an epoch at 2 ranks, at
  // least 5 s on a fast machine), on every slot, with no periodic checkpoint
  // inside an epoch. Its progress reaches the coordinator about once a
  // second, so the epoch must last several seconds for the preemption below
  // to land inside it (at 1,000 steps an idle machine ran the whole epoch
  // before the first report).
  const std::string src = trainctl::testing::SourceDir();
  ParsedJobSpec slow =
      ParseJobSpecFile(src + "/examples/mlp-synthetic.yaml",
                       {"training.epochs=1", "data.train.length=600000", "model.hidden=[64]",
                        "device=cpu", absl::StrCat("world_size=", 2 * per_worker)});
  ASSERT_TRUE(slow.ok()) << (slow.errors.empty() ? "" : slow.errors[0].ToString());
  slow.spec.set_queue("team-b");
  const std::string borrower = cluster_->Submit(slow.spec);
  ASSERT_FALSE(borrower.empty());
  v1::Job b = cluster_->WaitFor(borrower, [](const v1::Job& j) {
    return j.state() >= v1::JOB_STATE_SUCCEEDED ||
           (j.state() == v1::JOB_STATE_RUNNING && j.progress().step() >= 25);
  });
  ASSERT_EQ(b.state(), v1::JOB_STATE_RUNNING)
      << "the test acts inside the epoch; " << b.state_reason();

  ParsedJobSpec small = ParseJobSpecFile(
      src + "/examples/mlp-synthetic.yaml",
      {absl::StrCat("world_size=", per_worker), "training.epochs=1", "device=cpu"});
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
  for (int r = 0; r < 2 * per_worker; ++r) {
    const std::string log = cluster_->RankLog(borrower, 1, r);
    EXPECT_THAT(log, HasSubstr(absl::StrCat("(global step ", resumed.resume().global_step(), ")")))
        << "rank " << r << ": " << log;
  }
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
      "/usr/bin/python3 -c \"import sys, torch; p = [dict(torch.jit.load(f).named_parameters()) "
      "for f in sys.argv[1:]]; "
      "assert p[0].keys() == p[1].keys() and p[0], 'parameter names differ'; "
      "d = [k for k in p[0] if not torch.equal(p[0][k], p[1][k])]; assert not d, 'differ: %s' % "
      "d\" " +
      b.final_model() + " " + r.final_model();
  EXPECT_EQ(std::system(compare.c_str()), 0) << compare;
}

}  // namespace
}  // namespace trainctl
