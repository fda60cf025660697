// scheduling.max_runtime_s end to end (Slurm's --time, DefaultTime and
// MaxTime; docs/queues.md) with a real coordinator and worker: a queue made
// by `trainctl queue create --default-max-runtime-s/--max-runtime-s` shows
// its limits in `queue describe`, gives its default to a job that asks for
// none and refuses one asking more than its maximum, naming the field; a
// command job that would run for minutes, submitted with `--max-runtime 2`,
// is stopped as a preemption stops it -- its script sees
// trainctl.should_checkpoint(), saves a checkpoint and exits -- and ends
// TIMEOUT (`submit --follow` exits 1 saying so), with the checkpoint
// recorded for `trainctl resume`. A Python script on the dependency-free
// trainctl module, so no LibTorch is needed.
//
// Backfill with real processes: on a 2-slot worker, one slot busy with a
// job limited to 60 s and a 2-rank job blocked behind it, a 1-rank job
// whose limit plus the stop grace ends before the big job could start runs
// at once on the held slot (its `scheduled` event names the big job); one
// without a limit waits, its reason naming the limit that would let it in.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/jobspec/job_spec.h"
#include "common/time_util.h"
#include "tests/support/cluster.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using trainctl::testing::Cluster;

// Reports a step every 50 ms for up to 10 minutes; on a preemption (the
// worker makes TRAINCTL_PREEMPT_FILE, then sends SIGTERM) saves a checkpoint
// at its step and exits 0.
constexpr char kScript[] = R"(import signal, sys, time
import trainctl
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
step = 0
deadline = time.monotonic() + 600
while time.monotonic() < deadline:
    step += 1
    trainctl.report(step=step, epoch=0, loss=1.0 / step)
    if trainctl.should_checkpoint() or stopping:
        path = trainctl.save_checkpoint(b"state at step %d" % step, step)
        print("checkpointed at step %d to %s" % (step, path), flush=True)
        sys.exit(0)
    time.sleep(0.05)
print("ran to the end: no limit stopped it", flush=True)
)";

class WalltimeE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    build_ = trainctl::testing::BuildDirOfThisTest();
    cluster_ = std::make_unique<Cluster>(build_, "/bin/false");
    ASSERT_TRUE(cluster_->StartCoordinator({"--preemption_grace_s=60"}));
    ASSERT_TRUE(cluster_->StartWorker("w0", 1, false, {"--allow_commands"}));
    ASSERT_TRUE(cluster_->WaitWorkers(1));
    script_ = cluster_->dir() + "/long_run.py";
    std::ofstream(script_) << kScript;
    yaml_ = cluster_->dir() + "/job.yaml";
    std::ofstream(yaml_) << "name: long-run\nworld_size: 1\ndevice: cpu\nqueue: short\ncommand:\n"
                         << "  argv: [/usr/bin/python3, " << script_
                         << "]\n  working_dir: " << cluster_->dir()
                         << "\nrestart: {max_restarts: 0}\n";
  }

  // Runs the CLI as the admin, waiting at most `wait`; its exit code, `out`
  // its output.
  int Cli(std::vector<std::string> args, std::string* out,
          absl::Duration wait = absl::Seconds(30)) {
    std::vector<std::string> argv = {build_ + "/client/trainctl", "--coordinator",
                                     cluster_->address(), "--token-file",
                                     cluster_->AdminTokenFile()};
    argv.insert(argv.end(), args.begin(), args.end());
    trainctl::testing::Process p(argv, absl::StrCat(cluster_->dir(), "/cli-", ++cli_runs_, ".log"),
                                 cluster_->dir());
    if (!p.Start()) return -1;
    const int status = p.Wait(wait);
    *out = p.ReadLog();
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  v1::JobSpec Spec() {
    ParsedJobSpec p = ParseJobSpecFile(yaml_);
    EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
    return p.spec;
  }

  std::string build_;
  std::string script_;
  std::string yaml_;
  std::unique_ptr<Cluster> cluster_;
  int cli_runs_ = 0;
};

