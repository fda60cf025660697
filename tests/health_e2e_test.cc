// Failure classes and numerical health across real processes (coordinator,
// worker daemons, trainctl-rank or a command's program, Gloo on loopback):
//  - a NaN loss injected at step N (health.debug_nan_at_step) rolls the job
//    back to its last checkpoint, skips step N, and the job SUCCEEDS;
//  - a loss that runs away (health.divergence) fails the job as NAN;
//  - a program killed by the kernel's OOM killer (a memory cgroup with a
//    limit around its worker) fails the job as OUT_OF_MEMORY, not a crash.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"

namespace trainctl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using trainctl::testing::Cluster;

class HealthE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string build = trainctl::testing::BuildDirOfThisTest();
    cluster_ = std::make_unique<Cluster>(build, build + "/worker/trainer/trainctl-rank");
    ASSERT_TRUE(cluster_->StartCoordinator());
  }

  // Stored events as "type@attempt: message".
  std::vector<std::string> Events(const std::string& id) {
    grpc::ClientContext ctx;
    v1::WatchJobRequest req;
    req.set_job_id(id);
    req.set_include_history(true);
    auto reader = cluster_->jobs()->WatchJob(&ctx, req);
    std::vector<std::string> out;
    v1::JobUpdate u;
    while (reader->Read(&u)) {
      if (u.has_event())
        out.push_back(
            absl::StrCat(u.event().type(), "@", u.event().attempt(), ": ", u.event().message()));
      if (u.has_job()) break;
    }
    ctx.TryCancel();
    return out;
  }

  std::unique_ptr<Cluster> cluster_;
};

TEST_F(HealthE2ETest, NanAtAStepRollsBackToTheLastCheckpointAndSucceeds) {
  ASSERT_TRUE(cluster_->StartWorker("w0"));
  ASSERT_TRUE(cluster_->StartWorker("w1"));
  ASSERT_TRUE(cluster_->WaitWorkers(2));
  std::string src = std::getenv("TRAINCTL_SOURCE_DIR") ? std::getenv("TRAINCTL_SOURCE_DIR") : ".";
  // 3000 samples / 2 ranks / batch 30 = 50 steps per epoch; step 60 is in
  // epoch 1, after the epoch-0 checkpoint (step 50).
  ParsedJobSpec p = ParseJobSpecFile(
      src + "/examples/mlp-synthetic.yaml",
      {"health.debug_nan_at_step=60", "health.max_rollbacks=1", "restart.max_restarts=0"});
  ASSERT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
  std::string id = cluster_->Submit(p.spec);
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(180));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  EXPECT_EQ(j.restarts(), 0) << "a rollback is not a restart";
  ASSERT_EQ(j.attempts_size(), 2);
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_NAN);
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("NaN/Inf gradients at step 60 (epoch 1)"));
  // Both ranks saw the NaN that only rank 0's loss had: the all-reduce spread it.
  for (const v1::RankAssignment& r : j.attempts(0).ranks()) {
    if (r.exit().kind() == v1::FAILURE_KIND_NAN) {
      EXPECT_EQ(r.exit().step(), 60);
    }
  }
  const v1::Attempt& a2 = j.attempts(1);
  EXPECT_THAT(a2.skip_steps(), ElementsAre(60));
  ASSERT_TRUE(a2.has_resume());
  EXPECT_EQ(a2.resume().global_step(), 50);
  EXPECT_THAT(Events(id),
              ::testing::Contains(
                  "rollback@1: NaN/Inf at step 60: rolling back to the checkpoint at step 50 and "
                  "skipping step 60 (rollback 1 of 1)"));
  for (int rank = 0; rank < 2; ++rank) {
    std::string log = cluster_->RankLog(id, 2, rank);
    EXPECT_THAT(log, HasSubstr("skipping step 60 (epoch 1): rolled back after a NaN there")) << log;
    EXPECT_THAT(log, HasSubstr("done: 3 epochs, 150 steps, 1 skipped")) << log;
  }
}

