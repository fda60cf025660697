// Elastic jobs (real coordinator, worker daemons and trainctl-rank
// processes on loopback, Gloo on CPU): 3 workers × 1 slot, world_size 3,
// elastic.min_ranks 2. One daemon is killed for good inside an epoch: within
// replace_timeout_s plus a restart the job runs at 2 ranks from the
// checkpoint taken inside that epoch; a worker started later grows it back
// to 3 at the next checkpoint; the job SUCCEEDS. Every rank logs the sample
// indices of each optimizer step (TRAINCTL_TEST_SAMPLE_LOG), and the test
// checks that the steps whose updates the final model holds saw every
// sample of every epoch, none twice apart from PyTorch's end-of-epoch padding.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using trainctl::testing::Cluster;

constexpr int kSamples = 24000;

class ElasticE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string build = trainctl::testing::BuildDirOfThisTest();
    cluster_ = std::make_unique<Cluster>(build, build + "/worker/trainer/trainctl-rank");
    samples_dir_ = cluster_->dir() + "/samples";
    std::filesystem::create_directories(samples_dir_);
    // Inherited by the daemons, and from them by their ranks.
    ::setenv("TRAINCTL_TEST_SAMPLE_LOG", samples_dir_.c_str(), 1);
    ::setenv("TRAINCTL_TEST_STEP_SLEEP_MS", "10", 1);  // ~4 s per epoch at 3 ranks
    ASSERT_TRUE(cluster_->StartCoordinator());
  }
  void TearDown() override {
    ::unsetenv("TRAINCTL_TEST_SAMPLE_LOG");
    ::unsetenv("TRAINCTL_TEST_STEP_SLEEP_MS");
  }

  // (epoch, global step) -> the indices every rank of `attempt` trained on
  // in that step, from the ranks' sample logs.
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> Steps(const std::string& id,
                                                                    int attempt, int ranks) {
    std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> out;
    for (int r = 0; r < ranks; ++r) {
      std::ifstream in(absl::StrCat(samples_dir_, "/", id, ".a", attempt, ".r", r, ".samples"));
      std::string line;
      while (std::getline(in, line)) {
        std::vector<std::string> words = absl::StrSplit(line, ' ');
        if (words.size() != 3) continue;
        int64_t epoch = 0, step = 0;
        if (!absl::SimpleAtoi(words[0], &epoch) || !absl::SimpleAtoi(words[1], &step)) continue;
        std::vector<int64_t>& v = out[{epoch, step}];
        for (absl::string_view s : absl::StrSplit(words[2], ',')) {
          int64_t i = 0;
          if (absl::SimpleAtoi(s, &i)) v.push_back(i);
        }
      }
    }
    return out;
  }

  std::unique_ptr<Cluster> cluster_;
  std::string samples_dir_;
};

