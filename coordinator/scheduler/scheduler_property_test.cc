// Randomized properties of the scheduler (fixed seeds): invariants on random
// clusters, determinism under permuted input, and no starvation.
#include "coordinator/scheduler/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/scheduler/scheduler_test_support.h"
#include "gtest/gtest.h"

namespace trainctl::scheduler {
namespace {

// ---------------------------------------------------------------------------
// Randomized properties (fixed seeds).

struct RandomInput {
  std::vector<PendingJob> jobs;
  std::vector<WorkerSlots> workers;
};

RandomInput RandomCluster(std::mt19937& rng) {
  RandomInput in;
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int num_workers = uniform(0, 7);
  for (int w = 0; w < num_workers; ++w) {
    WorkerSlots worker;
    worker.worker_id = absl::StrCat("w", uniform(0, 99), "-", w);
    worker.kind = uniform(0, 2) == 0 ? SlotKind::kCpu : SlotKind::kGpu;
    worker.total_slots = uniform(0, 8);
    worker.schedulable = uniform(0, 9) != 0;
    // A random subset of a random index range (sparse GPU indices too).
    const int base = uniform(0, 1) * uniform(0, 4);
    for (int s = 0; s < worker.total_slots; ++s) {
      if (uniform(0, 2) != 0) worker.free_slots.push_back(base + s);
    }
    std::shuffle(worker.free_slots.begin(), worker.free_slots.end(), rng);
    in.workers.push_back(std::move(worker));
  }
  const int num_jobs = uniform(0, 12);
  for (int j = 0; j < num_jobs; ++j) {
    PendingJob job;
    job.job_id = absl::StrCat("j", j);
    job.world_size = uniform(0, 30) == 0 ? 0 : uniform(1, uniform(1, 3) == 1 ? 20 : 6);
    job.device = static_cast<DeviceRequirement>(uniform(0, 2));
    job.priority = uniform(0, 2);
    job.submit_seq = static_cast<std::uint64_t>(uniform(0, 20));
    in.jobs.push_back(std::move(job));
  }
  return in;
}

TEST(SchedulerPropertyTest, InvariantsOnRandomClusters) {
  std::mt19937 rng(20240611);
  int placed = 0, reserved = 0, blocked = 0, split = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    RandomInput in = RandomCluster(rng);
    SCOPED_TRACE(iter);
    absl::StatusOr<ScheduleResult> r = Schedule(in.jobs, in.workers);
    ASSERT_TRUE(r.ok()) << r.status();
    CheckInvariants(in.jobs, in.workers, *r);
    if (HasFatalFailure() || HasNonfatalFailure()) {
      FAIL() << "result:\n" << Dump(*r);
    }
    placed += static_cast<int>(r->placements.size());
    for (const Placement& p : r->placements) split += p.num_nodes > 1;
    for (const PendingJobStatus& p : r->pending) {
      reserved += !p.reserved_slots.empty();
      blocked += p.reason == PendingReason::kBlockedByReservation;
    }
  }
  // The generator exercises every path.
  EXPECT_GT(placed, 1000);
  EXPECT_GT(split, 100);
  EXPECT_GT(reserved, 100);
  EXPECT_GT(blocked, 20);
}

TEST(SchedulerPropertyTest, DeterministicUnderPermutedInput) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 2000; ++iter) {
    RandomInput in = RandomCluster(rng);
    SCOPED_TRACE(iter);
    absl::StatusOr<ScheduleResult> want = Schedule(in.jobs, in.workers);
    ASSERT_TRUE(want.ok());
    for (int perm = 0; perm < 3; ++perm) {
      RandomInput shuffled = in;
      std::shuffle(shuffled.jobs.begin(), shuffled.jobs.end(), rng);
      std::shuffle(shuffled.workers.begin(), shuffled.workers.end(), rng);
      for (WorkerSlots& w : shuffled.workers)
        std::shuffle(w.free_slots.begin(), w.free_slots.end(), rng);
      absl::StatusOr<ScheduleResult> got = Schedule(shuffled.jobs, shuffled.workers);
      ASSERT_TRUE(got.ok());
      ASSERT_EQ(Dump(*got), Dump(*want));
    }
  }
}

TEST(SchedulerPropertyTest, EveryJobThatFitsEventuallyRuns) {
  // Random clusters under a random stream of jobs: with finite durations and
  // finite arrivals, every job that fits the cluster starts (no starvation).
  std::mt19937 rng(99);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int iter = 0; iter < 150; ++iter) {
    SCOPED_TRACE(iter);
    std::vector<WorkerSlots> workers;
    std::map<SlotKind, int> capacity;
    const int num_workers = uniform(1, 5);
    for (int w = 0; w < num_workers; ++w) {
      const SlotKind kind = uniform(0, 3) == 0 ? SlotKind::kCpu : SlotKind::kGpu;
      const int total = uniform(1, 8);
      workers.push_back(Worker(absl::StrCat("w", w), kind, {}, total));
      capacity[kind] += total;
    }
    std::vector<SimJob> jobs;
    const int num_jobs = uniform(5, 40);
    for (int j = 0; j < num_jobs; ++j) {
      SimJob sj;
      sj.spec = Job(absl::StrCat("j", j), uniform(1, uniform(0, 4) == 0 ? 16 : 4),
                    static_cast<DeviceRequirement>(uniform(0, 2)), uniform(0, 2),
                    static_cast<std::uint64_t>(j));
      sj.arrival = uniform(0, 30);
      sj.duration = uniform(1, 6);
      const SlotKind kind = sj.spec.device == kCpu         ? SlotKind::kCpu
                            : sj.spec.device == kCuda      ? SlotKind::kGpu
                            : capacity[SlotKind::kGpu] > 0 ? SlotKind::kGpu
                                                           : SlotKind::kCpu;
      if (sj.spec.world_size > capacity[kind]) continue;  // reported as never fitting
      jobs.push_back(sj);
    }
    SimResult sim = Simulate(workers, jobs, 2000);
    EXPECT_EQ(sim.start_tick.size(), jobs.size());
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace trainctl::scheduler