TEST_F(WalltimeE2ETest, AJobPastItsMaxRuntimeCheckpointsAndEndsTimeout) {
  std::string out;
  ASSERT_EQ(Cli({"queue", "create", "short", "--default-max-runtime-s", "1800", "--max-runtime-s",
                 "3600"},
                &out),
            0)
      << out;
  ASSERT_EQ(Cli({"queue", "describe", "short"}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("Runtime limit:"));
  EXPECT_THAT(out, HasSubstr("default 30m00s, at most 1h00m")) << out;

  // Above the queue's maximum: refused at submit, naming the field.
  v1::JobSpec greedy = Spec();
  greedy.mutable_scheduling()->set_max_runtime_s(7200);
  grpc::Status refused = cluster_->TrySubmit(greedy);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("scheduling.max_runtime_s: 7200 s exceeds queue 'short''s "
                        "max_runtime_s of 3600 s"));

  // The job runs for 2 s of its 10 minutes: stopped, checkpointed, TIMEOUT.
  const absl::Time submitted = absl::Now();
  ASSERT_EQ(Cli({"submit", yaml_, "--max-runtime", "2", "--follow"}, &out, absl::Seconds(120)), 1)
      << "a followed job that did not succeed exits 1\n"
      << out;
  EXPECT_THAT(out, HasSubstr("TIMEOUT"));
  EXPECT_THAT(out, HasSubstr("ran past max_runtime_s=2"));
  EXPECT_LT(absl::Now() - submitted, absl::Seconds(60)) << "stopped well within the grace";

  std::string id;
  if (const size_t at = out.find("job long-run-"); at != std::string::npos) {
    id = out.substr(at + 4, out.find_first_of(" \n:", at + 4) - at - 4);
  }
  ASSERT_FALSE(id.empty()) << out;
  // The checkpoint the stop wrote is recorded (it may arrive just after
  // the job ended), and the rank has ended.
  const v1::Job j = cluster_->WaitFor(id, [](const v1::Job& job) {
    return job.checkpoints_size() > 0 && job.attempts_size() > 0 &&
           job.attempts(0).ranks(0).state() >= v1::RANK_STATE_SUCCEEDED;
  });
  ASSERT_EQ(j.state(), v1::JOB_STATE_TIMEOUT) << j.state_reason();
  EXPECT_EQ(j.spec().scheduling().max_runtime_s(), 2);
  EXPECT_THAT(j.state_reason(), HasSubstr("ran past max_runtime_s=2 ("));
  ASSERT_EQ(j.attempts_size(), 1);
  EXPECT_EQ(j.attempts(0).state(), v1::ATTEMPT_STATE_CANCELLED);
  ASSERT_GT(j.checkpoints_size(), 0) << "the stop's checkpoint was not recorded";
  EXPECT_GE(j.checkpoints(0).global_step(), 1);
  // Its running time: the 2 s limit plus the stop, far from the script's 10 minutes.
  const absl::Duration ran =
      FromTimestamp(j.attempts(0).end_time()) - FromTimestamp(j.attempts(0).start_time());
  EXPECT_GE(ran, absl::Seconds(2));
  EXPECT_LT(ran, absl::Seconds(30));
  const std::string log = cluster_->RankLog(id, 1, 0);
  EXPECT_THAT(log, HasSubstr("checkpointed at step")) << log;
  bool timeout_event = false;
  for (const v1::Event& e : cluster_->Events(id)) {
    if (e.type() == "timeout") {
      timeout_event = true;
      EXPECT_THAT(e.message(), HasSubstr("ran past max_runtime_s=2"));
    }
  }
  EXPECT_TRUE(timeout_event);

  // A job of the queue that asks for no limit gets its default.
  std::string second;
  ASSERT_TRUE(cluster_->TrySubmit(Spec(), &second).ok());
  EXPECT_EQ(cluster_->Get(second).spec().scheduling().max_runtime_s(), 1800);
  ASSERT_EQ(Cli({"cancel", second}, &out), 0) << out;
}

