#include "coordinator/rank_watch.h"
#include "coordinator/rank_progress_testing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace trainctl::coordinator {
namespace {

using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1000000);

v1::Attempt Attempt(int world) {
  v1::Attempt a;
  a.set_number(1);
  for (int r = 0; r < world; ++r) {
    v1::RankAssignment* x = a.add_ranks();
    x->set_rank(r);
    x->set_worker_id("w" + std::to_string(r));
    x->set_host("h" + std::to_string(r));
    x->set_state(v1::RANK_STATE_RUNNING);
  }
  return a;
}

v1::RankProgress Beat(int rank, int64_t step, int64_t seq, int64_t waiting_seq, double compute_ms = 10,
                      int64_t waiting_ms = 0) {
  v1::RankProgress p = TrainHeartbeat(rank, step, seq, waiting_seq, compute_ms, {3, 200, 100});
  p.set_waiting_ms(waiting_ms);
  return p;
}

TEST(RankWatchTest, BlamesTheSilentRankNotTheOnesWaitingForIt) {
  RankWatch w;
  w.Reset(1);
  const v1::Attempt a = Attempt(3);
  // Steady training: everyone advances each second.
  for (int s = 0; s < 5; ++s) {
    for (int r = 0; r < 3; ++r) w.OnHeartbeat(Beat(r, 600 + s, 1000 + 4 * s, 0), kT0 + absl::Seconds(s), 0.3);
  }
  // Rank 1 stops (its last beat: step 604, seq 1016); ranks 0 and 2 issue
  // #1017..#1020 and wait in #1020 (bucket 3 of step 605), reporting on.
  for (int s = 5; s < 20; ++s) {
    for (int r : {0, 2}) {
      w.OnHeartbeat(Beat(r, 604, 1020, 1020, 10, (s - 5) * 1000), kT0 + absl::Seconds(s), 0.3);
    }
    const absl::Time now = kT0 + absl::Seconds(s) + absl::Milliseconds(500);
    std::optional<HangVerdict> v = w.CheckHang(a, now);
    // bound = max(5 × 200 ms, 5 s) = 5 s after the last advance (t=5 s).
    if (s < 10) {
      EXPECT_FALSE(v.has_value()) << s << ": " << v->message;
      continue;
    }
    ASSERT_TRUE(v.has_value()) << s;
    EXPECT_EQ(v->bound, absl::Seconds(5));
    EXPECT_THAT(v->blamed, ::testing::ElementsAre(1));
    EXPECT_THAT(v->message, HasSubstr("rank 1 (worker w1, pid 101) stopped before all-reduce #1020 (step 605, bucket 3); "
                                      "ranks 0, 2 waiting in it for "));
    EXPECT_THAT(v->message, HasSubstr("no heartbeat from rank 1 for "));
    break;
  }
}

TEST(RankWatchTest, SlowButMovingStepsAreNoHang) {
  RankWatch w;
  w.Reset(1);
  const v1::Attempt a = Attempt(2);
  // Steps of 4 s (p99 4 s → bound 20 s): 12 s inside one all-reduce is fine.
  for (int s = 0; s < 12; ++s) {
    for (int r = 0; r < 2; ++r) {
      v1::RankProgress p = Beat(r, 10, 50, 50, 10, s * 1000);
      p.set_p99_step_ms(4000);
      w.OnHeartbeat(p, kT0 + absl::Seconds(s), 0.3);
    }
    EXPECT_FALSE(w.CheckHang(a, kT0 + absl::Seconds(s)).has_value()) << s;
  }
  // Every rank waits and none is silent: 3 × the bound.
  for (int r = 0; r < 2; ++r) {
    v1::RankProgress p = Beat(r, 10, 50, 50, 10, 59000);
    p.set_p99_step_ms(4000);
    w.OnHeartbeat(p, kT0 + absl::Seconds(59), 0.3);
  }
  EXPECT_FALSE(w.CheckHang(a, kT0 + absl::Seconds(59)).has_value());
  for (int r = 0; r < 2; ++r) {
    v1::RankProgress p = Beat(r, 10, 50, 50, 10, 61000);
    p.set_p99_step_ms(4000);
    w.OnHeartbeat(p, kT0 + absl::Seconds(61), 0.3);
  }
  std::optional<HangVerdict> v = w.CheckHang(a, kT0 + absl::Seconds(61));
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->blamed.empty());
  EXPECT_THAT(v->message, HasSubstr("every rank has waited in all-reduce #50"));
}

