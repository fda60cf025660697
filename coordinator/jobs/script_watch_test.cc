#include "coordinator/jobs/script_watch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace trainctl::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1000000);
const absl::Duration kUnlearned = absl::Seconds(300);

v1::Attempt Attempt(int world) {
  v1::Attempt a;
  a.set_number(1);
  for (int r = 0; r < world; ++r) {
    v1::RankAssignment* x = a.add_ranks();
    x->set_rank(r);
    x->set_worker_id("w" + std::to_string(r));
    x->set_state(v1::RANK_STATE_RUNNING);
  }
  return a;
}

// A trainctl.report(step=...) of `rank`.
v1::RankProgress Report(int rank, int64_t step) {
  v1::RankProgress p;
  p.set_rank(rank);
  p.set_step(step);
  return p;
}

// The start-up hook's heartbeat of `rank`.
v1::RankProgress Hook(int rank, int64_t step, int64_t moves, int64_t torch_wait_ms) {
  v1::RankProgress p = Report(rank, step);
  p.set_has_heartbeat(true);
  p.set_phase(v1::RANK_PHASE_TRAIN);
  p.set_stack_moves(moves);
  p.set_torch_wait_ms(torch_wait_ms);
  p.set_pid(100 + rank);
  return p;
}

// Both ranks report a step every 200 ms for `steps` steps, the hook beating
// each second; returns the time of the last report.
absl::Time Train(ScriptWatch& w, int steps) {
  absl::Time t = kT0;
  for (int s = 1; s <= steps; ++s) {
    t = kT0 + s * absl::Milliseconds(200);
    for (int r = 0; r < 2; ++r) {
      w.OnProgress(Report(r, s), t);
      if (s % 5 == 0) w.OnProgress(Hook(r, s, s, 0), t);
    }
  }
  return t;
}

TEST(ScriptWatchTest, NamesTheRankOutsideTorchWhileItsPeerWaitsInACollective) {
  ScriptWatch w;
  w.Reset(1);
  const v1::Attempt a = Attempt(2);
  const absl::Time last = Train(w, 30);
  // The cadence learned: 200 ms between reports, so the floor rules.
  EXPECT_EQ(w.Bound(kUnlearned), absl::Seconds(15));
  // Rank 1 sleeps after step 30 (its stack stops changing); rank 0 reported
  // 30 too and waits in the next step's all-reduce (in torch/autograd).
  for (int s = 1; s <= 30; ++s) {
    const absl::Time t = last + absl::Seconds(s);
    w.OnProgress(Hook(0, 30, 31, s * 1000), t);
    w.OnProgress(Hook(1, 30, 31, 0), t);
    std::optional<HangVerdict> v = w.Check(a, t + absl::Milliseconds(200), kUnlearned);
    // The last change of a stack: rank 0 entering its wait at last + 1 s.
    if (s <= 15) {
      EXPECT_FALSE(v.has_value()) << s << ": " << v->message;
      continue;
    }
    ASSERT_TRUE(v.has_value()) << s;
    EXPECT_THAT(v->blamed, ElementsAre(1));
    EXPECT_EQ(v->bound, absl::Seconds(15));
    EXPECT_THAT(
        v->message,
        HasSubstr("rank 1 (worker w1, pid 101) at step 30 stopped outside torch's collectives "
                  "while rank 0 has waited in one for "));
    EXPECT_THAT(
        v->message,
        HasSubstr(
            "(bound 15.0 s: 5 × the longest interval between reports, 0.2 s, at least 15.0 s)"));
    EXPECT_THAT(v->message, HasSubstr("every rank's Python stack follows in its log"));
    return;
  }
  FAIL() << "no hang within 30 s";
}

TEST(ScriptWatchTest, NamesTheRankBehindWhenNoneSaysItWaits) {
  // No hook (python -I, or not Python): steps alone. Rank 0 reported step 31
  // and rank 1 stopped at 30.
  ScriptWatch w;
  w.Reset(1);
  const v1::Attempt a = Attempt(2);
  absl::Time t = kT0;
  for (int s = 1; s <= 30; ++s) {
    t = kT0 + s * absl::Milliseconds(200);
    w.OnProgress(Report(0, s), t);
    w.OnProgress(Report(1, s), t);
  }
  w.OnProgress(Report(0, 31), t + absl::Milliseconds(200));
  EXPECT_FALSE(w.Check(a, t + absl::Seconds(15), kUnlearned).has_value());
  std::optional<HangVerdict> v = w.Check(a, t + absl::Seconds(16), kUnlearned);
  ASSERT_TRUE(v.has_value());
  EXPECT_THAT(v->blamed, ElementsAre(1));
  EXPECT_THAT(v->message,
              HasSubstr("rank 1 (worker w1) at step 30 stopped while rank 0 reached step 31"));
  EXPECT_THAT(v->message, ::testing::Not(HasSubstr("stack follows in its log")))
      << "no hook: no stacks";
}

