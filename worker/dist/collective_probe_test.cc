#include "worker/dist/collective_probe.h"

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <thread>

#include "absl/synchronization/notification.h"

namespace trainctl::dist {
namespace {

// A work that finishes when `done` is notified.
class GatedWork : public CollectiveWork {
 public:
  explicit GatedWork(absl::Notification* done) : done_(done) {}
  absl::Status Wait(absl::Duration timeout) override {
    return done_->WaitForNotificationWithTimeout(timeout)
               ? absl::OkStatus()
               : absl::DeadlineExceededError("timed out");
  }
  absl::Status Wait() override { return Wait(absl::Seconds(30)); }
  bool IsCompleted() override { return done_->HasBeenNotified(); }
  // Stamped like an engine that records times, once finished.
  std::optional<WorkTimes> times() override {
    if (!done_->HasBeenNotified()) return std::nullopt;
    return WorkTimes{std::chrono::steady_clock::time_point(std::chrono::seconds(1)),
                     std::chrono::steady_clock::time_point(std::chrono::seconds(2))};
  }

 private:
  absl::Notification* done_;
};

class GatedCollectives : public Collectives {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  CommDevice device() const override { return CommDevice::kCpu; }
  std::string name() const override { return "gated"; }
  absl::Duration timeout() const override { return absl::Seconds(30); }
  std::shared_ptr<CollectiveWork> AllReduceSum(CommBuffer) override { return Next(); }
  std::shared_ptr<CollectiveWork> Broadcast(CommBuffer, int) override { return Next(); }
  absl::Status Barrier() override { return Next()->Wait(); }
  void Abort() override {}
  void RecordWorkTimes() override { record_times = true; }
  absl::Notification gates[8];
  int used = 0;
  bool record_times = false;

 private:
  std::shared_ptr<CollectiveWork> Next() { return std::make_shared<GatedWork>(&gates[used++]); }
};

// The comm timeline asks through the tracking wrapper, which must pass the
// request and the engine's stamps through.
TEST(CollectiveProbeTest, TrackedCollectivesForwardWorkTimes) {
  auto inner = std::make_shared<GatedCollectives>();
  TrackedCollectives comm(inner, std::make_shared<CollectiveProbe>());
  comm.RecordWorkTimes();
  EXPECT_TRUE(inner->record_times);
  float x[4] = {};
  auto work =
      comm.AllReduceSum(CommBuffer{x, 4, CommDataType::kFloat32, CommDevice::kCpu, nullptr});
  EXPECT_FALSE(work->times().has_value());
  inner->gates[0].Notify();
  ASSERT_TRUE(work->Wait().ok());
  const std::optional<WorkTimes> t = work->times();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->finished - t->started, std::chrono::seconds(1));
}

TEST(CollectiveProbeTest, NumbersCollectivesAndNamesTheOneBeingWaitedOn) {
  auto inner = std::make_shared<GatedCollectives>();
  auto probe = std::make_shared<CollectiveProbe>();
  TrackedCollectives comm(inner, probe);
  probe->SetPhase(ProbePhase::kTrain);
  probe->BeginStep(7);
  float x[4] = {};
  CommBuffer buf{x, 4, CommDataType::kFloat32, CommDevice::kCpu, nullptr};
  auto b0 = comm.AllReduceSum(buf);  // seq 1, bucket 0
  auto b1 = comm.AllReduceSum(buf);  // seq 2, bucket 1
  ProbeSnapshot s = probe->Snapshot();
  EXPECT_EQ(s.phase, ProbePhase::kTrain);
  EXPECT_EQ(s.seq, 2);
  EXPECT_EQ(s.waiting_seq, 0);
  EXPECT_EQ(s.op, ProbeOp::kAllReduce);
  EXPECT_EQ(s.op_step, 7);
  EXPECT_EQ(s.op_bucket, 1);

  inner->gates[0].Notify();
  ASSERT_TRUE(b0->Wait().ok());  // already complete: no wait recorded
  EXPECT_EQ(probe->Snapshot().waiting_seq, 0);
  std::thread waiter([&] { EXPECT_TRUE(b1->Wait().ok()); });
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (probe->Snapshot().waiting_seq == 0 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(1));
  absl::SleepFor(absl::Milliseconds(20));
  s = probe->Snapshot();
  EXPECT_EQ(s.waiting_seq, 2);
  EXPECT_EQ(s.op_bucket, 1);
  EXPECT_GE(s.waiting, absl::Milliseconds(20));
  inner->gates[1].Notify();
  waiter.join();
  EXPECT_EQ(probe->Snapshot().waiting_seq, 0);

  // A new step restarts the bucket count; broadcasts have no bucket.
  probe->BeginStep(8);
  auto bc = comm.Broadcast(buf, 0);
  s = probe->Snapshot();
  EXPECT_EQ(s.seq, 3);
  EXPECT_EQ(s.op, ProbeOp::kBroadcast);
  EXPECT_EQ(s.op_bucket, -1);
  auto b2 = comm.AllReduceSum(buf);
  EXPECT_EQ(probe->Snapshot().op_bucket, 0);
  EXPECT_EQ(probe->Snapshot().op_step, 8);
  inner->gates[2].Notify();
  inner->gates[3].Notify();
  EXPECT_TRUE(bc->Wait().ok());
  EXPECT_TRUE(b2->Wait().ok());
}

TEST(CollectiveProbeTest, StepTimePercentileAndComputeMeanOverTheWindow) {
  CollectiveProbe probe;
  EXPECT_EQ(probe.Snapshot().p99_step_ms, 0);
  for (int i = 1; i <= 100; ++i) probe.EndStep(i, 2.0);  // the window keeps 37..100
  ProbeSnapshot s = probe.Snapshot();
  EXPECT_DOUBLE_EQ(s.p99_step_ms, 100);
  EXPECT_DOUBLE_EQ(s.compute_ms, 2.0);
  for (size_t i = 0; i < CollectiveProbe::kWindow; ++i) probe.EndStep(10, 4.0);
  s = probe.Snapshot();
  EXPECT_DOUBLE_EQ(s.p99_step_ms, 10);
  EXPECT_DOUBLE_EQ(s.compute_ms, 4.0);
}

}  // namespace
}  // namespace trainctl::dist
