#include "worker/dist/work_status.h"

#include <gtest/gtest.h>

#include <thread>

namespace trainctl::dist {
namespace {

TEST(WorkStatusTest, TheFirstFinishWins) {
  WorkStatus w;
  EXPECT_FALSE(w.done());
  w.Finish(absl::DeadlineExceededError("timed out"));
  w.Finish(absl::OkStatus());  // the engine's late completion changes nothing
  EXPECT_TRUE(w.done());
  EXPECT_TRUE(absl::IsDeadlineExceeded(w.status()));
}

TEST(WorkStatusTest, AwaitTimesOutWhileUnsetAndReturnsTheStatusOnceSet) {
  WorkStatus w;
  EXPECT_FALSE(w.Await(absl::Milliseconds(20)).has_value());
  std::thread finisher([&w] {
    absl::SleepFor(absl::Milliseconds(20));
    w.Finish(absl::AbortedError("peer gone"));
  });
  const std::optional<absl::Status> s = w.Await(absl::Seconds(30));
  finisher.join();
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(absl::IsAborted(*s));
  EXPECT_TRUE(w.Await(absl::ZeroDuration()).has_value());
}

}  // namespace
}  // namespace trainctl::dist