TEST(RankWatchTest, ARankAliveOutsideTheCollectiveIsBlamedAfterThreeBounds) {
  RankWatch w;
  w.Reset(1);
  const v1::Attempt a = Attempt(2);
  // Rank 1 keeps reporting but is stuck before #21 (a slow read, a
  // deadlock in user code): not a hang at 1 × the bound, one at 3 ×.
  for (int s = 0; s <= 16; ++s) {
    w.OnHeartbeat(Beat(0, 10, 21, 21, 10, s * 1000), kT0 + absl::Seconds(s), 0.3);
    w.OnHeartbeat(Beat(1, 10, 20, 0), kT0 + absl::Seconds(s), 0.3);
    std::optional<HangVerdict> v = w.CheckHang(a, kT0 + absl::Seconds(s));
    if (s <= 15) {
      EXPECT_FALSE(v.has_value()) << s;
      continue;
    }
    ASSERT_TRUE(v.has_value());
    EXPECT_THAT(v->blamed, ::testing::ElementsAre(1));
    EXPECT_THAT(v->message, HasSubstr("rank 1 (worker w1, pid 101) stopped before all-reduce #21 (step 11, bucket 3); "
                                      "rank 0 waiting in it for 16.0 s"));
    EXPECT_THAT(v->message, HasSubstr("it is alive but outside the collective"));
  }
}

TEST(RankWatchTest, OtherPhasesAndRanksWithoutHeartbeatsAreLeftToTheFixedTimeout) {
  RankWatch w;
  w.Reset(1);
  const v1::Attempt a = Attempt(2);
  v1::RankProgress ck = Beat(0, 10, 50, 0);
  ck.set_phase(v1::RANK_PHASE_CHECKPOINT);
  w.OnHeartbeat(ck, kT0, 0.3);
  w.OnHeartbeat(Beat(1, 10, 51, 51), kT0, 0.3);
  EXPECT_FALSE(w.CheckHang(a, kT0 + absl::Minutes(10)).has_value());
  RankWatch only_one;
  only_one.Reset(1);
  only_one.OnHeartbeat(Beat(1, 10, 51, 51), kT0, 0.3);
  EXPECT_FALSE(only_one.CheckHang(a, kT0 + absl::Minutes(10)).has_value());
}

TEST(RankWatchTest, ARankSlowerThanTheMedianIsReportedOnce) {
  RankWatch w;
  w.Reset(1);
  v1::Attempt a = Attempt(3);
  for (int s = 0; s < 4; ++s) {
    for (int r = 0; r < 3; ++r) w.OnHeartbeat(Beat(r, s, s, 0, r == 2 ? 14 : 10), kT0 + absl::Seconds(s), 0.3);
  }
  EXPECT_TRUE(w.TakeStragglers(a).empty());  // 40% slower, but 4 beats only
  w.OnHeartbeat(Beat(2, 5, 5, 0, 14), kT0 + absl::Seconds(5), 0.3);
  std::vector<Straggler> st = w.TakeStragglers(a);
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].rank, 2);
  EXPECT_THAT(st[0].message, HasSubstr("rank 2 (worker w2, host h2) is a straggler: 14.0 ms of compute per step, "
                                       "40% slower than the median of the other ranks (10.0 ms)"));
  w.OnHeartbeat(Beat(2, 6, 6, 0, 14), kT0 + absl::Seconds(6), 0.3);
  EXPECT_TRUE(w.TakeStragglers(a).empty());  // once per attempt
  // 20% slower is under the threshold: never a straggler.
  RankWatch mild;
  mild.Reset(1);
  for (int s = 0; s < 20; ++s) {
    for (int r = 0; r < 3; ++r) mild.OnHeartbeat(Beat(r, s, s, 0, r == 0 ? 12 : 10), kT0 + absl::Seconds(s), 0.3);
  }
  EXPECT_TRUE(mild.TakeStragglers(a).empty());
}

}  // namespace
}  // namespace trainctl::coordinator
