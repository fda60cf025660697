// Command jobs end to end: the DDP tutorial's own script (tests/support/
// ddp_tutorial.py, Debian's python3-torch, Gloo on loopback) run by two real
// worker daemons under torchrun's environment contract, with both launch
// conventions; a rank killed with SIGKILL restarts the group; a raising
// script's exception line is the job's reason; cancel leaves no process
// (DataLoader workers included); a worker without --allow-commands runs none;
// `submit --nnodes N` puts the ranks on exactly N workers.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "tests/support/source_dir.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using trainctl::testing::Cluster;
using trainctl::testing::SourceDir;

std::string Script() { return SourceDir() + "/tests/support/ddp_tutorial.py"; }

bool HaveTorch() { return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0; }

class CommandE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveTorch()) GTEST_SKIP() << "Debian's python3-torch is not installed";
    std::string build = trainctl::testing::BuildDirOfThisTest();
    cluster_ = std::make_unique<Cluster>(build, "/bin/false");
    ASSERT_TRUE(cluster_->StartCoordinator());
    ASSERT_TRUE(cluster_->StartWorker("w0", 1, false, {"--allow_commands"}));
    ASSERT_TRUE(cluster_->StartWorker("w1", 1, false, {"--allow_commands"}));
    ASSERT_TRUE(cluster_->WaitWorkers(2));
  }

  // A two-rank command job running the tutorial script with `args`.
  v1::JobSpec Job(const std::string& local_rank, const std::string& args, int max_restarts = 1) {
    std::string yaml = absl::StrCat(
        "name: ddp-script\nworld_size: 2\ndevice: cpu\ncommand:\n  argv: [/usr/bin/python3, ",
        Script(), args.empty() ? "" : ", ", args, "]\n  working_dir: ", cluster_->dir(),
        "\n  local_rank: ", local_rank, "\nrestart: {max_restarts: ", max_restarts, "}\n");
    ParsedJobSpec p = ParseJobSpecYaml(yaml, "job.yaml");
    EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
    return p.spec;
  }

  // Waits for `path` to hold a pid; -1 on timeout.
  static pid_t WaitForPid(const std::string& path, absl::Duration timeout) {
    absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      std::ifstream in(path);
      pid_t pid = 0;
      if (in >> pid && pid > 0) return pid;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return -1;
  }

  std::unique_ptr<Cluster> cluster_;
};

TEST_F(CommandE2ETest, TutorialScriptTrainsWithEitherLaunchConvention) {
  for (const std::string mode : {"arg", "env"}) {
    SCOPED_TRACE(mode);
    std::string id = cluster_->Submit(Job(mode, "--epochs, 2"));
    ASSERT_FALSE(id.empty());
    v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
    ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
    EXPECT_NE(j.attempts(0).ranks(0).worker_id(), j.attempts(0).ranks(1).worker_id())
        << "2 ranks over 2 workers";
    std::string log0 = cluster_->RankLog(id, 1, 0), log1 = cluster_->RankLog(id, 1, 1);
    EXPECT_THAT(
        log1, HasSubstr(absl::StrCat("local_rank=0 from ", mode, " TORCHELASTIC_RESTART_COUNT=0")));
    // The script all_gathers its parameters and prints them: equal on both.
    size_t p0 = log0.find("final parameters"), p1 = log1.find("final parameters");
    ASSERT_NE(p0, std::string::npos) << log0;
    ASSERT_NE(p1, std::string::npos) << log1;
    EXPECT_EQ(log0.substr(p0, log0.find('\n', p0) - p0), log1.substr(p1, log1.find('\n', p1) - p1));
    EXPECT_THAT(log0, HasSubstr("identical=True"));
    // trainctl.report() from the script reached the coordinator.
    EXPECT_GT(j.progress().last_loss(), 0) << j.DebugString();
  }
}

TEST_F(CommandE2ETest, KilledRankRestartsTheGroup) {
  std::string marker = cluster_->dir() + "/victim.pid";
  std::string id =
      cluster_->Submit(Job("env", absl::StrCat("--mode, hang-once, --marker, ", marker)));
  pid_t victim = WaitForPid(marker, absl::Seconds(30));
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  ASSERT_EQ(j.attempts_size(), 2);
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_SIGNAL);
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("was killed by signal 9 (Killed)"))
      << j.attempts(0).reason();
  EXPECT_THAT(cluster_->RankLog(id, 2, 1), HasSubstr("TORCHELASTIC_RESTART_COUNT=1"));
  EXPECT_THAT(cluster_->RankLog(id, 2, 0), HasSubstr("identical=True"));
}

TEST_F(CommandE2ETest, RaisingScriptNamesTheException) {
  std::string id = cluster_->Submit(Job("env", "--mode, raise", /*max_restarts=*/0));
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_FAILED, absl::Seconds(60));
  ASSERT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(
      j.state_reason(),
      MatchesRegex(
          "rank 1 on [^ ]+ \\(worker [^ ]+\\) exited with code 1: ValueError: learning rate "
          "must be positive, got -1(.|\n)*"))
      << "each thing once";
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_USER_CODE);
}

