#include "coordinator/jobs/fair_share_usage.h"

#include <gtest/gtest.h>

#include <cmath>

namespace trainctl::coordinator {
namespace {

constexpr absl::Duration kHalfLife = absl::Seconds(100);

TEST(FairShareUsageTest, HeldSlotsAccumulateTheDecayedIntegralAndHalveEachHalfLife) {
  FairShareUsage u(kHalfLife);
  // 2 GPU slots held for one half-life: h/ln2 * (1 - 1/2) * 2 = h/ln2.
  u.Advance(kHalfLife, {{"team-a", {{"alice", {2, 0}}}}});
  const double one = 100 / std::log(2.0);
  EXPECT_NEAR(u.queues().at("team-a")[0], one, 1e-9);
  EXPECT_NEAR(u.owners().at("team-a").at("alice")[0], one, 1e-9);
  EXPECT_EQ(u.queues().at("team-a")[1], 0);
  // Nothing held for a half-life: halved.
  u.Advance(kHalfLife, {});
  EXPECT_NEAR(u.queues().at("team-a")[0], one / 2, 1e-9);
  // In small steps the same as in one: the integral is exact.
  FairShareUsage steps(kHalfLife);
  for (int i = 0; i < 100; ++i) steps.Advance(absl::Seconds(1), {{"team-a", {{"alice", {2, 0}}}}});
  EXPECT_NEAR(steps.queues().at("team-a")[0], one, 1e-6);
}

TEST(FairShareUsageTest, AQueueIsTheSumOfItsOwnersAndWhatDecaysAwayGoes) {
  FairShareUsage u(kHalfLife);
  u.Advance(absl::Seconds(10), {{"q", {{"alice", {1, 0}}, {"bob", {0, 3}}}}});
  const auto& q = u.queues().at("q");
  const auto& owners = u.owners().at("q");
  EXPECT_NEAR(q[0], owners.at("alice")[0] + owners.at("bob")[0], 1e-12);
  EXPECT_NEAR(q[1], owners.at("alice")[1] + owners.at("bob")[1], 1e-12);
  // Forty half-lives later under a thousandth of a slot-second: gone.
  u.Advance(40 * kHalfLife, {});
  EXPECT_TRUE(u.empty());
  EXPECT_TRUE(u.queues().empty());
}

TEST(FairShareUsageTest, ASnapshotRestoresDecayedByTheIdleTimeAndBadValuesCountAsNone) {
  FairShareUsage u(kHalfLife);
  u.Advance(absl::Seconds(50), {{"b", {{"bob", {0, 4}}}}, {"a", {{"alice", {2, 0}}}}});
  const absl::Time as_of = absl::FromUnixSeconds(1'800'000'000);
  v1::FairShareSnapshot snap = u.Snapshot(as_of);
  ASSERT_EQ(snap.queues_size(), 2);
  EXPECT_EQ(snap.queues(0).queue(), "a") << "sorted by queue name";
  EXPECT_EQ(snap.as_of().seconds(), 1'800'000'000);

  FairShareUsage back(kHalfLife);
  back.Restore(snap, kHalfLife);
  EXPECT_NEAR(back.queues().at("a")[0], u.queues().at("a")[0] / 2, 1e-9);
  EXPECT_NEAR(back.owners().at("b").at("bob")[1], u.owners().at("b").at("bob")[1] / 2, 1e-9);

  (*snap.mutable_queues(0)->mutable_owners())["alice"].set_gpu_slot_seconds(-5);
  (*snap.mutable_queues(1)->mutable_owners())["bob"].set_cpu_slot_seconds(std::nan(""));
  back.Restore(snap, absl::ZeroDuration());
  EXPECT_EQ(back.queues().at("a")[0], 0);
  EXPECT_EQ(back.queues().at("b")[1], 0);
}

}  // namespace
}  // namespace trainctl::coordinator