// A command job of `world_size` ranks running `sh -c script`, with a
// runtime limit (0 = none).
v1::JobSpec ShellJob(const std::string& name, int world_size, const std::string& script,
                     int64_t max_runtime_s) {
  std::string yaml = absl::StrCat("name: ", name, "\nworld_size: ", world_size,
                                  "\ndevice: cpu\ncommand:\n  argv: [/bin/sh, -c, '", script,
                                  "']\nrestart: {max_restarts: 0}\n");
  if (max_runtime_s > 0)
    absl::StrAppend(&yaml, "scheduling: {max_runtime_s: ", max_runtime_s, "}\n");
  ParsedJobSpec p = ParseJobSpecYaml(yaml, name + ".yaml");
  EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
  return p.spec;
}

TEST(BackfillE2ETest, AShortLimitedJobRunsOnSlotsHeldForABlockedJobAndAnUnlimitedOneWaits) {
  const std::string build = trainctl::testing::BuildDirOfThisTest();
  Cluster cluster(build, "/bin/false");
  ASSERT_TRUE(cluster.StartCoordinator({"--preemption_grace_s=5"}));
  ASSERT_TRUE(cluster.StartWorker("w0", 2, false, {"--allow_commands"}));
  ASSERT_TRUE(cluster.WaitWorkers(1));

  // One slot busy for at most 60 s (+5 s of grace), the other free.
  const std::string busy = cluster.Submit(ShellJob("busy", 1, "exec sleep 600", 60));
  ASSERT_EQ(cluster.WaitState(busy, v1::JOB_STATE_RUNNING).state(), v1::JOB_STATE_RUNNING);
  // Needs both slots: blocked, holding the free one.
  const std::string big = cluster.Submit(ShellJob("big", 2, "exit 0", 0));
  ASSERT_FALSE(big.empty());
  // No limit: would hold the slot past the big job's start, so it waits.
  const std::string open = cluster.Submit(ShellJob("open", 1, "exit 0", 0));
  ASSERT_FALSE(open.empty());
  const v1::Job waiting = cluster.WaitFor(open, [](const v1::Job& j) {
    return absl::StrContains(j.state_reason(), "would let it start now (backfill)");
  });
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(waiting.state_reason(),
              HasSubstr("a runtime limit (with the stop grace) of at most "))
      << waiting.state_reason();

  // 10 s + 5 s of grace ends before the busy job's 60 s + 5 s: runs now.
  const absl::Time submitted = absl::Now();
  const std::string quick = cluster.Submit(ShellJob("quick", 1, "echo quick ran", 10));
  const v1::Job q = cluster.WaitState(quick, v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(q.state(), v1::JOB_STATE_SUCCEEDED) << q.state_reason();
  EXPECT_LT(absl::Now() - submitted, absl::Seconds(50))
      << "it did not wait for the busy job's limit";
  bool backfilled = false;
  for (const v1::Event& e : cluster.Events(quick)) {
    if (e.type() == "scheduled" &&
        absl::StrContains(e.message(), "backfilled on slots held for job " + big)) {
      backfilled = true;
    }
  }
  EXPECT_TRUE(backfilled) << "no scheduled event naming the big job";
  EXPECT_THAT(cluster.RankLog(quick, 1, 0), HasSubstr("quick ran"));
  EXPECT_EQ(cluster.Get(big).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(cluster.Get(open).state(), v1::JOB_STATE_PENDING);

  // The busy job gone, the big job starts first, then the open one.
  grpc::ClientContext ctx;
  v1::CancelJobRequest req;
  req.set_job_id(busy);
  v1::Job cancelled;
  ASSERT_TRUE(cluster.jobs()->CancelJob(&ctx, req, &cancelled).ok());
  const v1::Job b = cluster.WaitState(big, v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(b.state(), v1::JOB_STATE_SUCCEEDED) << b.state_reason();
  const v1::Job o = cluster.WaitState(open, v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(o.state(), v1::JOB_STATE_SUCCEEDED) << o.state_reason();
  EXPECT_GE(FromTimestamp(o.attempts(0).start_time()), FromTimestamp(b.attempts(0).start_time()));
}

}  // namespace
}  // namespace trainctl