TEST_F(CommandE2ETest, CancelLeavesNoProcessBehind) {
  std::string marker = cluster_->dir() + "/training.pid";
  std::string id = cluster_->Submit(Job("env", absl::StrCat("--mode, hang, --marker, ", marker)));
  ASSERT_GT(WaitForPid(marker, absl::Seconds(30)), 0);
  const std::string needle = "--mode hang --marker " + marker;
  // Two ranks, each with two DataLoader workers (forked: same command line).
  EXPECT_GE(Cluster::ProcessesMatching(needle).size(), 4u);
  grpc::ClientContext ctx;
  v1::CancelJobRequest req;
  req.set_job_id(id);
  v1::Job ignored;
  ASSERT_TRUE(cluster_->jobs()->CancelJob(&ctx, req, &ignored).ok());
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_CANCELLED, absl::Seconds(30));
  ASSERT_EQ(j.state(), v1::JOB_STATE_CANCELLED);
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!Cluster::ProcessesMatching(needle).empty() && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(Cluster::ProcessesMatching(needle).empty());
}

TEST_F(CommandE2ETest, SubmitTakesTorchrunsFormAndFollowsWithRankOutput) {
  std::string build = trainctl::testing::BuildDirOfThisTest();
  trainctl::testing::Process submit(
      {build + "/client/trainctl", "--coordinator", cluster_->address(), "--token-file",
       cluster_->AdminTokenFile(), "submit", "--no-upload", "--follow", "--nproc-per-node", "2",
       "--python", "/usr/bin/python3", Script(), "--epochs", "1"},
      cluster_->dir() + "/submit.log", cluster_->dir());
  ASSERT_TRUE(submit.Start());
  int status = submit.Wait(absl::Seconds(60));
  std::string out = submit.ReadLog();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << out;
  EXPECT_THAT(out, HasSubstr("[rank1]: local_rank=0 from env TORCHELASTIC_RESTART_COUNT=0"));
  EXPECT_THAT(out, HasSubstr("[rank0]: rank 0 final parameters"));
  EXPECT_THAT(out, HasSubstr("SUCCEEDED"));

  // The reporting script's progress points reach `--follow -o json`.
  trainctl::testing::Process json(
      {build + "/client/trainctl", "--coordinator", cluster_->address(), "--token-file",
       cluster_->AdminTokenFile(), "-o", "json", "submit", "--no-upload", "--follow",
       "--nproc-per-node", "2", "--python", "/usr/bin/python3", Script(), "--epochs", "1"},
      cluster_->dir() + "/json.log", cluster_->dir());
  ASSERT_TRUE(json.Start());
  status = json.Wait(absl::Seconds(60));
  out = json.ReadLog();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << out;
  EXPECT_THAT(out, HasSubstr("\"kind\":\"KIND_TRAIN\"")) << out;
  EXPECT_THAT(out, HasSubstr("\"loss\":"));
}

// Issue #44: one default for a script's restarts, torchrun's 0, whether
// `trainctl run` or `trainctl submit SCRIPT` starts it; --max-restarts N
// gives N.
TEST_F(CommandE2ETest, SubmittedScriptRestartsAsTorchrunsDefaultZero) {
  std::string build = trainctl::testing::BuildDirOfThisTest();
  for (const int restarts : {-1, 1}) {
    SCOPED_TRACE(restarts);
    std::vector<std::string> argv = {build + "/client/trainctl",
                                     "--coordinator",
                                     cluster_->address(),
                                     "--token-file",
                                     cluster_->AdminTokenFile(),
                                     "submit",
                                     "--no-upload",
                                     "--follow",
                                     "--nproc-per-node",
                                     "2",
                                     "--python",
                                     "/usr/bin/python3"};
    if (restarts >= 0) {
      argv.push_back("--max-restarts");
      argv.push_back(absl::StrCat(restarts));
    }
    argv.insert(argv.end(), {Script(), "--mode", "raise"});
    trainctl::testing::Process submit(
        argv, absl::StrCat(cluster_->dir(), "/submit-", restarts, ".log"), cluster_->dir());
    ASSERT_TRUE(submit.Start());
    const int status = submit.Wait(absl::Seconds(90));
    const std::string out = submit.ReadLog();
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status << "\n" << out;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(out, m, std::regex("submitted job (\\S+)"))) << out;
    v1::Job j = cluster_->Get(m[1]);
    EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
    EXPECT_EQ(j.spec().restart().max_restarts(), std::max(0, restarts));
    EXPECT_EQ(j.attempts_size(), std::max(0, restarts) + 1) << out;
    EXPECT_THAT(j.state_reason(), HasSubstr("ValueError: learning rate must be positive, got -1"));
  }
}

// `submit --nnodes N` (issue #44 item 8): the dry run says the job goes on
// N workers, nproc-per-node ranks each.
TEST_F(CommandE2ETest, SubmitNnodesSaysHowItsRanksArePlaced) {
  std::string build = trainctl::testing::BuildDirOfThisTest();
  trainctl::testing::Process dry(
      {build + "/client/trainctl", "--coordinator", cluster_->address(), "--token-file",
       cluster_->AdminTokenFile(), "submit", "--dry-run", "--nnodes", "2", "--nproc-per-node", "1",
       "--python", "/usr/bin/python3", Script(), "--epochs", "1"},
      cluster_->dir() + "/dry.log", cluster_->dir());
  ASSERT_TRUE(dry.Start());
  const int status = dry.Wait(absl::Seconds(60));
  const std::string out = dry.ReadLog();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << out;
  EXPECT_THAT(out, HasSubstr("ranks:        2"));
  EXPECT_THAT(out, HasSubstr("nodes:        placed on 2 workers, 1 rank each (scheduling.nodes)"));
  EXPECT_THAT(out, Not(HasSubstr("placed as any job's")));
}

