#include "common/wake_signal.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

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

}  // namespace
}  // namespace trainctl
