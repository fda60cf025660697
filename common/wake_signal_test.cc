#include "common/wake_signal.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "common/clock.h"

namespace trainctl {
namespace {

TEST(WakeSignalTest, ANotifyWakesAWaiterAndAStaleGenerationDoesNotWait) {
  WakeSignal s;
  const uint64_t seen = s.generation();
  std::thread waker([&] { s.Notify(); });
  EXPECT_TRUE(s.WaitFor(seen, absl::InfiniteDuration()));
  waker.join();
  EXPECT_NE(s.generation(), seen);
  // Notified since `seen` was read: returns at once, even with no timeout.
  EXPECT_TRUE(s.WaitFor(seen, absl::ZeroDuration()));
}

TEST(WakeSignalTest, ATimeoutIsMeasuredOnTheMonotonicClock) {
  WakeSignal s;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(s.WaitFor(s.generation(), absl::Milliseconds(30)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(30));
}

// A finite deadline centuries away is no deadline in practice: the wait
// lasts until the notify (it once overflowed the steady clock and returned
// at once).
TEST(WakeSignalTest, ADeadlineCenturiesAwayWaitsForTheNotify) {
  WakeSignal s;
  const uint64_t seen = s.generation();
  std::atomic<bool> returned{false};
  bool woken = false;
  std::thread waiter([&] {
    woken = s.WaitUntil(seen, MonotonicNow() + absl::Hours(24 * 365 * 400), *SystemClock::Get());
    returned.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(returned.load()) << "the wait ended before any notify";
  s.Notify();
  waiter.join();
  EXPECT_TRUE(woken);
}

// On a FakeClock the deadline is the fake clock's: real time passing does
// not end the wait, Advance past the deadline does, and a Notify still
// wakes it first.
TEST(WakeSignalTest, AWaitOnAFakeClockEndsWhenTheClockIsAdvancedPastItsDeadline) {
  FakeClock clock;
  WakeSignal s;
  const absl::Time deadline = clock.Mono() + absl::Hours(1);
  bool woken = true;
  std::thread waiter([&] { woken = s.WaitUntil(s.generation(), deadline, clock); });
  ASSERT_TRUE(clock.AwaitWaiters(1, absl::Seconds(30)));
  clock.Advance(absl::Minutes(59));  // not there yet: the waiter waits on
  ASSERT_TRUE(clock.AwaitWaiters(1, absl::Seconds(30)));
  clock.Advance(absl::Minutes(1));
  waiter.join();
  EXPECT_FALSE(woken);
  EXPECT_FALSE(clock.AwaitWaiters(1, absl::ZeroDuration()));

  const uint64_t seen = s.generation();
  std::thread notified([&] { woken = s.WaitUntil(seen, clock.Mono() + absl::Hours(1), clock); });
  ASSERT_TRUE(clock.AwaitWaiters(1, absl::Seconds(30)));
  s.Notify();
  notified.join();
  EXPECT_TRUE(woken);
  // A deadline already passed returns at once.
  EXPECT_FALSE(s.WaitUntil(s.generation(), clock.Mono(), clock));
}

}  // namespace
}  // namespace trainctl