TEST(ScriptWatchTest, AMovingStackIsProgressWithoutReports) {
  // A long evaluation between reports: rank 0's stack keeps changing while
  // rank 1 waits in a barrier for a minute. No hang.
  ScriptWatch w;
  w.Reset(1);
  const v1::Attempt a = Attempt(2);
  const absl::Time last = Train(w, 30);
  for (int s = 1; s <= 60; ++s) {
    const absl::Time t = last + absl::Seconds(s);
    w.OnProgress(Hook(0, 30, 30 + s, 0), t);
    w.OnProgress(Hook(1, 30, 31, s * 1000), t);
    std::optional<HangVerdict> v = w.Check(a, t, kUnlearned);
    EXPECT_FALSE(v.has_value()) << s << ": " << v->message;
  }
}

TEST(ScriptWatchTest, TheBoundFollowsTheSlowestLearnedIntervalPastTheFirstTwoReports) {
  ScriptWatch w;
  w.Reset(1);
  // Nothing learned: the caller's bound (the coordinator's --progress-timeout-s).
  EXPECT_EQ(w.Bound(kUnlearned), kUnlearned);
  // Start-up and the first step take long; neither is learned.
  w.OnProgress(Report(0, 1), kT0 + absl::Seconds(100));
  w.OnProgress(Report(0, 2), kT0 + absl::Seconds(160));
  EXPECT_EQ(w.Bound(kUnlearned), kUnlearned);
  w.OnProgress(Report(0, 3), kT0 + absl::Seconds(162));
  EXPECT_EQ(w.Bound(kUnlearned), absl::Seconds(15));  // 5 × 2 s is under the floor
  w.OnProgress(Report(0, 4), kT0 + absl::Seconds(170));
  EXPECT_EQ(w.Bound(kUnlearned), absl::Seconds(40));  // 5 × 8 s
  w.OnProgress(Report(0, 5), kT0 + absl::Seconds(171));
  EXPECT_EQ(w.Bound(kUnlearned), absl::Seconds(40));  // the longest stays
  // A repeated step (the hook's heartbeat) is no interval.
  w.OnProgress(Hook(0, 5, 1, 0), kT0 + absl::Seconds(200));
  EXPECT_EQ(w.Bound(kUnlearned), absl::Seconds(40));
}

TEST(ScriptWatchTest, AScriptThatNeverReportsIsJudgedByItsStacksOnTheUnlearnedBound) {
  ScriptWatch w;
  w.Reset(1);
  const v1::Attempt a = Attempt(2);
  for (int s = 1; s <= 400; ++s) {
    const absl::Time t = kT0 + absl::Seconds(s);
    // Both stacks change for 50 s, then neither does.
    w.OnProgress(Hook(0, 0, std::min(s, 50), 0), t);
    w.OnProgress(Hook(1, 0, std::min(s, 50), 0), t);
    std::optional<HangVerdict> v = w.Check(a, t, kUnlearned);
    if (s <= 350) {
      EXPECT_FALSE(v.has_value()) << s << ": " << v->message;
      continue;
    }
    ASSERT_TRUE(v.has_value()) << s;
    EXPECT_THAT(v->blamed, ElementsAre(0, 1));
    EXPECT_THAT(
        v->message,
        HasSubstr("rank 0 (worker w0, pid 100) before any report, rank 1 (worker w1, pid 101) "
                  "before any report all stopped"));
    EXPECT_THAT(
        v->message,
        HasSubstr("no report interval learned yet: the coordinator's --progress-timeout-s"));
    return;
  }
  FAIL() << "no hang";
}

TEST(ScriptWatchTest, RanksNeverHeardFromAndEndedRanksAreNotJudged) {
  ScriptWatch w;
  w.Reset(1);
  v1::Attempt a = Attempt(2);
  EXPECT_FALSE(w.Check(a, kT0 + absl::Hours(1), kUnlearned).has_value());
  w.OnProgress(Report(1, 1), kT0);
  a.mutable_ranks(1)->set_state(v1::RANK_STATE_SUCCEEDED);
  EXPECT_FALSE(w.Check(a, kT0 + absl::Hours(1), kUnlearned).has_value());
}

}  // namespace
}  // namespace trainctl::coordinator
