// Checkpoints belong to their job (real coordinator, worker daemons and
// trainctl-rank processes on loopback, Gloo on CPU):
//  - a restart resumes exactly the coordinator's record of this job's newest
//    checkpoint, never another job's newer file in the same directory;
//  - with per-worker directories, losing rank 0's host for good still
//    resumes from the copy the other host wrote (rank 0 moves there);
//  - `resume_from` continues a cancelled job at its step, and a finished
//    job for the added epochs only; an incompatible spec is refused.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using trainctl::testing::Cluster;

// The classic example made slow enough (hidden layers, many samples) that a
// test can act between epochs.
v1::JobSpec SlowClassic(int epochs, std::vector<std::string> extra = {}) {
  std::string src = std::getenv("TRAINCTL_SOURCE_DIR") ? std::getenv("TRAINCTL_SOURCE_DIR") : ".";
  std::vector<std::string> sets = {absl::StrCat("training.epochs=", epochs),
                                   "data.train.length=60000", "model.hidden=[128, 128]",
                                   "restart.max_restarts=2"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  ParsedJobSpec p = ParseJobSpecFile(src + "/examples/mlp-synthetic.yaml", sets);
  EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
  return p.spec;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A tmpfs of `mb` MiB mounted on `dir` (made) for one test, unmounted at
// its end; `why_not` says why it could not be (the test skips).
struct SmallDisk {
  std::string dir, why_not;
  SmallDisk(std::string where, int mb) : dir(std::move(where)) {
    if (geteuid() != 0) {
      why_not = "mounting a small tmpfs needs root";
      return;
    }
    std::filesystem::create_directories(dir);
    if (std::system(absl::StrCat("mount -t tmpfs -o size=", mb, "m tmpfs ", dir).c_str()) != 0) {
      why_not = "cannot mount a tmpfs here";
    }
  }
  ~SmallDisk() {
    if (why_not.empty()) (void)std::system(("umount -l " + dir).c_str());
  }
};

class CheckpointE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string build = trainctl::testing::BuildDirOfThisTest();
    cluster_ = std::make_unique<Cluster>(build, build + "/worker/trainer/trainctl-rank");
    ASSERT_TRUE(cluster_->StartCoordinator());
  }

  static int64_t NewestEpochs(const v1::Job& j) {
    int64_t e = 0;
    for (const auto& r : j.checkpoints()) {
      if (r.job_id() == j.id()) e = std::max(e, r.epochs_done());
    }
    return e;
  }

  // Epochs (from 0) that `rank` of `attempt` finished, from its "epoch N/M:" log lines.
  std::set<int> EpochsTrained(const std::string& id, int attempt, int rank) {
    std::set<int> out;
    std::istringstream in(cluster_->RankLog(id, attempt, rank));
    std::string line;
    while (std::getline(in, line)) {
      size_t at = line.find("epoch ");
      size_t slash = line.find('/', at);
      size_t colon = line.find(':', at);
      if (at == std::string::npos || slash == std::string::npos || colon == std::string::npos ||
          slash > colon)
        continue;
      int n = 0;
      if (absl::SimpleAtoi(line.substr(at + 6, slash - at - 6), &n)) out.insert(n - 1);
    }
    return out;
  }

  // Name ("w0"...) of the worker running `rank` of attempt `attempt`.
  std::string WorkerOf(const std::string& id, int attempt, int rank,
                       const std::vector<std::string>& names) {
    for (const std::string& n : names) {
      if (!Cluster::ProcessesMatching(
               absl::StrCat("/worker-", n, "/jobs/", id, "/attempt-", attempt, "/rank-", rank))
               .empty()) {
        return n;
      }
    }
    return "";
  }

  std::unique_ptr<Cluster> cluster_;
};

