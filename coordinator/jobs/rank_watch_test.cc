#include "coordinator/jobs/rank_watch.h"
#include "coordinator/jobs/rank_progress_testing.h"

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

v1::RankProgress Beat(int rank, int64_t step, int64_t seq, int64_t waiting_seq,
                      double compute_ms = 10, int64_t waiting_ms = 0) {
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
    for (int r = 0; r < 3; ++r)
      w.OnHeartbeat(Beat(r, 600 + s, 1000 + 4 * s, 0), kT0 + absl::Seconds(s), 0.3);
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
    EXPECT_THAT(
        v->message,
        HasSubstr(
            "rank 1 (worker w1, pid 101) stopped before all-reduce #1020 (step 605, bucket 3); "
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
    EXPECT_THAT(
        v->message,
        HasSubstr("rank 1 (worker w1, pid 101) stopped before all-reduce #21 (step 11, bucket 3); "
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
    for (int r = 0; r < 3; ++r)
      w.OnHeartbeat(Beat(r, s, s, 0, r == 2 ? 14 : 10), kT0 + absl::Seconds(s), 0.3);
  }
  EXPECT_TRUE(w.TakeStragglers(a).empty());  // 40% slower, but 4 beats only
  w.OnHeartbeat(Beat(2, 5, 5, 0, 14), kT0 + absl::Seconds(5), 0.3);
  std::vector<Straggler> st = w.TakeStragglers(a);
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].rank, 2);
  EXPECT_THAT(st[0].message,
              HasSubstr("rank 2 (worker w2, host h2) is a straggler: 14.0 ms of compute per step, "
                        "40% slower than the median of the other ranks (10.0 ms)"));
  w.OnHeartbeat(Beat(2, 6, 6, 0, 14), kT0 + absl::Seconds(6), 0.3);
  EXPECT_TRUE(w.TakeStragglers(a).empty());  // once per attempt
  // 20% slower is under the threshold: never a straggler.
  RankWatch mild;
  mild.Reset(1);
  for (int s = 0; s < 20; ++s) {
    for (int r = 0; r < 3; ++r)
      mild.OnHeartbeat(Beat(r, s, s, 0, r == 0 ? 12 : 10), kT0 + absl::Seconds(s), 0.3);
  }
  EXPECT_TRUE(mild.TakeStragglers(a).empty());
}

// A heartbeat of `rank` in `phase` (epoch 2, global step 500), its last
// collective #seq, waiting in none.
v1::RankProgress PhaseBeat(int rank, v1::RankPhase phase, int64_t seq) {
  v1::RankProgress p = Beat(rank, 500, seq, 0);
  p.set_phase(phase);
  p.set_epoch(1);
  p.set_op(v1::COLLECTIVE_OP_BROADCAST);
  p.set_op_step(0);
  p.set_op_bucket(-1);
  return p;
}

TEST(RankWatchSilenceTest, ARankSilentPastTheBoundIsHungInAnyPhase) {
  for (v1::RankPhase phase : {v1::RANK_PHASE_INIT, v1::RANK_PHASE_EVAL, v1::RANK_PHASE_CHECKPOINT,
                              v1::RANK_PHASE_TRAIN}) {
    RankWatch w;
    w.Reset(1);
    const v1::Attempt a = Attempt(2);
    // Rank 1 beats once at t=0 and stops; rank 0 keeps beating, busy in a
    // checkpoint write (not waiting in any collective).
    w.OnHeartbeat(PhaseBeat(1, phase, 40), kT0, 0.3);
    for (int s = 0; s <= 6; ++s) {
      w.OnHeartbeat(PhaseBeat(0, v1::RANK_PHASE_CHECKPOINT, 40), kT0 + absl::Seconds(s), 0.3);
      std::optional<HangVerdict> v = w.CheckSilence(a, kT0 + absl::Seconds(s), nullptr);
      // bound = max(5 × 200 ms, 5 s): silent 5 s is not past it, 6 s is.
      if (s <= 5) {
        EXPECT_FALSE(v.has_value()) << s << ": " << v->message;
        continue;
      }
      ASSERT_TRUE(v.has_value()) << v1::RankPhase_Name(phase);
      EXPECT_EQ(v->bound, absl::Seconds(5));
      EXPECT_THAT(v->blamed, ::testing::ElementsAre(1));
      const std::string where = phase == v1::RANK_PHASE_INIT         ? "epoch start"
                                : phase == v1::RANK_PHASE_EVAL       ? "eval"
                                : phase == v1::RANK_PHASE_CHECKPOINT ? "checkpoint"
                                                                     : "training";
      EXPECT_THAT(v->message, HasSubstr("rank 1 (worker w1, pid 101) stopped in its " + where +
                                        " phase (epoch 2, step 500), after broadcast #40; "
                                        "no heartbeat from rank 1 for 6.0 s (bound 5.0 s)"));
    }
  }
}

TEST(RankWatchSilenceTest, NamesTheCollectiveTheOthersWaitIn) {
  RankWatch w;
  w.Reset(1);
  const v1::Attempt a = Attempt(3);
  // Rank 2 stopped at the start of an epoch (init after step 500, #40
  // done); ranks 0 and 1 wait in the epoch's first all-reduce, #41.
  w.OnHeartbeat(PhaseBeat(2, v1::RANK_PHASE_INIT, 40), kT0, 0.3);
  for (int s = 0; s <= 7; ++s) {
    for (int r : {0, 1})
      w.OnHeartbeat(Beat(r, 500, 41, 41, 10, s * 1000), kT0 + absl::Seconds(s), 0.3);
  }
  std::optional<HangVerdict> v = w.CheckSilence(a, kT0 + absl::Seconds(7), nullptr);
  ASSERT_TRUE(v.has_value());
  EXPECT_THAT(v->blamed, ::testing::ElementsAre(2));
  EXPECT_THAT(
      v->message,
      HasSubstr("rank 2 (worker w2, pid 102) stopped before all-reduce #41 (step 501, bucket 3) "
                "in its epoch start phase (epoch 2, step 500); ranks 0, 1 waiting in it for 7.0 s "
                "(bound 5.0 s); no heartbeat from rank 2 for 7.0 s"));
  // The stall rule alone would not judge it: rank 2's last word was not "train".
  EXPECT_FALSE(w.CheckHang(a, kT0 + absl::Seconds(7)).has_value());
}

TEST(RankWatchSilenceTest, ASlowRankWhoseHeartbeatRunsIsNeverHung) {
  RankWatch w;
  w.Reset(1);
  const v1::Attempt a = Attempt(2);
  // Rank 0 writes a checkpoint for a minute (then evaluates for another),
  // beating every second; rank 1 waits for it in all-reduce #41.
  for (int s = 0; s <= 120; ++s) {
    w.OnHeartbeat(PhaseBeat(0, s < 60 ? v1::RANK_PHASE_CHECKPOINT : v1::RANK_PHASE_EVAL, 40),
                  kT0 + absl::Seconds(s), 0.3);
    w.OnHeartbeat(Beat(1, 500, 41, 41, 10, s * 1000), kT0 + absl::Seconds(s), 0.3);
    const absl::Time now = kT0 + absl::Seconds(s) + absl::Milliseconds(900);
    EXPECT_FALSE(w.CheckSilence(a, now, nullptr).has_value()) << s;
    EXPECT_FALSE(w.CheckHang(a, now).has_value()) << s;
  }
}

TEST(RankWatchSilenceTest, SilenceCountsOnlyWhileTheRanksWorkerIsHeard) {
  RankWatch w;
  w.Reset(1);
  const v1::Attempt a = Attempt(2);
  absl::Time w1_heard = kT0 + absl::Seconds(1);
  const RankWatch::LastHeard heard = [&](const std::string& worker) {
    return worker == "w1" ? w1_heard : absl::InfiniteFuture();
  };
  // Rank 1's last heartbeat came at t=1; its worker's stream then stalled
  // (or the coordinator's loop did): nothing from w1 since, so its rank's
  // quiet is no evidence.
  w.OnHeartbeat(PhaseBeat(1, v1::RANK_PHASE_TRAIN, 40), kT0 + absl::Seconds(1), 0.3);
  w.OnHeartbeat(PhaseBeat(0, v1::RANK_PHASE_TRAIN, 40), kT0 + absl::Seconds(30), 0.3);
  EXPECT_FALSE(w.CheckSilence(a, kT0 + absl::Seconds(30), heard).has_value());
  // w1 heartbeats again (its stream works) and rank 1 still says nothing:
  // 5 s of that is within the bound, more is a hang.
  w1_heard = kT0 + absl::Seconds(6);
  EXPECT_FALSE(w.CheckSilence(a, kT0 + absl::Seconds(30), heard).has_value());
  w1_heard = kT0 + absl::Seconds(6) + absl::Milliseconds(100);
  std::optional<HangVerdict> v = w.CheckSilence(a, kT0 + absl::Seconds(30), heard);
  ASSERT_TRUE(v.has_value());
  EXPECT_THAT(v->blamed, ::testing::ElementsAre(1));
}

TEST(RankWatchSilenceTest, TheBoundGrowsWithSlowStepsAndEndedOrUnheardRanksAreNotJudged) {
  RankWatch w;
  w.Reset(1);
  v1::Attempt a = Attempt(3);
  v1::RankProgress slow = PhaseBeat(0, v1::RANK_PHASE_TRAIN, 40);
  slow.set_p99_step_ms(3000);  // bound = 5 × 3 s = 15 s
  w.OnHeartbeat(slow, kT0, 0.3);
  w.OnHeartbeat(PhaseBeat(1, v1::RANK_PHASE_TRAIN, 40), kT0, 0.3);
  // Rank 2 never sent a heartbeat (still loading its data): not judged.
  EXPECT_FALSE(w.CheckSilence(a, kT0 + absl::Seconds(15), nullptr).has_value());
  std::optional<HangVerdict> v = w.CheckSilence(a, kT0 + absl::Seconds(16), nullptr);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->bound, absl::Seconds(15));
  EXPECT_THAT(v->blamed, ::testing::ElementsAre(0, 1));
  // Ranks that ended (their process exited) are silent by right.
  a.mutable_ranks(0)->set_state(v1::RANK_STATE_SUCCEEDED);
  a.mutable_ranks(1)->set_state(v1::RANK_STATE_FAILED);
  EXPECT_FALSE(w.CheckSilence(a, kT0 + absl::Minutes(10), nullptr).has_value());
}

}  // namespace
}  // namespace trainctl::coordinator