// What torchrun's environment says about the shape of the job, per rank.
constexpr char kShapeScript[] = R"py(
import os
print("shape", " ".join(f"{k}={os.environ[k]}" for k in
      ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")), flush=True)
)py";

// Issue #44 item 8: `submit --nnodes 2 --nproc-per-node 1` runs on two
// different workers even where one worker has room for both ranks (a plain
// two-rank job would share it), with torchrun's GROUP_* and LOCAL_* values;
// more nodes than the cluster has workers is refused at submit.
TEST(CommandPlacementTest, SubmitNnodesSpreadsTheRanksOverThatManyWorkers) {
  const std::string build = trainctl::testing::BuildDirOfThisTest();
  Cluster cluster(build, "/bin/false");
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.StartWorker("w0", 2, false, {"--allow_commands"}));
  ASSERT_TRUE(cluster.StartWorker("w1", 2, false, {"--allow_commands"}));
  ASSERT_TRUE(cluster.WaitWorkers(2));
  const std::string script = cluster.dir() + "/shape.py";
  std::ofstream(script) << kShapeScript;
  auto submit = [&](const std::string& nnodes, const std::string& log) {
    trainctl::testing::Process p(
        {build + "/client/trainctl", "--coordinator", cluster.address(), "--token-file",
         cluster.AdminTokenFile(), "submit", "--no-upload", "--follow", "--nnodes", nnodes,
         "--nproc-per-node", "1", "--python", "/usr/bin/python3", script},
        cluster.dir() + "/" + log, cluster.dir());
    EXPECT_TRUE(p.Start());
    const int status = p.Wait(absl::Seconds(90));
    return std::make_pair(status, p.ReadLog());
  };

  auto [status, out] = submit("2", "nnodes2.log");
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << out;
  EXPECT_THAT(
      out,
      HasSubstr("[rank0]: shape RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=0 "
                "GROUP_WORLD_SIZE=2"));
  EXPECT_THAT(
      out,
      HasSubstr("[rank1]: shape RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=1 "
                "GROUP_WORLD_SIZE=2"));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("submitted job (\\S+)"))) << out;
  const v1::Job j = cluster.Get(m[1]);
  EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  EXPECT_EQ(j.spec().scheduling().nodes(), 2);
  ASSERT_EQ(j.attempts_size(), 1);
  ASSERT_EQ(j.attempts(0).ranks_size(), 2);
  EXPECT_NE(j.attempts(0).ranks(0).worker_id(), j.attempts(0).ranks(1).worker_id())
      << "one rank on each worker";

  // Three nodes on two workers can never run: refused, saying why.
  auto [refused_status, refused] = submit("3", "nnodes3.log");
  ASSERT_TRUE(WIFEXITED(refused_status) && WEXITSTATUS(refused_status) != 0)
      << refused_status << "\n"
      << refused;
  EXPECT_THAT(refused, HasSubstr("can never run this job: "));
  EXPECT_THAT(
      refused,
      HasSubstr("on 3 workers, 1 on each (scheduling.nodes), and 2 of the 2 schedulable workers"));
}

TEST(CommandPlacementTest, WorkerWithoutAllowCommandsRunsNone) {
  std::string build = trainctl::testing::BuildDirOfThisTest();
  Cluster cluster(build, "/bin/false");
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.StartWorker("w0", 1));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  v1::JobSpec spec;
  spec.set_name("cmd");
  spec.mutable_command()->add_argv("/bin/true");
  {
    // The cluster as it is can never run it: refused at submit, saying why.
    grpc::Status s = cluster.TrySubmit(spec);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), ::testing::HasSubstr("no worker allows commands"));
  }
  // With scheduling.wait_for_capacity it waits, with that reason.
  spec.mutable_scheduling()->set_wait_for_capacity(true);
  std::string id = cluster.Submit(spec);
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  v1::Job j = cluster.Get(id);
  while (j.state_reason().empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    j = cluster.Get(id);
  }
  EXPECT_EQ(j.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(j.state_reason(),
            "no worker allows commands (start trainctl-worker with --allow-commands)");
}

// Issue #44 item 3, "eval is eval": a script reports train windows with a
// loss and lr, and evaluations with eval_accuracy and a val_f1 of its own.
constexpr char kEvalReportingScript[] = R"py(
import trainctl
for step in range(1, 5):
    trainctl.report(step=step, epoch=0, loss=1.0 / step, lr=0.1)
    if step % 2 == 0:
        trainctl.report(step=step, epoch=0, val_f1=0.5 + step / 8.0, eval_accuracy=step / 8.0)
print("reported")
)py";

// A script that reports only evaluations.
constexpr char kEvalOnlyScript[] = R"py(
import trainctl
trainctl.report(step=3, epoch=1, kind="eval", loss=0.5, f1=0.25)
print("reported")
)py";

class CommandReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<Cluster>(trainctl::testing::BuildDirOfThisTest(), "/bin/false");
    ASSERT_TRUE(cluster_->StartCoordinator());
    ASSERT_TRUE(cluster_->StartWorker("w0", 1, false, {"--allow_commands"}));
    ASSERT_TRUE(cluster_->WaitWorkers(1));
  }

  // Runs `script` as a one-rank command job (TensorBoard files in
  // <dir>/<name>/tensorboard) to success; its id.
  std::string RunScript(const std::string& name, const char* script) {
    const std::string path = cluster_->dir() + "/" + name + ".py";
    std::ofstream(path) << script;
    ParsedJobSpec p = ParseJobSpecYaml(
        absl::StrCat("name: ", name,
                     "\nworld_size: 1\ndevice: cpu\ncommand:\n  argv: [/usr/bin/python3, ", path,
                     "]\nrestart: {max_restarts: 0}\ncheckpoint: {dir: ", cluster_->dir(), "/",
                     name, "}\ntensorboard: {enabled: true}\n"),
        "job.yaml");
    EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
    const std::string id = cluster_->Submit(p.spec);
    EXPECT_FALSE(id.empty());
    v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
    EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason() << "\n"
                                                  << cluster_->RankLog(id, 1, 0);
    return id;
  }

  // The job's stored points of `kind` (every page), through GetMetrics.
  std::vector<v1::MetricPoint> Points(const std::string& id, v1::MetricPoint::Kind kind) {
    std::vector<v1::MetricPoint> points;
    v1::GetMetricsRequest req;
    req.set_job_id(id);
    req.set_kind(kind);
    do {
      grpc::ClientContext ctx;
      v1::GetMetricsResponse resp;
      grpc::Status s = cluster_->jobs()->GetMetrics(&ctx, req, &resp);
      EXPECT_TRUE(s.ok()) << s.error_message();
      if (!s.ok()) break;
      for (const v1::MetricBatch& b : resp.batches())
        points.insert(points.end(), b.points().begin(), b.points().end());
      req.set_page_token(resp.next_page_token());
    } while (!req.page_token().empty());
    return points;
  }

  // `trainctl ARGS...`: its exit code, with its output in *out.
  int Cli(std::vector<std::string> args, std::string* out) {
    std::vector<std::string> argv = {trainctl::testing::BuildDirOfThisTest() + "/client/trainctl",
                                     "--coordinator", cluster_->address(), "--token-file",
                                     cluster_->AdminTokenFile()};
    argv.insert(argv.end(), args.begin(), args.end());
    trainctl::testing::Process proc(argv, cluster_->dir() + "/cli.log");
    EXPECT_TRUE(proc.Start());
    const int status = proc.Wait(absl::Seconds(30));
    *out = proc.ReadLog();
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // Rank 0's TensorBoard scalars, one JSON object per event (read by an
  // independent reader: tests/support/read_tfevents.py).
  std::string TensorBoard(const std::string& name) {
    const std::string events = cluster_->dir() + "/" + name + ".tfevents.jsonl";
    const std::string read =
        absl::StrCat("/usr/bin/python3 ", SourceDir(), "/tests/support/read_tfevents.py ",
                     cluster_->dir(), "/", name, "/tensorboard > ", events, " 2>&1");
    EXPECT_EQ(std::system(read.c_str()), 0) << read;
    std::ifstream in(events);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  std::unique_ptr<Cluster> cluster_;
};

TEST_F(CommandReportTest, EvalReportsAreEvalPointsWithExactlyTheReportedFields) {
  const std::string id = RunScript("typed", kEvalReportingScript);
  ASSERT_FALSE(id.empty());

  // Evaluations: KIND_EVAL, eval accuracy and val_f1 and nothing invented.
  const std::vector<v1::MetricPoint> evals = Points(id, v1::MetricPoint::KIND_EVAL);
  ASSERT_EQ(evals.size(), 2u);
  for (size_t i = 0; i < evals.size(); ++i) {
    const v1::MetricPoint& p = evals[i];
    const int step = 2 * static_cast<int>(i + 1);
    EXPECT_EQ(p.kind(), v1::MetricPoint::KIND_EVAL);
    EXPECT_EQ(p.step(), step);
    ASSERT_TRUE(p.has_eval()) << p.DebugString();
    EXPECT_TRUE(p.eval().has_accuracy());
    EXPECT_DOUBLE_EQ(p.eval().accuracy(), step / 8.0);
    EXPECT_FALSE(p.eval().has_loss()) << p.DebugString();
    EXPECT_FALSE(p.eval().has_samples()) << p.DebugString();
    ASSERT_EQ(p.scalars().count("val_f1"), 1u) << p.DebugString();
    EXPECT_DOUBLE_EQ(p.scalars().at("val_f1"), 0.5 + step / 8.0);
    EXPECT_EQ(p.scalars_size(), 1);
    EXPECT_FALSE(p.has_loss() || p.has_lr() || p.has_samples_per_sec() || p.has_data_ms() ||
                 p.has_compute_ms() || p.has_comm_ms() || p.has_loss_scale() ||
                 p.has_steps_per_epoch() || p.has_samples_seen())
        << "a field the eval report did not name\n"
        << p.DebugString();
  }
  // Train windows: loss and lr, no eval and no scalars.
  const std::vector<v1::MetricPoint> trains = Points(id, v1::MetricPoint::KIND_TRAIN);
  ASSERT_EQ(trains.size(), 4u);
  for (const v1::MetricPoint& p : trains) {
    EXPECT_TRUE(p.has_loss() && p.has_lr()) << p.DebugString();
    EXPECT_DOUBLE_EQ(p.loss(), 1.0 / static_cast<double>(p.step()));
    EXPECT_FALSE(p.has_eval()) << p.DebugString();
    EXPECT_EQ(p.scalars_size(), 0) << p.DebugString();
    EXPECT_FALSE(p.has_samples_per_sec() || p.has_data_ms() || p.has_loss_scale())
        << p.DebugString();
  }

  // `trainctl metrics --kind eval` lists them, empty where nothing was reported.
  std::string out;
  ASSERT_EQ(Cli({"metrics", id, "--kind", "eval", "-o", "csv"}, &out), 0) << out;
  EXPECT_THAT(
      out,
      HasSubstr("attempt,rank,kind,epoch,step,loss,lr,samples_per_sec,data_ms,compute_ms,comm_ms,"
                "loss_scale,eval_loss,eval_accuracy,val_f1,time\n"));
  EXPECT_THAT(out, HasSubstr("\n1,0,eval,1,2,,,,,,,,,0.2500,0.75,")) << out;
  EXPECT_THAT(out, HasSubstr("\n1,0,eval,1,4,,,,,,,,,0.5000,1,")) << out;
  EXPECT_THAT(out, Not(HasSubstr(",train,"))) << out;
  ASSERT_EQ(Cli({"metrics", id, "--kind", "train", "-o", "csv"}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("\n1,0,train,1,4,0.25,0.1,,,,,,,,")) << out;

  // The summary says what was reported: a loss, the best eval, no rate.
  ASSERT_EQ(Cli({"describe", id}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("best eval accuracy 50.00% (epoch 1), last loss 0.2500")) << out;
  EXPECT_THAT(out, HasSubstr("Last eval")) << out;
  EXPECT_THAT(out, HasSubstr("epoch 1: accuracy 50.00%")) << out;
  EXPECT_THAT(out, Not(HasSubstr("samples/s"))) << out;

  // TensorBoard: the tags of what was reported (floats: exact in float32).
  const std::string tb = TensorBoard("typed");
  EXPECT_THAT(tb, HasSubstr("\"eval/accuracy\": 0.5,")) << tb;
  EXPECT_THAT(tb, HasSubstr("\"val_f1\": 1.0")) << tb;
  EXPECT_THAT(tb, HasSubstr("\"train/loss\": 0.25")) << tb;
  EXPECT_THAT(tb, HasSubstr("\"train/lr\": 0.1")) << tb;
  EXPECT_THAT(tb, Not(HasSubstr("eval/loss"))) << tb;
  EXPECT_THAT(tb, Not(HasSubstr("samples_per_sec"))) << tb;
}

TEST_F(CommandReportTest, AJobThatOnlyEvaluatesHasNoInventedLossOrRate) {
  const std::string id = RunScript("evalonly", kEvalOnlyScript);
  ASSERT_FALSE(id.empty());
  const std::vector<v1::MetricPoint> evals = Points(id, v1::MetricPoint::KIND_EVAL);
  ASSERT_EQ(evals.size(), 1u);
  EXPECT_TRUE(evals[0].eval().has_loss());
  EXPECT_DOUBLE_EQ(evals[0].eval().loss(), 0.5);
  EXPECT_FALSE(evals[0].eval().has_accuracy());
  EXPECT_FALSE(evals[0].has_loss());
  EXPECT_DOUBLE_EQ(evals[0].scalars().at("f1"), 0.25);
  EXPECT_TRUE(Points(id, v1::MetricPoint::KIND_TRAIN).empty()) << "a report that was all eval";

  const v1::Job job = cluster_->Get(id);
  EXPECT_FALSE(job.metric_summary().has_last_loss()) << job.metric_summary().DebugString();
  EXPECT_FALSE(job.metric_summary().has_mean_samples_per_sec())
      << job.metric_summary().DebugString();
  EXPECT_FALSE(job.progress().has_last_loss()) << job.progress().DebugString();
  std::string out;
  ASSERT_EQ(Cli({"describe", id}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("best eval loss 0.5000 (epoch 2)")) << out;
  EXPECT_THAT(out, Not(HasSubstr("last loss"))) << out;
  EXPECT_THAT(out, Not(HasSubstr("samples/s"))) << out;
  const std::string tb = TensorBoard("evalonly");
  EXPECT_THAT(tb, HasSubstr("\"eval/loss\": 0.5")) << tb;
  EXPECT_THAT(tb, HasSubstr("\"f1\": 0.25")) << tb;
  EXPECT_THAT(tb, Not(HasSubstr("train/"))) << tb;
}

// torchrun's defaults and flags: a script that is not there fails once (no
// restarts in a local run, and exit 2 would not heal anyway), --standalone
// is accepted, a rendezvous flag is refused by name, and so is --nnodes > 1.
TEST(CommandRunTest, AMissingScriptFailsOnceAndTorchrunsFlagsAreKnown) {
  std::string build = trainctl::testing::BuildDirOfThisTest();
  char tmpl[] = "/tmp/trainctl-run-missing-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  trainctl::testing::Process run(
      {build + "/client/trainctl", "run", "--standalone", "--nproc-per-node", "2", "--python",
       "/usr/bin/python3", "--state-dir", dir + "/state", "nothere.py"},
      dir + "/run.log", dir);
  ASSERT_TRUE(run.Start());
  int status = run.Wait(absl::Seconds(60));
  std::string out = run.ReadLog();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status << "\n" << out;
  EXPECT_THAT(out, HasSubstr("exited with code 2 (a usage error"));
  EXPECT_THAT(out, HasSubstr("can't open file"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("  restarting  "))) << "one attempt, no restart";
  EXPECT_THAT(out, HasSubstr("not restarted"));

  trainctl::testing::Process refused(
      {build + "/client/trainctl", "run", "--master-addr", "10.0.0.1", "--python",
       "/usr/bin/python3", "--state-dir", dir + "/state2", "t.py"},
      dir + "/refused.log", dir);
  ASSERT_TRUE(refused.Start());
  status = refused.Wait(absl::Seconds(30));
  out = refused.ReadLog();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status << "\n" << out;
  EXPECT_THAT(out, HasSubstr("--master-addr: trainctl does the rendezvous"));

  // torchrun's --nnodes spans hosts; a local run is one: refused, saying
  // what to use instead, before anything starts.
  trainctl::testing::Process nodes(
      {build + "/client/trainctl", "run", "--nnodes", "2", "--nproc-per-node", "2", "--python",
       "/usr/bin/python3", "--state-dir", dir + "/state3", "t.py"},
      dir + "/nodes.log", dir);
  ASSERT_TRUE(nodes.Start());
  status = nodes.Wait(absl::Seconds(30));
  out = nodes.ReadLog();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status << "\n" << out;
  EXPECT_THAT(out,
              HasSubstr("--nnodes 2: trainctl run starts ranks on this host only (one node); use "
                        "--nproc-per-node for more ranks here, or trainctl submit --nnodes 2"));
  EXPECT_NE(access((dir + "/state3").c_str(), F_OK), 0) << "nothing started";
  // The same through the job's own scheduling.nodes.
  trainctl::testing::Process set_nodes(
      {build + "/client/trainctl", "run", "--nproc-per-node", "2", "--set", "scheduling.nodes=2",
       "--python", "/usr/bin/python3", "--state-dir", dir + "/state4", "t.py"},
      dir + "/set_nodes.log", dir);
  ASSERT_TRUE(set_nodes.Start());
  status = set_nodes.Wait(absl::Seconds(30));
  out = set_nodes.ReadLog();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status << "\n" << out;
  EXPECT_THAT(
      out,
      HasSubstr("scheduling.nodes: 2: trainctl run starts ranks on this host only (one node)"));
  EXPECT_NE(access((dir + "/state4").c_str(), F_OK), 0) << "nothing started";
  std::system(("rm -rf " + dir).c_str());
}

// torchrun's --log-dir / --redirects / --tee: each rank's selected streams
// land in <log dir>/<job id>/attempt_<R>/<rank>/{stdout,stderr}.log, R the
// restart count as torchrun numbers it (attempt_0 first); a selected stream
// the rank wrote nothing to has its file, empty; a redirected stream stays
// off the terminal, a teed one is on both.
TEST(CommandRunTest, LogDirRedirectsAndTeeWriteEachRanksStreamsToFiles) {
  std::string build = trainctl::testing::BuildDirOfThisTest();
  char tmpl[] = "/tmp/trainctl-run-logs-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  // Rank 1 writes no stdout; it waits for rank 0's lines, then fails the
  // first attempt (rank 0 is stopped), and the restart succeeds.
  std::ofstream(dir + "/talk.py")
      << "import os, sys, time\n"
         "r, n = os.environ['RANK'], os.environ['TORCHELASTIC_RESTART_COUNT']\n"
         "mark = 'rank0-wrote-' + n\n"
         "if r == '0':\n"
         "    print('out of rank 0 restart ' + n, flush=True)\n"
         "    print('err of rank 0 restart ' + n, file=sys.stderr, flush=True)\n"
         "    open(mark, 'w').close()\n"
         "    if n == '0': time.sleep(300)\n"
         "else:\n"
         "    while not os.path.exists(mark): time.sleep(0.05)\n"
         "    print('err of rank 1 restart ' + n, file=sys.stderr, flush=True)\n"
         "    sys.exit(3 if n == '0' else 0)\n";
  trainctl::testing::Process run(
      {build + "/client/trainctl", "run", "--nproc-per-node", "2", "--python", "/usr/bin/python3",
       "--state-dir", dir + "/state", "--max-restarts", "1", "--log-dir", dir + "/logs",
       "--redirects", "1", "--tee", "0:2", "talk.py"},
      dir + "/run.log", dir);
  ASSERT_TRUE(run.Start());
  int status = run.Wait(absl::Seconds(90));
  const std::string out = run.ReadLog();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("submitted job (\\S+)"))) << out;
  const std::string job = m[1];
  auto slurp = [](const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  for (int n : {0, 1}) {
    const std::string attempt = absl::StrCat(dir, "/logs/", job, "/attempt_", n);
    EXPECT_EQ(slurp(attempt + "/0/stdout.log"), absl::StrCat("out of rank 0 restart ", n, "\n"))
        << attempt;
    // (The failed attempt's reason quotes its last lines: not a rank line.)
    EXPECT_THAT(out, Not(HasSubstr("[rank0]: out of rank 0"))) << "stdout is redirected";
    EXPECT_EQ(access((attempt + "/1/stdout.log").c_str(), F_OK), 0)
        << "rank 1's stdout is selected: its file is there";
    EXPECT_EQ(slurp(attempt + "/1/stdout.log"), "") << "and empty";
    for (int r : {0, 1}) {
      EXPECT_THAT(out, HasSubstr(absl::StrCat("[rank", r, "]: err of rank ", r, " restart ", n)))
          << "stderr stays on the terminal";
    }
    EXPECT_EQ(slurp(attempt + "/0/stderr.log"), absl::StrCat("err of rank 0 restart ", n, "\n"))
        << "rank 0's stderr is teed";
    EXPECT_NE(access((attempt + "/1/stderr.log").c_str(), F_OK), 0) << "rank 1's is not";
  }
  EXPECT_NE(access((dir + "/logs/" + job + "/attempt_2").c_str(), F_OK), 0)
      << "two attempts: attempt_0, attempt_1";

  // --redirects without --log-dir is a usage error, before anything starts.
  trainctl::testing::Process refused(
      {build + "/client/trainctl", "run", "--nproc-per-node", "1", "--python", "/usr/bin/python3",
       "--state-dir", dir + "/state2", "--redirects", "3", "talk.py"},
      dir + "/refused.log", dir);
  ASSERT_TRUE(refused.Start());
  status = refused.Wait(absl::Seconds(30));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status << "\n" << refused.ReadLog();
  EXPECT_THAT(refused.ReadLog(), HasSubstr("--redirects: needs --log-dir"));
  std::system(("rm -rf " + dir).c_str());
}

// Issue #44: a temporary directory, removed with what it holds.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/trainctl-run-XXXXXX";
    if (mkdtemp(tmpl) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    if (!path_.empty()) std::system(("rm -rf " + path_).c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// `trainctl run ARGS...` in `dir` with PATH set to `path`; its exit status
// (-1: still running after 90 s) and output.
std::pair<int, std::string> TrainctlRun(const std::string& dir, const std::string& path,
                                        const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/env", "PATH=" + path,
                                   trainctl::testing::BuildDirOfThisTest() + "/client/trainctl",
                                   "run"};
  argv.insert(argv.end(), args.begin(), args.end());
  static int n = 0;
  trainctl::testing::Process run(argv, absl::StrCat(dir, "/run-", ++n, ".log"), dir);
  if (!run.Start()) return {-1, "cannot start trainctl"};
  const int status = run.Wait(absl::Seconds(90));
  return {status, run.ReadLog()};
}

bool ExitedWith(int status, int code) {
  return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == code;
}

// --python defaults to python3 on PATH; when it cannot import torch the
// reason names that interpreter (resolved), and the job is not restarted;
// an interpreter that is not there fails the pre-flight, before any rank
// starts, naming the field and the path.
TEST(CommandRunTest, TheInterpreterIsNamedWhenTorchIsMissingAndCheckedBeforeRanksStart) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  // A Python without torch, as a fresh venv is.
  if (std::system(("/usr/bin/python3 -m venv --without-pip " + dir.path() + "/venv >/dev/null 2>&1")
                      .c_str()) != 0) {
    GTEST_SKIP() << "python3 -m venv is not available";
  }
  std::ofstream(dir.path() + "/needs_torch.py") << "import torch\nprint('never here')\n";
  const std::string path = dir.path() + "/venv/bin:/usr/bin:/bin";
  auto [status, out] = TrainctlRun(
      dir.path(), path,
      {"--nproc-per-node", "2", "--state-dir", dir.path() + "/state", "needs_torch.py"});
  ASSERT_TRUE(ExitedWith(status, 1)) << status << "\n" << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat(
                       "ModuleNotFoundError: No module named 'torch' (interpreter: ", dir.path(),
                       "/venv/bin/python3)")));
  EXPECT_THAT(out, Not(HasSubstr("never here")));
  EXPECT_THAT(out, Not(HasSubstr("  restarting  "))) << "an import error is not restarted";

  std::tie(status, out) = TrainctlRun(dir.path(), path,
                                      {"--python", dir.path() + "/nothere/python3", "--state-dir",
                                       dir.path() + "/state2", "needs_torch.py"});
  ASSERT_TRUE(ExitedWith(status, 1)) << status << "\n" << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("pre-flight failed: ")));
  EXPECT_THAT(out, HasSubstr(absl::StrCat(
                       "command.argv[0] ", dir.path(),
                       "/nothere/python3: no such file (the Python interpreter: `trainctl "
                       "run/submit --python`)")));
  EXPECT_THAT(out, Not(HasSubstr("[rank0]"))) << "no rank started";
}