// The bug this guards: another run's newer checkpoint in the same directory
// was resumed after a crash and its model shipped as SUCCEEDED.
TEST_F(CheckpointE2ETest, RestartResumesItsOwnRecordNotAnotherJobsNewerFile) {
  ASSERT_TRUE(cluster_->StartWorker("w0", 2));
  ASSERT_TRUE(cluster_->WaitWorkers(1));
  const std::string dir = cluster_->dir() + "/shared-ckpt";
  // An earlier run trains 3 epochs into the directory and leaves its files.
  std::string first =
      cluster_->Submit(SlowClassic(3, {"checkpoint.dir=" + dir, "checkpoint.shared=true"}));
  ASSERT_FALSE(first.empty());
  v1::Job j1 = cluster_->WaitState(first, v1::JOB_STATE_SUCCEEDED, absl::Seconds(120));
  ASSERT_EQ(j1.state(), v1::JOB_STATE_SUCCEEDED) << j1.state_reason();
  const std::string first_model = ReadFile(dir + "/" + first + ".model.pt");
  ASSERT_FALSE(first_model.empty());
  ASSERT_TRUE(std::filesystem::exists(absl::StrCat(dir, "/", first, ".ckpt-epoch-000003.pt")));

  // A new job (another data order, so another model) in the same directory;
  // a rank is killed after its first checkpoint.
  std::string id = cluster_->Submit(SlowClassic(
      3, {"checkpoint.dir=" + dir, "checkpoint.shared=true", "data.seed=7", "checkpoint.keep=1"}));
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitFor(id, [](const v1::Job& x) {
    return NewestEpochs(x) >= 1 || x.state() >= v1::JOB_STATE_SUCCEEDED;
  });
  ASSERT_EQ(NewestEpochs(j), 1) << "the test needs to act in epoch 2; state " << j.state();
  std::vector<pid_t> victim =
      Cluster::ProcessesMatching(absl::StrCat("/jobs/", id, "/attempt-1/rank-1"));
  ASSERT_FALSE(victim.empty());
  ::kill(victim.front(), SIGKILL);

  j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(120));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  ASSERT_EQ(j.attempts_size(), 2) << [&] {
    std::string events;
    for (const v1::Event& e : cluster_->Events(id))
      absl::StrAppend(&events, "\n  ", e.type(), " #", e.attempt(), ": ", e.message());
    return events;
  }();
  const v1::Attempt& a2 = j.attempts(1);
  ASSERT_TRUE(a2.has_resume());
  EXPECT_EQ(a2.resume().job_id(), id);
  EXPECT_EQ(a2.resume().epochs_done(), 1);
  EXPECT_THAT(cluster_->RankLog(id, 2, 0), HasSubstr("at epoch 1,"));
  // Attempt 2 trained the remaining epochs (1 and 2), on both ranks.
  EXPECT_EQ(EpochsTrained(id, 2, 0), (std::set<int>{1, 2}));
  EXPECT_EQ(EpochsTrained(id, 2, 1), (std::set<int>{1, 2}));
  // The exported model is this job's, beside the earlier run's, which is
  // intact (every file a job writes is named for it).
  const std::string model = ReadFile(dir + "/" + id + ".model.pt");
  ASSERT_FALSE(model.empty());
  EXPECT_NE(model, first_model);
  EXPECT_EQ(ReadFile(dir + "/" + first + ".model.pt"), first_model);
  EXPECT_EQ(j.final_model(), dir + "/" + id + ".model.pt");
  // keep=1 deleted only this job's older files: the earlier run's are intact.
  EXPECT_TRUE(std::filesystem::exists(absl::StrCat(dir, "/", first, ".ckpt-epoch-000003.pt")));
}

