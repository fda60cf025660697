// Replicas stay bit-identical at every world size (issue #47): a real
// coordinator and two worker daemons of two slots each (two "hosts": ranks on
// different daemons do not share memory, so the job's all-reduces go over
// Gloo's TCP meshes), a CPU job of 4 ranks and one of 3 trained for 300
// optimizer steps, with a model whose gradients fill one bucket above the
// small-message limit (Gloo's ring) and one below it (the small-message
// mesh). Every rank logs a checksum of its parameters' bytes at each epoch's
// end; every rank's must equal rank 0's. The same job of 4 ranks on one
// daemon of 4 slots all-reduces through shared memory, with the DDP buckets
// in shared blocks that every rank sums from and writes into.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"

namespace trainctl {
namespace {

using trainctl::testing::Cluster;

constexpr int kEpochs = 2;
constexpr int kStepsPerEpoch = 150;
constexpr int kBatch = 8;

// An MLP 16 -> 600 -> 600 -> 4: in reverse registration order the first
// bucket (closed past 1 MB) holds the head and the 600x600 layer (1.45 MB,
// Gloo's ring), the next (10 KB cap) the first layer (40 KB: the
// small-message path, up to 64 KiB).
v1::JobSpec ReplicaJob(int world_size) {
  std::string src = std::getenv("TRAINCTL_SOURCE_DIR") ? std::getenv("TRAINCTL_SOURCE_DIR") : ".";
  ParsedJobSpec p = ParseJobSpecFile(
      src + "/examples/mlp-synthetic.yaml",
      {absl::StrCat("world_size=", world_size), "device=cpu", "backend=gloo", "model.input_dim=16",
       "model.hidden=[600, 600]", "model.classes=4", "data.train.size=16", "data.train.classes=4",
       absl::StrCat("data.train.length=", world_size * kBatch * kStepsPerEpoch),
       absl::StrCat("data.batch_size=", kBatch), absl::StrCat("training.epochs=", kEpochs),
       "ddp.bucket_cap_mb=0.01", "restart.max_restarts=0"});
  EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].message);
  return p.spec;
}

// (global step, "crc32:...") of each "parameters crc32:... at global step N"
// line of a rank's log, in order.
std::vector<std::pair<int64_t, std::string>> ParameterChecksums(const std::string& log) {
  static const std::regex re("parameters (crc32:[0-9a-f]{8}) at global step ([0-9]+)");
  std::vector<std::pair<int64_t, std::string>> out;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, re)) out.emplace_back(std::stoll(m[2].str()), m[1].str());
  }
  return out;
}

void ExpectEveryRankHasRankZerosChecksums(Cluster& cluster, const std::string& id, int world,
                                          const std::string& log0) {
  const auto want = ParameterChecksums(log0);
  ASSERT_EQ(want.size(), static_cast<size_t>(kEpochs)) << log0;
  EXPECT_EQ(want[0].first, kStepsPerEpoch);
  EXPECT_EQ(want[1].first, kEpochs * kStepsPerEpoch);
  EXPECT_NE(want[0].second, want[1].second) << "the second epoch changed nothing";
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(ParameterChecksums(cluster.RankLog(id, 1, r)), want) << "rank " << r << " vs rank 0";
  }
}

class ReplicasE2ETest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    std::string build = trainctl::testing::BuildDirOfThisTest();
    cluster_ = std::make_unique<Cluster>(build, build + "/worker/trainer/trainctl-rank");
    ASSERT_TRUE(cluster_->StartCoordinator());
    ASSERT_TRUE(cluster_->StartWorker("w0", /*slots=*/2));
    ASSERT_TRUE(cluster_->StartWorker("w1", /*slots=*/2));
    ASSERT_TRUE(cluster_->WaitWorkers(2));
  }
  std::unique_ptr<Cluster> cluster_;
};

TEST_P(ReplicasE2ETest, EveryRankEndsEachEpochWithRankZerosParameterBytes) {
  const int world = GetParam();
  const std::string id = cluster_->Submit(ReplicaJob(world));
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(240));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason() << "\n"
                                                << cluster_->RankLog(id, 1, 0);
  ASSERT_EQ(j.attempts_size(), 1);
  // Two daemons: the job spans both, so no rank shares memory with all.
  std::map<std::string, int> ranks_per_worker;
  for (const auto& r : j.attempts(0).ranks()) ++ranks_per_worker[r.worker_id()];
  EXPECT_EQ(ranks_per_worker.size(), 2u);
  const std::string log0 = cluster_->RankLog(id, 1, 0);
  EXPECT_THAT(log0, ::testing::HasSubstr(absl::StrCat("collectives: gloo (", world, " ranks)")));

  ExpectEveryRankHasRankZerosChecksums(*cluster_, id, world, log0);
}

TEST(OneHostReplicasE2ETest, FourRanksOverSharedBlocksEndEachEpochWithRankZerosBytes) {
  std::string build = trainctl::testing::BuildDirOfThisTest();
  Cluster cluster(build, build + "/worker/trainer/trainctl-rank");
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.StartWorker("w0", /*slots=*/4));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  const std::string id = cluster.Submit(ReplicaJob(4));
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster.WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(240));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason() << "\n"
                                                << cluster.RankLog(id, 1, 0);
  const std::string log0 = cluster.RankLog(id, 1, 0);
  EXPECT_THAT(log0, ::testing::HasSubstr("collectives: gloo+shm (4 ranks)"));
  EXPECT_THAT(log0, ::testing::HasSubstr("ddp buckets: 2 of 2 in shared memory"));
  ExpectEveryRankHasRankZerosChecksums(cluster, id, 4, log0);
}

INSTANTIATE_TEST_SUITE_P(TwoWorkers, ReplicasE2ETest, ::testing::Values(3, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return absl::StrCat(i.param, "Ranks");
                         });

}  // namespace
}  // namespace trainctl