// Issue #30 item 8: Adam at lr 1e6 runs the loss up to ~1e6 within the first
// metric window. That is a divergence (health.divergence.factor, default
// 1e4, against the first step's loss): with on_nan: fail the job FAILS as
// NAN at the first window (step 9, metrics every 10 steps) on both ranks,
// instead of "succeeding" with a ruined model.
TEST_F(HealthE2ETest, ARunawayLossFailsTheJobAsNan) {
  ASSERT_TRUE(cluster_->StartWorker("w0"));
  ASSERT_TRUE(cluster_->StartWorker("w1"));
  ASSERT_TRUE(cluster_->WaitWorkers(2));
  std::string src = std::getenv("TRAINCTL_SOURCE_DIR") ? std::getenv("TRAINCTL_SOURCE_DIR") : ".";
  ParsedJobSpec p = ParseJobSpecFile(
      src + "/examples/mlp-synthetic.yaml",
      {"training.optimizer.lr=1000000", "health.on_nan=fail", "restart.max_restarts=0"});
  ASSERT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
  std::string id = cluster_->Submit(p.spec);
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_FAILED, absl::Seconds(120));
  ASSERT_EQ(j.state(), v1::JOB_STATE_FAILED) << j.state_reason();
  ASSERT_EQ(j.attempts_size(), 1);
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_NAN);
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("loss diverged at step 9 (epoch 0)"));
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("health.divergence.factor 10000"));
  // Every rank decides alike: the first to report fails the attempt, and
  // no rank fails any other way (the rest are stopped or report NAN too).
  int nan = 0;
  for (const v1::RankAssignment& r : j.attempts(0).ranks()) {
    nan += r.exit().kind() == v1::FAILURE_KIND_NAN;
    EXPECT_THAT(r.exit().kind(),
                ::testing::AnyOf(v1::FAILURE_KIND_NAN, v1::FAILURE_KIND_UNSPECIFIED))
        << "rank " << r.rank() << ": " << r.exit().message();
  }
  EXPECT_GE(nan, 1);
}

// A memory cgroup with a limit, or "" when this host does not let the test
// make one (then the test is skipped, saying so).
struct MemoryCgroup {
  std::string dir;
  std::string procs;
  ~MemoryCgroup() {
    if (!dir.empty()) ::rmdir(dir.c_str());
  }
  bool Create(const std::string& name, int64_t limit_bytes) {
    namespace fs = std::filesystem;
    std::error_code ec;
    // cgroup v1 (a memory hierarchy), else v2 with the memory controller.
    for (const auto& [root, limit_file] : std::vector<std::pair<std::string, std::string>>{
             {"/sys/fs/cgroup/memory", "memory.limit_in_bytes"},
             {"/sys/fs/cgroup", "memory.max"}}) {
      if (!fs::exists(root + "/cgroup.procs", ec)) continue;
      const std::string d = root + "/" + name;
      if (::mkdir(d.c_str(), 0755) != 0) continue;
      std::ofstream(d + "/" + limit_file) << limit_bytes;
      std::ifstream in(d + "/" + limit_file);
      int64_t got = 0;
      if (!fs::exists(d + "/" + limit_file, ec) || !(in >> got) || got > limit_bytes + 4096) {
        ::rmdir(d.c_str());
        continue;
      }
      dir = d;
      procs = d + "/cgroup.procs";
      return true;
    }
    return false;
  }
  bool Add(pid_t pid) {
    std::ofstream out(procs);
    out << pid << std::endl;
    return out.good();
  }
};

TEST_F(HealthE2ETest, ProgramKilledByTheOomKillerIsOutOfMemory) {
  MemoryCgroup cg;
  if (!cg.Create(absl::StrCat("trainctl-health-e2e-", ::getpid()), 256 << 20)) {
    GTEST_SKIP()
        << "cannot create a memory cgroup with a limit here (no writable cgroup memory controller)";
  }
  ASSERT_TRUE(cluster_->StartWorker("w0", 1, false, {"--allow_commands"}));
  ASSERT_TRUE(cluster_->WaitWorkers(1));
  // The daemon and every program it starts from now on live under the limit.
  ASSERT_TRUE(cg.Add(cluster_->worker("w0")->pid()));
  // A memory hog: 1 GiB of written bytes under a 256 MiB limit, no swap here.
  ParsedJobSpec p = ParseJobSpecYaml(
      "name: hog\nworld_size: 1\ndevice: cpu\n"
      "command:\n  argv: [/usr/bin/python3, -c, \"b = b'x' * (1 << 30); print(len(b))\"]\n",
      "hog.yaml", {"restart.max_restarts=2"});
  ASSERT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
  std::string id = cluster_->Submit(p.spec);
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_FAILED, absl::Seconds(60));
  cluster_->KillWorker("w0");  // leaves the cgroup empty for its removal
  ASSERT_EQ(j.state(), v1::JOB_STATE_FAILED) << j.state_reason();
  ASSERT_EQ(j.attempts_size(), 1) << "out of memory is not restarted";
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_OUT_OF_MEMORY);
  EXPECT_EQ(j.attempts(0).ranks(0).exit().signal(), SIGKILL);
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("rank 0 was killed by the OOM killer"));
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("lower data.batch_size"));
  EXPECT_THAT(j.state_reason(), HasSubstr("out of memory: not restarted"));
}