// Per-worker directories (the default): the restart after rank 0's host is
// lost for good resumes from the copy rank 1's host wrote, at step >= one epoch.
TEST_F(CheckpointE2ETest, LostHostsCheckpointResumesFromTheOtherHostsCopy) {
  ASSERT_TRUE(cluster_->StartWorker("w0"));
  ASSERT_TRUE(cluster_->StartWorker("w1"));
  ASSERT_TRUE(cluster_->WaitWorkers(2));
  std::string id = cluster_->Submit(SlowClassic(4));
  ASSERT_FALSE(id.empty());
  // Both hosts recorded their copy of the epoch-1 checkpoint.
  v1::Job j = cluster_->WaitFor(id, [](const v1::Job& x) {
    int copies = 0;
    for (const auto& r : x.checkpoints()) copies += r.epochs_done() >= 1 ? 1 : 0;
    return copies >= 2 || x.state() >= v1::JOB_STATE_SUCCEEDED;
  });
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.state_reason();
  int64_t steps_per_epoch = 0;
  for (const auto& r : j.checkpoints()) {
    if (r.epochs_done() == 1) steps_per_epoch = r.global_step();
  }
  ASSERT_GT(steps_per_epoch, 0);
  const std::string rank0 = WorkerOf(id, 1, 0, {"w0", "w1"});
  ASSERT_FALSE(rank0.empty());
  const std::string rank0_id = j.attempts(0).ranks(0).worker_id();
  cluster_->KillWorker(rank0, SIGKILL);
  j = cluster_->WaitState(id, v1::JOB_STATE_RESTARTING, absl::Seconds(20));
  ASSERT_EQ(j.state(), v1::JOB_STATE_RESTARTING) << j.state_reason();
  // A third host joins; rank 0's old host stays down.
  ASSERT_TRUE(cluster_->StartWorker("w2"));
  j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(120));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  ASSERT_EQ(j.attempts_size(), 2) << [&] {
    std::string events;
    for (const v1::Event& e : cluster_->Events(id))
      absl::StrAppend(&events, "\n  ", e.type(), " #", e.attempt(), ": ", e.message());
    return events;
  }();
  const v1::Attempt& a2 = j.attempts(1);
  ASSERT_TRUE(a2.has_resume()) << "attempt 2 started from scratch";
  EXPECT_GE(a2.resume().global_step(), steps_per_epoch);
  EXPECT_NE(a2.resume().worker_id(), rank0_id);
  EXPECT_EQ(a2.ranks(0).worker_id(), a2.resume().worker_id())
      << "rank 0 runs where the checkpoint is";
  for (const auto& r : a2.ranks()) EXPECT_NE(r.worker_id(), rank0_id);
  bool said = false;
  for (const v1::Event& e : cluster_->Events(id)) {
    if (e.type() == "scheduled" && e.attempt() == 2) {
      said = true;
      EXPECT_THAT(e.message(), HasSubstr("resuming from the checkpoint of job " + id));
    }
  }
  EXPECT_TRUE(said);
  EXPECT_THAT(cluster_->RankLog(id, 2, 1), HasSubstr("received by broadcast"));
  std::set<int> want;
  for (int e = static_cast<int>(a2.resume().epochs_done()); e < 4; ++e) want.insert(e);
  EXPECT_EQ(EpochsTrained(id, 2, 0), want);
}

// `resume_from` continues a cancelled job at its checkpoint's step, and a
// finished job for the added epochs only; other models are refused.
TEST_F(CheckpointE2ETest, ResumeFromContinuesCancelledAndFinishedJobs) {
  ASSERT_TRUE(cluster_->StartWorker("w0", 2));
  ASSERT_TRUE(cluster_->WaitWorkers(1));
  std::string id = cluster_->Submit(SlowClassic(6));
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitFor(id, [](const v1::Job& x) {
    return NewestEpochs(x) >= 1 || x.state() >= v1::JOB_STATE_SUCCEEDED;
  });
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING);
  {
    grpc::ClientContext ctx;
    v1::CancelJobRequest req;
    req.set_job_id(id);
    v1::Job resp;
    ASSERT_TRUE(cluster_->jobs()->CancelJob(&ctx, req, &resp).ok());
  }
  j = cluster_->WaitState(id, v1::JOB_STATE_CANCELLED);
  ASSERT_EQ(j.state(), v1::JOB_STATE_CANCELLED);
  // Wait for the ranks to be gone (a checkpoint may still be reported).
  cluster_->WaitFor(id, [&](const v1::Job&) {
    return Cluster::ProcessesMatching("/jobs/" + id + "/attempt-1/rank-").empty();
  });
  j = cluster_->Get(id);
  const int64_t done = NewestEpochs(j);
  ASSERT_GE(done, 1);
  int64_t step = 0;
  for (const auto& r : j.checkpoints()) {
    if (r.epochs_done() == done) step = r.global_step();
  }

  // A different model cannot load the checkpoint: refused, naming the field.
  {
    v1::JobSpec bad = SlowClassic(6, {"model.hidden=[64]"});
    bad.mutable_resume_from()->set_job(id);
    grpc::Status s = cluster_->TrySubmit(bad);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("model"));
  }

  v1::JobSpec cont = SlowClassic(6);
  cont.mutable_resume_from()->set_job(id);
  std::string id2 = cluster_->Submit(cont);
  ASSERT_FALSE(id2.empty());
  v1::Job j2 = cluster_->WaitState(id2, v1::JOB_STATE_SUCCEEDED, absl::Seconds(180));
  ASSERT_EQ(j2.state(), v1::JOB_STATE_SUCCEEDED) << j2.state_reason();
  ASSERT_TRUE(j2.attempts(0).has_resume());
  EXPECT_EQ(j2.attempts(0).resume().job_id(), id);
  EXPECT_EQ(j2.attempts(0).resume().global_step(), step);
  std::set<int> epochs = EpochsTrained(id2, 1, 0);
  std::set<int> want;
  for (int e = static_cast<int>(done); e < 6; ++e) want.insert(e);
  EXPECT_EQ(epochs, want);

  // The finished job, continued for two more epochs: only those are trained.
  v1::JobSpec more = SlowClassic(8);
  more.mutable_resume_from()->set_job(id2);
  std::string id3 = cluster_->Submit(more);
  ASSERT_FALSE(id3.empty());
  v1::Job j3 = cluster_->WaitState(id3, v1::JOB_STATE_SUCCEEDED, absl::Seconds(120));
  ASSERT_EQ(j3.state(), v1::JOB_STATE_SUCCEEDED) << j3.state_reason();
  EXPECT_EQ(EpochsTrained(id3, 1, 0), (std::set<int>{6, 7}));
}

