#include "common/event_loop.h"

#include <atomic>
#include <memory>

#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace trainctl {
namespace {

TEST(EventLoopTest, PostedWorkRunsInOrderOnTheLoopThread) {
  EventLoop loop;
  std::vector<int> seen;
  for (int i = 0; i < 5; ++i) loop.Post([&seen, &loop, i] {
    EXPECT_TRUE(loop.InLoop());
    seen.push_back(i);
  });
  loop.RunSync([] {});
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_FALSE(loop.InLoop());
}

// The check loop-only code makes in every build: passes on the loop thread
// and once the loop has exited; aborts from another thread while it runs.
TEST(EventLoopDeathTest, CheckInLoopAbortsOffTheLoopWhileItRuns) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EventLoop loop;
  bool checked = false;
  loop.RunSync([&] {
    loop.CheckInLoop("the test's closure");
    checked = true;
  });
  EXPECT_TRUE(checked);
  EXPECT_DEATH(loop.CheckInLoop("JobBook"), "JobBook called off its event loop's thread");
  loop.StopAndJoin();
  loop.CheckInLoop("shutdown");  // one thread left: allowed
}

TEST(EventLoopTest, DueTimerRunsBeforeAFloodOfPostedWork) {
  EventLoop loop;
  std::atomic<int> posted_before_timer{-1};
  std::atomic<int> done{0};
  absl::Notification block_released;
  // Block the loop so the timer falls due while work piles up behind.
  loop.Post([&] { block_released.WaitForNotification(); });
  loop.Every(absl::Milliseconds(10), [&] {
    if (posted_before_timer.load() < 0) posted_before_timer = done.load();
  });
  for (int i = 0; i < 1000; ++i) loop.Post([&] { ++done; });
  absl::SleepFor(absl::Milliseconds(30));
  block_released.Notify();
  loop.RunSync([] {});
  EXPECT_EQ(posted_before_timer.load(), 0);
}

// An idle loop sleeps until its next timer, however far; a timer added
// meanwhile wakes it, so the new one is not late.
TEST(EventLoopTest, ATimerAddedWhileTheLoopWaitsForAFarOneIsNotLate) {
  EventLoop loop;
  loop.After(absl::Hours(1), [] { ADD_FAILURE() << "an hour has not passed"; });
  loop.RunSync([] {});  // the loop now waits for the hour
  absl::Notification fired;
  const absl::Time start = absl::Now();
  loop.Every(absl::Milliseconds(20), [&] {
    if (!fired.HasBeenNotified()) fired.Notify();
  });
  ASSERT_TRUE(fired.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  loop.StopAndJoin();
}

TEST(EventLoopTest, AfterRunsOnceOnTheLoop) {
  EventLoop loop;
  std::atomic<int> once{0};
  std::atomic<int> ticks{0};
  absl::Notification ticked;
  loop.After(absl::Milliseconds(5), [&] {
    EXPECT_TRUE(loop.InLoop());
    ++once;
  });
  loop.Every(absl::Milliseconds(5), [&] {
    if (++ticks == 20) ticked.Notify();
  });
  ASSERT_TRUE(ticked.WaitForNotificationWithTimeout(absl::Seconds(60)));
  loop.StopAndJoin();
  EXPECT_EQ(once.load(), 1);
}

// The coordinator and the worker daemon destroy their managers right after
// stopping the loop: StopAndJoin must not return while a queued closure can
// still run (this was a heap-use-after-free under ASan in CI).
TEST(EventLoopTest, StopAndJoinRunsQueuedWorkThenNothingMore) {
  auto loop = std::make_unique<EventLoop>();
  auto state = std::make_unique<int>(0);
  int* raw = state.get();
  absl::Notification started;
  loop->Post([&] {
    started.Notify();
    absl::SleepFor(absl::Milliseconds(50));
  });
  for (int i = 0; i < 100; ++i) loop->Post([raw] { ++*raw; });
  started.WaitForNotification();
  loop->StopAndJoin();
  EXPECT_EQ(*state, 100);  // Everything queued before the stop ran ...
  state.reset();           // ... and nothing runs after: ASan would see it.
  loop->Post([] { ADD_FAILURE() << "ran after StopAndJoin"; });  // Refused once stopped.
  loop->StopAndJoin();                                             // Idempotent.
  loop.reset();
}

TEST(EventLoopTest, RunSyncAfterStopReturnsWithoutRunning) {
  EventLoop loop;
  loop.StopAndJoin();
  bool ran = false;
  loop.RunSync([&] { ran = true; });
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace trainctl