// Pre-flight: a data file that exists on one worker (relative paths resolve
// against each daemon's working directory) and not on the other fails the
// attempt with one reason naming only that worker, before any rank starts.
TEST_F(HealthE2ETest, DataFileMissingOnOneWorkerFailsPreflightBeforeAnyRankStarts) {
  namespace fs = std::filesystem;
  // Data anywhere (--data-root=/): without it a worker reads only its work
  // dir and /usr/share/datasets.
  ASSERT_TRUE(
      cluster_->StartWorker("w0", 1, /*relative_paths=*/true, {"--data-root=/"}));  // runs in dir()
  ASSERT_TRUE(
      cluster_->StartWorker("w1", 1, false, {"--data-root=/"}));  // runs in the test's directory
  ASSERT_TRUE(cluster_->WaitWorkers(2));
  const std::string rel = absl::StrCat("preflight-data-", ::getpid(), "/train.csv");
  fs::create_directories((fs::path(cluster_->dir()) / rel).parent_path());
  std::ofstream(fs::path(cluster_->dir()) / rel) << "a,b,label\n1,2,0\n3,4,1\n";
  ASSERT_FALSE(fs::exists(rel)) << "the test's own directory must not hold it";
  ParsedJobSpec p = ParseJobSpecYaml(absl::StrCat("name: pf\nworld_size: 2\ndevice: cpu\n"
                                                  "model: {name: mlp, input_dim: 2, classes: 2}\n"
                                                  "data: {train: {format: csv, path: ",
                                                  rel, "}}\n"),
                                     "pf.yaml", {});
  ASSERT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
  std::string id = cluster_->Submit(p.spec);
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_FAILED, absl::Seconds(30));
  ASSERT_EQ(j.state(), v1::JOB_STATE_FAILED) << j.state_reason();
  ASSERT_EQ(j.attempts_size(), 1) << "pre-flight failures are not restarted";
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_PREFLIGHT);
  // The id the coordinator gave w1, from its daemon's registration log line.
  const std::string w1_log = cluster_->worker("w1")->ReadLog();
  const size_t at = w1_log.find("worker_id=");
  ASSERT_NE(at, std::string::npos) << w1_log;
  const std::string w1_id = w1_log.substr(at + 10, w1_log.find_first_of(" \n", at) - at - 10);
  for (const v1::RankAssignment& r : j.attempts(0).ranks())
    EXPECT_EQ(r.state(), v1::RANK_STATE_STOPPED);
  const std::string missing = (fs::current_path() / rel).lexically_normal().string();
  EXPECT_EQ(j.attempts(0).reason(), absl::StrCat("pre-flight failed: ", w1_id, ": data.train.path ",
                                                 missing, ": no such file"));
  int failures = 0;
  for (const std::string& e : Events(id))
    failures += e.rfind("attempt_failed@1: pre-flight failed: ", 0) == 0;
  EXPECT_EQ(failures, 1);
  // No rank process was ever started on either worker.
  for (const std::string name : {"w0", "w1"}) {
    EXPECT_THAT(cluster_->worker(name)->ReadLog(), ::testing::Not(HasSubstr("rank_started")))
        << name;
    EXPECT_FALSE(
        fs::exists(absl::StrCat(cluster_->dir(), "/worker-", name, "/jobs/", id, "/attempt-1")))
        << name;
  }
  fs::remove_all((fs::path(cluster_->dir()) / rel).parent_path());
}

}  // namespace
}  // namespace trainctl