// Fencing (#30 finding 1): the daemon is stopped (SIGSTOP) past its lease
// while its ranks train on and keep checkpointing; the coordinator places
// attempt 2 on the newest checkpoint it recorded. The stale ranks' late
// reports are refused and they delete nothing (only the coordinator decides
// which files go), so attempt 2 finds its checkpoint and the job succeeds
// (before: "cannot open checkpoint", CONFIG, FAILED in 4 of 5 trials).
TEST_F(CheckpointE2ETest, AStoppedDaemonsStaleRanksNeverDestroyTheNewAttemptsCheckpoint) {
  ASSERT_TRUE(cluster_->StartWorker("w0", 2));
  ASSERT_TRUE(cluster_->WaitWorkers(1));
  std::string id = cluster_->Submit(SlowClassic(5, {"checkpoint.every_steps=50"}));
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitFor(id, [](const v1::Job& x) {
    return x.checkpoints_size() >= 2 || x.state() >= v1::JOB_STATE_SUCCEEDED;
  });
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.state_reason();
  cluster_->worker("w0")->Kill(SIGSTOP);
  j = cluster_->WaitFor(
      id, [](const v1::Job& x) { return x.state() != v1::JOB_STATE_RUNNING; }, absl::Seconds(30));
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING) << j.state_reason();
  // The orphans train on (and, before fencing, rotated the recorded files
  // away) for a while after the coordinator moved on.
  const std::string attempt1 = absl::StrCat("/jobs/", id, "/attempt-1/rank-");
  absl::SleepFor(absl::Seconds(4));
  EXPECT_FALSE(Cluster::ProcessesMatching(attempt1).empty()) << "the stale ranks ran on";
  cluster_->worker("w0")->Kill(SIGCONT);

  j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(180));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  ASSERT_GE(j.attempts_size(), 2);
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_WORKER_LOST);
  const v1::Attempt& a2 = j.attempts(1);
  ASSERT_TRUE(a2.has_resume()) << "attempt 2 started from scratch";
  EXPECT_EQ(a2.state(), v1::ATTEMPT_STATE_SUCCEEDED) << a2.reason();
  EXPECT_THAT(cluster_->RankLog(id, 2, 0), HasSubstr("resumed from " + a2.resume().path()));
  EXPECT_TRUE(Cluster::ProcessesMatching(attempt1).empty()) << "the stale ranks were stopped";
  // Every recorded checkpoint is attempt 2's or older than the stop, and
  // each file is there with its recorded size.
  for (const auto& r : j.checkpoints()) {
    EXPECT_TRUE(r.attempt() == 2 || r.global_step() <= a2.resume().global_step()) << r.path();
    std::error_code ec;
    EXPECT_EQ(static_cast<int64_t>(std::filesystem::file_size(r.path(), ec)), r.size_bytes())
        << r.path();
  }
}