TEST_F(ElasticE2ETest, ShrinksWhenAWorkerIsLostAndGrowsBackWithEverySampleSeenOnce) {
  for (const char* w : {"w0", "w1", "w2"}) ASSERT_TRUE(cluster_->StartWorker(w));
  ASSERT_TRUE(cluster_->WaitWorkers(3));
  std::string src = std::getenv("TRAINCTL_SOURCE_DIR") ? std::getenv("TRAINCTL_SOURCE_DIR") : ".";
  ParsedJobSpec p = ParseJobSpecFile(
      src + "/examples/mlp-synthetic.yaml",
      {"world_size=3", "training.epochs=3", absl::StrCat("data.train.length=", kSamples),
       "data.batch_size=20", "model.hidden=[256, 256]", "checkpoint.every_steps=40",
       "checkpoint.keep=3", "restart.max_restarts=3", "elastic.min_ranks=2",
       "elastic.replace_timeout_s=2", "elastic.grow=at_checkpoint"});
  ASSERT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
  std::string id = cluster_->Submit(p.spec);
  ASSERT_FALSE(id.empty());

  // A checkpoint inside epoch 1 (the second), then lose rank 2's host for good.
  v1::Job j = cluster_->WaitFor(
      id,
      [](const v1::Job& x) {
        for (const auto& r : x.checkpoints()) {
          if (r.epochs_done() == 1 && r.epoch_consumed() > 0) return true;
        }
        return x.state() >= v1::JOB_STATE_SUCCEEDED;
      },
      absl::Seconds(150));
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.state_reason();
  ASSERT_EQ(j.attempts_size(), 1);
  const std::string lost_id = j.attempts(0).ranks(2).worker_id();
  std::string lost;
  for (const char* w : {"w0", "w1", "w2"}) {
    if (!Cluster::ProcessesMatching(absl::StrCat("/worker-", w, "/jobs/", id, "/attempt-1/rank-2"))
             .empty())
      lost = w;
  }
  ASSERT_FALSE(lost.empty());
  cluster_->KillWorker(lost, SIGKILL);

  // Attempt 2 runs at 2 ranks, from the checkpoint inside epoch 1.
  j = cluster_->WaitFor(
      id,
      [](const v1::Job& x) {
        return (x.attempts_size() >= 2 && x.state() == v1::JOB_STATE_RUNNING) ||
               x.state() >= v1::JOB_STATE_SUCCEEDED;
      },
      absl::Seconds(60));
  ASSERT_GE(j.attempts_size(), 2) << j.state_reason();
  const v1::Attempt& a2 = j.attempts(1);
  EXPECT_EQ(a2.ranks_size(), 2);
  ASSERT_TRUE(a2.has_resume());
  EXPECT_EQ(a2.resume().epochs_done(), 1);
  EXPECT_GT(a2.resume().epoch_consumed(), 0);
  for (const auto& r : a2.ranks()) EXPECT_NE(r.worker_id(), lost_id);

  // A new worker: the job grows back to 3 at its next checkpoint.
  ASSERT_TRUE(cluster_->StartWorker("w3"));
  j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(240));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  ASSERT_EQ(j.attempts_size(), 3) << "expected: 3 ranks, shrunk to 2, grown back to 3";
  EXPECT_EQ(j.attempts(1).grow_to(), 3);
  EXPECT_EQ(j.attempts(2).ranks_size(), 3);
  ASSERT_TRUE(j.attempts(2).has_resume());
  EXPECT_EQ(j.restarts(), 1) << "growing is not a restart";

  std::vector<std::string> resized;
  for (const v1::Event& e : cluster_->Events(id)) {
    if (e.type() != "checkpoint") {  // the timeline, for when this fails
      std::cout << "event " << e.type() << "@" << e.attempt() << ": " << e.message() << "\n";
    }
    if (e.type() == "resized") resized.push_back(e.message());
  }
  ASSERT_EQ(resized.size(), 2u);
  EXPECT_THAT(
      resized[0],
      HasSubstr("world size 3 -> 2 (no replacement within elastic.replace_timeout_s = 2 s"));
  EXPECT_THAT(resized[1], HasSubstr("world size 2 -> 3 (slots freed up"));

  // The steps the final model holds: attempt k's steps up to the step that
  // attempt k+1 resumed from; all of the last attempt's.
  std::map<int64_t, std::vector<int64_t>> by_epoch;
  int resumes_inside[3] = {0, 0, 0};
  for (int k = 0; k < j.attempts_size(); ++k) {
    const int64_t until =
        k + 1 < j.attempts_size() ? j.attempts(k + 1).resume().global_step() : INT64_MAX;
    if (k + 1 < j.attempts_size() && j.attempts(k + 1).resume().epoch_consumed() > 0) {
      ++resumes_inside[j.attempts(k + 1).resume().epochs_done()];
    }
    for (auto& [key, idx] : Steps(id, k + 1, j.attempts(k).ranks_size())) {
      if (key.second > until) continue;
      by_epoch[key.first].insert(by_epoch[key.first].end(), idx.begin(), idx.end());
    }
  }
  ASSERT_EQ(by_epoch.size(), 3u);
  for (auto& [epoch, idx] : by_epoch) {
    std::vector<int> seen(kSamples, 0);
    for (int64_t i : idx) {
      ASSERT_GE(i, 0);
      ASSERT_LT(i, kSamples);
      ++seen[static_cast<size_t>(i)];
    }
    int missing = 0, repeated = 0;
    for (int c : seen) {
      missing += c == 0 ? 1 : 0;
      repeated += c > 1 ? c - 1 : 0;
    }
    EXPECT_EQ(missing, 0) << "epoch " << epoch;
    // Padding: at most world_size - 1 repeats per (re)start inside the epoch.
    EXPECT_LE(repeated, 2 * (1 + resumes_inside[epoch])) << "epoch " << epoch;
  }
}

}  // namespace
}  // namespace trainctl
