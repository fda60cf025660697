// TelemetryWriter: the write runs on the writer's thread, its done on the
// loop (posted there, or at once inside Wait), one write at a time.
#include "coordinator/telemetry/telemetry_writer.h"

#include <gtest/gtest.h>

#include <thread>

#include "absl/synchronization/notification.h"

namespace trainctl::coordinator {
namespace {

TEST(TelemetryWriterTest, TheWriteRunsOffTheLoopAndItsDoneOnTheLoop) {
  EventLoop loop;
  TelemetryWriter writer(&loop);
  std::thread::id wrote_on, done_on, loop_thread;
  absl::Status heard = absl::UnknownError("not heard");
  absl::Notification done;
  loop.RunSync([&] {
    AssertOnLoop(&loop, "test");
    loop_thread = std::this_thread::get_id();
    writer.Start(
        [&] {
          wrote_on = std::this_thread::get_id();
          return absl::UnavailableError("disk full");
        },
        [&](const absl::Status& s) {
          done_on = std::this_thread::get_id();
          heard = s;
          done.Notify();
        });
  });
  done.WaitForNotification();
  EXPECT_NE(wrote_on, loop_thread);
  EXPECT_EQ(done_on, loop_thread);
  EXPECT_EQ(heard.code(), absl::StatusCode::kUnavailable) << heard;
  loop.RunSync([&] {
    AssertOnLoop(&loop, "test");
    EXPECT_FALSE(writer.busy());
  });
  loop.StopAndJoin();
}

// Wait blocks until the write returns and runs its done at once, before
// the posted one (which then finds nothing to do); the writer takes the
// next write after it.
TEST(TelemetryWriterTest, WaitRunsTheDoneAtOnceAndTheNextWriteFollows) {
  AssertOnLoop(nullptr, "the test thread plays the loop");
  TelemetryWriter writer(nullptr);  // no loop: only Wait runs a done
  absl::Notification release;
  int dones = 0;
  writer.Start(
      [&] {
        release.WaitForNotification();
        return absl::OkStatus();
      },
      [&](const absl::Status& s) {
        EXPECT_TRUE(s.ok()) << s;
        ++dones;
      });
  EXPECT_TRUE(writer.busy());
  EXPECT_EQ(dones, 0);
  std::thread releaser([&] { release.Notify(); });
  writer.Wait();
  releaser.join();
  EXPECT_EQ(dones, 1);
  EXPECT_FALSE(writer.busy());
  writer.Wait();  // nothing in progress: returns
  EXPECT_EQ(dones, 1);

  writer.Start([] { return absl::AbortedError("second"); },
               [&](const absl::Status& s) {
                 EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
                 ++dones;
               });
  writer.Wait();
  EXPECT_EQ(dones, 2);
}

}  // namespace
}  // namespace trainctl::coordinator