// torchrun's TORCHELASTIC_ERROR_FILE: a file in each rank's own directory;
// a script decorated with torch.distributed.elastic's @record writes its
// exception there, and that message is the job's reason (here the script's
// stderr goes nowhere, so the file is the only place that has it).
TEST(CommandRunTest, RecordedErrorFileIsTheReason) {
  if (!HaveTorch()) GTEST_SKIP() << "Debian's python3-torch is not installed";
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  std::ofstream(dir.path() + "/recorded.py")
      << "import os, sys\n"
         "from torch.distributed.elastic.multiprocessing.errors import record\n"
         "@record\n"
         "def main():\n"
         "    print('error file ' + os.environ['TORCHELASTIC_ERROR_FILE'], flush=True)\n"
         "    sys.stderr = open(os.devnull, 'w')\n"
         "    raise ValueError('learning rate must be positive, got -1\\nsecond line')\n"
         "if __name__ == '__main__':\n"
         "    main()\n";
  auto [status, out] = TrainctlRun(dir.path(), "/usr/bin:/bin",
                                   {"--nproc-per-node", "2", "--python", "/usr/bin/python3",
                                    "--state-dir", dir.path() + "/state", "recorded.py"});
  ASSERT_TRUE(ExitedWith(status, 1)) << status << "\n" << out;
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(out, m,
                        std::regex("FAILED after [^:]*: rank ([01]) [^\n]*exited with code 1: "
                                   "ValueError: learning rate must be positive, got -1\n")))
      << out;
  // The rank that failed first (the other may be stopped before it prints).
  const std::string r = m[1];
  EXPECT_THAT(out, MatchesRegex(absl::StrCat("(.|\n)*\\[rank", r, "\\]: error file /[^ ]*/rank-", r,
                                             "/error\\.json\n(.|\n)*")));
  EXPECT_THAT(out, Not(HasSubstr("Traceback")))
      << "stderr went nowhere: the reason came from the file";
}

