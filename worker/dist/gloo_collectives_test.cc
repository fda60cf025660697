// Gloo engine and rendezvous store, across real rank processes on loopback.
#include "worker/dist/gloo_collectives.h"

#include <gtest/gtest.h>

#include <map>

#include <filesystem>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "worker/dist/rank_launcher.h"
#include "worker/dist/rendezvous_store.h"


namespace trainctl::dist {
namespace {

// Keeps the ranks' scratch directory only when the test failed.
void Cleanup(const testing::RankRun& run) {
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(run.dir);
}

using testing::RankRun;
using testing::RunRanks;

std::string Logs(const RankRun& run) {
  std::string s;
  for (size_t r = 0; r < run.logs.size(); ++r) {
    s += "---- rank " + std::to_string(r) + " (exit " + std::to_string(run.exit_codes[r]) +
         ") ----\n" + run.logs[r];
  }
  return s;
}

TEST(GlooCollectivesTest, InvalidOptions) {
  auto store = RendezvousStore::Host("127.0.0.1", 0, absl::Seconds(5), NewRendezvousSecret());
  ASSERT_TRUE(store.ok());
  GlooOptions o;
  o.world_size = 2;
  o.rank = 2;
  EXPECT_EQ(CreateGlooCollectives(o, *store).status().code(), absl::StatusCode::kInvalidArgument);
  o.rank = 0;
  EXPECT_EQ(CreateGlooCollectives(o, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GlooCollectivesTest, PeerThatNeverJoinsFailsRendezvousWithinTimeout) {
  auto store = RendezvousStore::Host("127.0.0.1", 0, absl::Seconds(1), NewRendezvousSecret());
  ASSERT_TRUE(store.ok());
  GlooOptions o;
  o.world_size = 2;
  o.rank = 0;
  o.timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  auto comm = CreateGlooCollectives(o, *store);
  EXPECT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(GlooCollectivesTest, SingleRank) {
  auto run = RunRanks("collectives", 1, {}, absl::Seconds(30));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_codes[0], 0) << Logs(*run);
  Cleanup(*run);
}

// Every multi-rank scenario over both transports: shared memory (all ranks on
// this host; 64 KiB slots so that larger buffers go in several chunks) and
// Gloo's TCP meshes alone (ranks on different hosts).
class GlooTransportTest : public ::testing::TestWithParam<bool> {
 protected:
  std::map<std::string, std::string> Args(std::map<std::string, std::string> a) const {
    a["shm"] = GetParam() ? "1" : "0";
    a["shm_slot_bytes"] = "65536";
    return a;
  }
};

TEST_P(GlooTransportTest, AllReduceBroadcastBarrierAcrossThreeRanks) {
  auto run = RunRanks("collectives", 3, Args({{"timeout_ms", "20000"}}), absl::Seconds(40));
  ASSERT_TRUE(run.ok()) << run.status();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(run->exit_codes[r], 0) << Logs(*run);
  Cleanup(*run);
}

TEST_P(GlooTransportTest, DeadPeerYieldsErrorNotHang) {
  auto run = RunRanks("peer_exit", 2, Args({{"timeout_ms", "5000"}}), absl::Seconds(30));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_codes[1], 3) << Logs(*run);
  EXPECT_EQ(run->exit_codes[0], 0) << Logs(*run);
  Cleanup(*run);
}

TEST_P(GlooTransportTest, StalledPeerTimesOut) {
  auto run = RunRanks("peer_stall", 2, Args({{"timeout_ms", "2000"}}), absl::Seconds(30));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_codes[0], 0) << Logs(*run);
  auto result = testing::ReadFile(run->dir + "/result");
  ASSERT_TRUE(result.ok());
  std::vector<std::string> parts = absl::StrSplit(*result, ' ');
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], "DEADLINE_EXCEEDED");
  double ms = 0;
  ASSERT_TRUE(absl::SimpleAtod(parts[1], &ms));
  EXPECT_GE(ms, 1500);  // it waited for the timeout, not less
  EXPECT_LT(ms, 5000);
  Cleanup(*run);
}

TEST_P(GlooTransportTest, AbortEndsPendingWork) {
  auto run = RunRanks("abort", 2, Args({{"timeout_ms", "20000"}}), absl::Seconds(40));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_codes[0], 0) << Logs(*run);
  std::cout << run->logs[0];
  Cleanup(*run);
}

INSTANTIATE_TEST_SUITE_P(Transports, GlooTransportTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "SharedMemory" : "Tcp"; });

}  // namespace
}  // namespace trainctl::dist
