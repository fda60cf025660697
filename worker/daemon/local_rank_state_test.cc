#include "worker/daemon/local_rank_state.h"

#include <gtest/gtest.h>

#include <vector>

namespace trainctl::worker {
namespace {

LocalRankState After(std::initializer_list<RankEvent> events) {
  LocalRankState s;
  for (RankEvent e : events) EXPECT_TRUE(s.Apply(e)) << "event " << static_cast<int>(e);
  return s;
}

TEST(LocalRankState, StartsWaiting) {
  LocalRankState s;
  EXPECT_TRUE(s.waiting());
  EXPECT_FALSE(s.live());
  EXPECT_FALSE(s.ended());
  EXPECT_EQ(s.proto(), v1::RANK_STATE_ASSIGNED);
  EXPECT_STREQ(s.gauge_label(), "waiting");
}

TEST(LocalRankState, LaunchReadyExitZeroSucceeds) {
  LocalRankState s = After({RankEvent::kLaunch});
  EXPECT_EQ(s.phase(), RankPhase::kStarting);
  EXPECT_TRUE(s.live());
  EXPECT_EQ(s.proto(), v1::RANK_STATE_STARTING);
  ASSERT_TRUE(s.Apply(RankEvent::kReady));
  EXPECT_EQ(s.proto(), v1::RANK_STATE_RUNNING);
  EXPECT_STREQ(s.gauge_label(), "running");
  ASSERT_TRUE(s.Apply(RankEvent::kExitZero));
  EXPECT_EQ(s.phase(), RankPhase::kSucceeded);
  EXPECT_TRUE(s.ended());
  EXPECT_FALSE(s.live());
  EXPECT_EQ(s.proto(), v1::RANK_STATE_SUCCEEDED);
  EXPECT_STREQ(s.gauge_label(), "exited");
}

TEST(LocalRankState, ExitNonZeroFailsFromStartingOrRunning) {
  EXPECT_EQ(After({RankEvent::kLaunch, RankEvent::kExitNonZero}).proto(), v1::RANK_STATE_FAILED);
  EXPECT_EQ(After({RankEvent::kLaunch, RankEvent::kReady, RankEvent::kExitNonZero}).proto(),
            v1::RANK_STATE_FAILED);
  // An exit that is not a failure is a success even before ready (a short job).
  EXPECT_EQ(After({RankEvent::kLaunch, RankEvent::kExitZero}).proto(), v1::RANK_STATE_SUCCEEDED);
}

TEST(LocalRankState, StopOfARunningProcessEndsStoppedWhateverTheExitCode) {
  for (RankEvent exit : {RankEvent::kExitZero, RankEvent::kExitNonZero}) {
    LocalRankState s = After({RankEvent::kLaunch, RankEvent::kStop});
    EXPECT_EQ(s.phase(), RankPhase::kStopping);
    EXPECT_TRUE(s.live());
    EXPECT_TRUE(s.stop_requested());
    EXPECT_FALSE(s.ended());
    ASSERT_TRUE(s.Apply(exit));
    EXPECT_EQ(s.proto(), v1::RANK_STATE_STOPPED);
    EXPECT_TRUE(s.stop_requested());
  }
}

TEST(LocalRankState, StoppingAcceptsARepeatedStopAndALateReady) {
  LocalRankState s =
      After({RankEvent::kLaunch, RankEvent::kStop, RankEvent::kStop, RankEvent::kReady});
  EXPECT_EQ(s.phase(), RankPhase::kStopping);
  // The ready is still reported as RUNNING, as the rank said it.
  EXPECT_EQ(s.proto(), v1::RANK_STATE_RUNNING);
}

TEST(LocalRankState, StopBeforeLaunchEndsAtOnce) {
  LocalRankState s = After({RankEvent::kStop});
  EXPECT_EQ(s.phase(), RankPhase::kStopped);
  EXPECT_TRUE(s.ended());
  EXPECT_EQ(s.proto(), v1::RANK_STATE_STOPPED);
}

TEST(LocalRankState, LaunchFailureFailsBeforeOrDuringTheLaunch) {
  EXPECT_EQ(After({RankEvent::kLaunchFailed}).proto(), v1::RANK_STATE_FAILED);
  EXPECT_EQ(After({RankEvent::kLaunch, RankEvent::kLaunchFailed}).proto(), v1::RANK_STATE_FAILED);
}

TEST(LocalRankState, RefusesEventsThatMakeNoSense) {
  struct Case {
    std::vector<RankEvent> before;
    RankEvent refused;
  };
  const std::vector<Case> cases = {
      {{}, RankEvent::kReady},
      {{}, RankEvent::kExitZero},
      {{}, RankEvent::kExitNonZero},
      {{RankEvent::kLaunch}, RankEvent::kLaunch},
      {{RankEvent::kLaunch, RankEvent::kReady}, RankEvent::kLaunch},
      {{RankEvent::kLaunch, RankEvent::kReady}, RankEvent::kLaunchFailed},
      {{RankEvent::kLaunch, RankEvent::kStop}, RankEvent::kLaunch},
      {{RankEvent::kLaunch, RankEvent::kStop}, RankEvent::kLaunchFailed},
  };
  for (const Case& c : cases) {
    LocalRankState s;
    for (RankEvent e : c.before) ASSERT_TRUE(s.Apply(e));
    RankPhase before = s.phase();
    EXPECT_FALSE(s.Apply(c.refused))
        << RankPhaseName(before) << " + event " << static_cast<int>(c.refused);
    EXPECT_EQ(s.phase(), before);
  }
}

TEST(LocalRankState, AnEndRefusesEverything) {
  const std::vector<std::vector<RankEvent>> ends = {
      {RankEvent::kLaunch, RankEvent::kExitZero},
      {RankEvent::kLaunch, RankEvent::kExitNonZero},
      {RankEvent::kLaunchFailed},
      {RankEvent::kStop},
      {RankEvent::kLaunch, RankEvent::kStop, RankEvent::kExitNonZero},
  };
  for (const auto& path : ends) {
    for (RankEvent e : {RankEvent::kLaunch, RankEvent::kLaunchFailed, RankEvent::kReady,
                        RankEvent::kStop, RankEvent::kExitZero, RankEvent::kExitNonZero}) {
      LocalRankState s;
      for (RankEvent p : path) ASSERT_TRUE(s.Apply(p));
      RankPhase end = s.phase();
      EXPECT_FALSE(s.Apply(e)) << RankPhaseName(end);
      EXPECT_EQ(s.phase(), end);
      EXPECT_TRUE(s.ended());
    }
  }
}

}  // namespace
}  // namespace trainctl::worker
