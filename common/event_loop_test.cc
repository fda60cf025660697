#include "common/event_loop.h"

#include <atomic>
#include <memory>

#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/clock.h"

namespace trainctl {
namespace {

// Observations of `h` at or under `le` seconds (its cumulative bucket), read
// from what /metrics would show.
int64_t AtMost(const LatencyHistogram& h, const std::string& le) {
  PromWriter w;
  h.Write(w, "h", {});
  const std::string text = w.Take();
  const std::string key = absl::StrCat("h_bucket{le=\"", le, "\"} ");
  const size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  const size_t end = text.find('\n', at);
  int64_t n = -1;
  if (!absl::SimpleAtoi(text.substr(at + key.size(), end - at - key.size()), &n)) return -1;
  return n;
}

TEST(EventLoopTest, PostedWorkRunsInOrderOnTheLoopThread) {
  EventLoop loop;
  std::vector<int> seen;
  for (int i = 0; i < 5; ++i)
    loop.Post([&seen, &loop, i] {
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
  loop->StopAndJoin();                                           // Idempotent.
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

namespace trainctl {
namespace {

// A task that holds the loop for 200 ms shows as one long run, and the tasks
// behind it (a posted one, a timer due meanwhile) as long waits.
TEST(EventLoopTest, TaskWaitsAndRunsAreCountedByKind) {
  using Kind = EventLoop::TaskKind;
  EventLoop loop;
  absl::Notification started;
  loop.Post([&started] {
    started.Notify();
    absl::SleepFor(absl::Milliseconds(200));  // the stall measured
  });
  started.WaitForNotification();
  loop.After(absl::Milliseconds(1), [] {});
  loop.Post([] {});
  // A due timer runs before posted work, so it has run when this returns.
  loop.RunSync([] {});
  // A task is counted once it returns, after RunSync's waiter may have woken:
  // one more round trip has the first one counted.
  loop.RunSync([] {});
  EXPECT_GE(loop.task_run(Kind::kPosted).count(), 3);
  EXPECT_LT(AtMost(loop.task_run(Kind::kPosted), "0.1"), loop.task_run(Kind::kPosted).count())
      << "the stall shows as a posted task that ran longer than 100 ms";
  EXPECT_EQ(loop.task_wait(Kind::kTimer).count(), 1);
  EXPECT_EQ(AtMost(loop.task_wait(Kind::kTimer), "0.1"), 0) << "the timer waited behind the stall";
  EXPECT_LT(AtMost(loop.task_wait(Kind::kPosted), "0.1"), loop.task_wait(Kind::kPosted).count())
      << "the closure posted during the stall waited behind it";
}

// On a FakeClock the timers run on the fake time: an hour-long period
// fires when the clock is advanced an hour, never in real time, and a
// one-shot timer likewise.
TEST(EventLoopTest, TimersOnAFakeClockFireWhenItIsAdvanced) {
  FakeClock clock;
  EventLoop loop(&clock);
  std::atomic<int> every{0};
  std::atomic<int> once{0};
  loop.Every(absl::Hours(1), [&] { every.fetch_add(1); });
  loop.After(absl::Minutes(90), [&] { once.fetch_add(1); });
  ASSERT_TRUE(clock.AwaitWaiters(1, absl::Seconds(30)));
  loop.RunSync([] {});  // a posted task runs; no timer is due
  EXPECT_EQ(every.load(), 0);
  EXPECT_EQ(once.load(), 0);

  clock.Advance(absl::Hours(1));
  loop.RunSync([] {});  // a due timer runs before posted work
  EXPECT_EQ(every.load(), 1);
  EXPECT_EQ(once.load(), 0);

  clock.Advance(absl::Minutes(30));
  loop.RunSync([] {});
  EXPECT_EQ(once.load(), 1);
  EXPECT_EQ(every.load(), 1) << "the period counts from its last run";
  clock.Advance(absl::Minutes(30));
  loop.RunSync([] {});
  EXPECT_EQ(every.load(), 2);
  EXPECT_EQ(once.load(), 1) << "After runs once";
  loop.StopAndJoin();
}

}  // namespace
}  // namespace trainctl