// One writer per path (#30 finding 2): three hosts share one checkpoint.dir
// (not checkpoint.shared: each keeps its own copy). Each copy carries its
// worker's id in its name, so no host overwrites another's; after rank 0's
// host is lost the resume reads the copy its record names and succeeds.
TEST_F(CheckpointE2ETest, HostsSharingOneDirectoryWriteTheirOwnCopies) {
  for (const char* w : {"w0", "w1", "w2"}) ASSERT_TRUE(cluster_->StartWorker(w));
  ASSERT_TRUE(cluster_->WaitWorkers(3));
  const std::string dir = cluster_->dir() + "/one-dir";
  std::string id = cluster_->Submit(SlowClassic(4, {"world_size=3", "checkpoint.dir=" + dir}));
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitFor(id, [](const v1::Job& x) {
    int copies = 0;
    for (const auto& r : x.checkpoints()) copies += r.epochs_done() >= 1 ? 1 : 0;
    return copies >= 3 || x.state() >= v1::JOB_STATE_SUCCEEDED;
  });
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.state_reason();
  std::set<std::string> paths;
  for (const auto& r : j.checkpoints()) {
    if (r.epochs_done() != 1) continue;
    paths.insert(r.path());
    EXPECT_THAT(r.path(), HasSubstr("." + r.worker_id() + ".pt"))
        << "a per-host copy names its writer";
  }
  EXPECT_EQ(paths.size(), 3u) << "three hosts, three files";
  const std::string rank0 = WorkerOf(id, 1, 0, {"w0", "w1", "w2"});
  ASSERT_FALSE(rank0.empty());
  cluster_->KillWorker(rank0, SIGKILL);
  ASSERT_TRUE(cluster_->StartWorker("w3"));
  j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(180));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  ASSERT_GE(j.attempts_size(), 2);
  EXPECT_TRUE(j.attempts(1).has_resume()) << "attempt 2 started from scratch";
  for (const auto& a : j.attempts())
    EXPECT_NE(a.failure_kind(), v1::FAILURE_KIND_RESUME) << a.reason();
}

// A worker with --data-root / --checkpoint-root refuses a job whose files lie
// elsewhere (after resolving '..' and symlinks) in its pre-flight, naming
// the field, before any rank starts; a job inside them runs.
TEST_F(CheckpointE2ETest, PathsOutsideTheWorkersRootsAreRefused) {
  const std::string data = cluster_->dir() + "/data", ck = cluster_->dir() + "/ck";
  std::filesystem::create_directories(data);
  std::filesystem::create_directories(ck);
  std::filesystem::create_symlink("/etc", data + "/etc-link");
  ASSERT_TRUE(
      cluster_->StartWorker("w0", 2, false, {"--data-root=" + data, "--checkpoint-root=" + ck}));
  ASSERT_TRUE(cluster_->WaitWorkers(1));

  auto failed = [&](const v1::JobSpec& spec, const std::string& want) {
    std::string id = cluster_->Submit(spec);
    ASSERT_FALSE(id.empty());
    v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_FAILED, absl::Seconds(30));
    ASSERT_EQ(j.state(), v1::JOB_STATE_FAILED) << j.state_reason();
    EXPECT_EQ(j.attempts_size(), 1) << "a pre-flight failure is not restarted";
    EXPECT_THAT(j.state_reason(), HasSubstr(want));
    EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_PREFLIGHT);
    EXPECT_EQ(j.attempts(0).ranks(0).state(), v1::RANK_STATE_STOPPED) << "never started";
  };
  failed(SlowClassic(1, {"checkpoint.dir=" + ck + "/../escape"}),
         "checkpoint.dir: '" + ck + "/../escape'");
  failed(SlowClassic(1, {"checkpoint.dir=/etc/trainctl"}),
         "is outside every --checkpoint-root of this worker");
  ParsedJobSpec idx = ParseJobSpecYaml(
      absl::StrCat("name: idx\nworld_size: 1\nmodel: {name: mlp, input_dim: 4, classes: 2}\n",
                   "data: {train: {format: idx, images: ", data, "/etc-link/shadow, labels: ", data,
                   "/labels.idx}}\n"),
      "idx.yaml");
  ASSERT_TRUE(idx.ok());
  failed(idx.spec, "data.train.images: '" + data +
                       "/etc-link/shadow' (/etc/shadow) is outside every --data-root");

  std::string ok = cluster_->Submit(
      SlowClassic(1, {"checkpoint.dir=" + ck + "/{job_id}", "data.train.length=600"}));
  v1::Job j = cluster_->WaitState(ok, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  EXPECT_TRUE(std::filesystem::exists(ck + "/" + ok + "/" + ok + ".model.pt"));
}