TEST(CommandRunTest, TrainctlRunIsADropInForTorchrun) {
  if (!HaveTorch()) GTEST_SKIP() << "Debian's python3-torch is not installed";
  std::string build = trainctl::testing::BuildDirOfThisTest();
  char tmpl[] = "/tmp/trainctl-run-cmd-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  trainctl::testing::Process run(
      {build + "/client/trainctl", "run", "--nproc_per_node", "2", "--python", "/usr/bin/python3",
       "--state-dir", dir + "/state", Script(), "--epochs", "1"},
      dir + "/run.log", dir);
  ASSERT_TRUE(run.Start());
  int status = run.Wait(absl::Seconds(60));
  std::string out = run.ReadLog();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << out;
  EXPECT_THAT(
      out,
      HasSubstr("[rank0]: local_rank=0 from env TORCHELASTIC_RESTART_COUNT=0 OMP_NUM_THREADS=1"));
  EXPECT_THAT(out, HasSubstr("[rank1]: local_rank=1 from env"));
  EXPECT_THAT(out, HasSubstr("[rank1]: rank 1 final parameters"));
  EXPECT_THAT(out, HasSubstr("identical=True"));
  std::system(("rm -rf " + dir).c_str());
}

// Issue #27 item 4, in a pseudo-terminal (util-linux `script`): the live
// status line and the ranks' output never share a screen line. A terminal is
// emulated on the captured bytes: "\r\033[K" clears the line, a lone "\r"
// returns to its start, "\r\n" (the pty's newline) ends it.
TEST(CommandRunTest, InATerminalRankLinesNeverLandOnTheStatusLine) {
  if (!HaveTorch()) GTEST_SKIP() << "Debian's python3-torch is not installed";
  if (access("/usr/bin/script", X_OK) != 0)
    GTEST_SKIP() << "no /usr/bin/script (util-linux) for a pty";
  std::string build = trainctl::testing::BuildDirOfThisTest();
  char tmpl[] = "/tmp/trainctl-run-pty-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  const std::string cmd =
      absl::StrCat(build, "/client/trainctl run --nproc_per_node 2 --python /usr/bin/python3 ",
                   "--state-dir ", dir, "/state ", Script(), " --epochs 1");
  trainctl::testing::Process run({"/usr/bin/script", "-qec", cmd, "/dev/null"}, dir + "/run.log",
                                 dir);
  ASSERT_TRUE(run.Start());
  int status = run.Wait(absl::Seconds(90));
  const std::string out = run.ReadLog();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << out;
  EXPECT_THAT(out, HasSubstr("\r\033[K")) << "a terminal gets the live status line";
  std::vector<std::string> screen;
  std::string line;
  size_t col = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out.compare(i, 4, "\r\033[K") == 0) {
      line.clear();
      col = 0;
      i += 3;
    } else if (out.compare(i, 2, "\r\n") == 0 || out[i] == '\n') {
      screen.push_back(line);
      line.clear();
      col = 0;
      if (out[i] == '\r') ++i;
    } else if (out[i] == '\r') {
      col = 0;
    } else {
      if (col < line.size()) {
        line[col] = out[i];
      } else {
        line += out[i];
      }
      ++col;
    }
  }
  int rank_lines = 0;
  for (const std::string& l : screen) {
    const size_t at = l.find("[rank");
    if (at == std::string::npos) continue;
    ++rank_lines;
    EXPECT_EQ(at, 0u) << "a rank line shares its screen line: '" << l << "'";
  }
  EXPECT_GT(rank_lines, 2);
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace trainctl