// A full checkpoint directory waits for space (#47, item 5): the directory
// (a small tmpfs) fills after the first checkpoint, so the next checkpoint
// write fails as DISK_FULL and the restart's pre-flight finds no room
// ("waiting for space"); 10 s later there is room again and the job resumes
// and SUCCEEDS -- with max_restarts 0: waiting for space is not a restart.
TEST_F(CheckpointE2ETest, AFullDiskWaitsForSpaceAndTheJobSucceeds) {
  const std::string dir = cluster_->dir() + "/small-disk";
  SmallDisk small(dir, 16);
  if (!small.why_not.empty()) GTEST_SKIP() << small.why_not;
  ASSERT_TRUE(cluster_->StartWorker("w1", 2));
  ASSERT_TRUE(cluster_->WaitWorkers(1));
  const std::string id = cluster_->Submit(SlowClassic(
      6, {"checkpoint.dir=" + dir, "restart.max_restarts=0", "restart.disk_full_wait_s=300"}));
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitFor(
      id,
      [](const v1::Job& x) { return NewestEpochs(x) >= 1 || x.state() >= v1::JOB_STATE_SUCCEEDED; },
      absl::Seconds(180));
  ASSERT_GE(NewestEpochs(j), 1) << j.DebugString();
  // Fill it: dd stops at ENOSPC.
  const std::string filler = dir + "/filler";
  (void)std::system(("dd if=/dev/zero of=" + filler + " bs=64k 2>/dev/null").c_str());
  auto disk_full = [](const v1::Job& x) {
    for (const v1::Attempt& a : x.attempts()) {
      if (a.failure_kind() == v1::FAILURE_KIND_DISK_FULL) return true;
    }
    return false;
  };
  j = cluster_->WaitFor(
      id, [&](const v1::Job& x) { return disk_full(x) || x.state() >= v1::JOB_STATE_SUCCEEDED; },
      absl::Seconds(180));
  ASSERT_TRUE(disk_full(j)) << "a checkpoint write after the disk filled failed as DISK_FULL: "
                            << j.DebugString();
  ASSERT_EQ(j.state(), v1::JOB_STATE_RESTARTING) << j.state_reason();
  // The outage itself (what is tested): space comes back 10 s later.
  absl::SleepFor(absl::Seconds(10));
  std::filesystem::remove(filler);
  j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(240));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  EXPECT_EQ(j.restarts(), 0) << "waiting for space is not a restart";
  int waits = 0;
  for (const v1::Event& e : cluster_->Events(id)) waits += e.type() == "waiting_for_space" ? 1 : 0;
  EXPECT_GE(waits, 1);
  std::cout << "attempts: " << j.attempts_size() << ", waiting_for_space events: " << waits << "\n";
}

// The coordinator's store fills mid-job while the ranks go on checkpointing
// (keep=1): no checkpoint is deleted for a record the store does not have.
// Then the coordinator and the daemons are SIGKILLed (the ranks die with
// their daemon), space returns and everything starts again: the job resumes
// from the newest *stored* checkpoint, whose file is still there, and
// SUCCEEDS; its stored events are numbered densely, each once. (Before the
// store came first, the coordinator ordered the stored checkpoint's file
// deleted for records it had not stored; the restarts failed as RESUME and
// the job trained again from scratch.)
TEST_F(CheckpointE2ETest, AFullStoreThenACrashResumesFromTheNewestStoredCheckpoint) {
  const std::string disk = cluster_->dir() + "/store-disk";
  SmallDisk small(disk, 24);
  if (!small.why_not.empty()) GTEST_SKIP() << small.why_not;
  const std::vector<std::string> store_flags{"--db=" + disk + "/state.db"};
  cluster_->KillCoordinator(SIGKILL);
  ASSERT_TRUE(cluster_->StartCoordinator(store_flags)) << cluster_->coordinator()->ReadLog();
  const std::vector<std::string> names{"w0", "w1"};
  for (const std::string& n : names) ASSERT_TRUE(cluster_->StartWorker(n, 1));
  ASSERT_TRUE(cluster_->WaitWorkers(2));
  const std::string ckpt = cluster_->dir() + "/ckpt";
  constexpr int kEpochs = 10;
  const std::string id =
      cluster_->Submit(SlowClassic(kEpochs, {"checkpoint.dir=" + ckpt, "checkpoint.shared=true",
                                             "checkpoint.keep=1", "restart.max_restarts=3"}));
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitFor(
      id,
      [](const v1::Job& x) { return NewestEpochs(x) >= 1 || x.state() >= v1::JOB_STATE_SUCCEEDED; },
      absl::Seconds(180));
  const int64_t stored = NewestEpochs(j);
  ASSERT_GE(stored, 1) << j.DebugString();
  ASSERT_LE(stored, kEpochs - 5) << "the store must fill mid-job";
  auto file_of = [&](int64_t epochs) {
    char name[32];
    std::snprintf(name, sizeof(name), ".ckpt-epoch-%06lld.pt", static_cast<long long>(epochs));
    return ckpt + "/" + id + name;
  };
  ASSERT_TRUE(std::filesystem::exists(file_of(stored)));

  // Fill the store's disk (dd stops at ENOSPC) and wait for it to fail.
  const std::string filler = disk + "/filler";
  (void)std::system(("dd if=/dev/zero of=" + filler + " bs=64k 2>/dev/null").c_str());
  auto store_failing = [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ListWorkersResponse resp;
    return cluster_->workers_stub()->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp).ok() &&
           resp.store().failing();
  };
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!store_failing() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(store_failing()) << "the store never failed with its disk full";
  // The ranks go on: two more checkpoints are written that the store cannot
  // record. The newest file then is at least two epochs past the last record
  // the store can hold (records of `stored`+1 may have been stored just
  // before the disk filled).
  deadline = absl::Now() + absl::Seconds(180);
  while (!std::filesystem::exists(file_of(stored + 3)) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(std::filesystem::exists(file_of(stored + 3))) << "the ranks stopped checkpointing";
  // The newest stored record's file is still there: no deletion was ordered
  // for a record the store did not take.
  EXPECT_TRUE(std::filesystem::exists(file_of(stored)) ||
              std::filesystem::exists(file_of(stored + 1)))
      << "the only stored checkpoint was deleted";

  // Crash everything while the store is full, then give the space back.
  cluster_->KillCoordinator(SIGKILL);
  for (const std::string& n : names) cluster_->KillWorker(n, SIGKILL);
  std::filesystem::remove(filler);
  ASSERT_TRUE(cluster_->StartCoordinator(store_flags)) << cluster_->coordinator()->ReadLog();
  for (const std::string& n : names) ASSERT_TRUE(cluster_->StartWorker(n, 1));

  j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(300));
  const std::vector<v1::Event> events = cluster_->Events(id);
  std::string story;
  for (const v1::Event& e : events)
    absl::StrAppend(&story, "\n  #", e.seq(), " ", e.type(), " (attempt ", e.attempt(),
                    "): ", e.message());
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason() << story;
  ASSERT_GE(j.attempts_size(), 2) << story;
  for (const v1::Attempt& a : j.attempts()) {
    EXPECT_NE(a.failure_kind(), v1::FAILURE_KIND_RESUME)
        << "attempt " << a.number() << ": " << a.reason() << story;
  }
  // Every attempt after the crash resumed from a stored checkpoint at or
  // after the one stored before the disk filled, not from scratch.
  const v1::Attempt& last = j.attempts(j.attempts_size() - 1);
  ASSERT_TRUE(last.has_resume()) << story;
  EXPECT_GE(last.resume().epochs_done(), stored) << story;
  // Stored events: numbered 1..N, each once.
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].seq(), static_cast<int64_t>(i + 1)) << story;
  }
}

}  // namespace
}  // namespace trainctl
