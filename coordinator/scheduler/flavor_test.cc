// GPU flavors in the scheduler (scheduler.h, Flavors): a job that asks for a
// flavor runs only on GPU workers of that flavor, waits naming the flavor
// when none is there, and preempts only for slots of its flavor.
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/scheduler/scheduler.h"
#include "coordinator/scheduler/scheduler_test_support.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl::scheduler {
namespace {

using ::testing::HasSubstr;

TEST(FlavorTest, AJobGoesOnlyToWorkersOfItsFlavor) {
  // The a100 worker is the tightest fit; the job asks for h100.
  std::vector<WorkerSlots> workers = {Flavored(Gpu("a", 2), "a100"), Flavored(Gpu("b", 4), "h100")};
  absl::StatusOr<ScheduleResult> r = Schedule({OfFlavor(Job("j", 2), "h100")}, workers);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r), (std::map<std::string, std::string>{{"j", "b:0,1"}}));
  // Without a flavor it takes the tightest, whatever the flavor.
  r = Schedule({Job("j", 2)}, workers);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r), (std::map<std::string, std::string>{{"j", "a:0,1"}}));
}

TEST(FlavorTest, SplitsAcrossWorkersOfTheFlavorOnly) {
  std::vector<WorkerSlots> workers = {Flavored(Gpu("a", 2), "h100"), Flavored(Gpu("b", 8), "a100"),
                                      Flavored(Gpu("c", 3), "h100")};
  absl::StatusOr<ScheduleResult> r = Schedule({OfFlavor(Job("j", 5), "h100")}, workers);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r), (std::map<std::string, std::string>{{"j", "c:0,1,2 a:0,1"}}));
  // Six h100 ranks never fit five h100 slots, however many a100s are free.
  r = Schedule({OfFlavor(Job("big", 6), "h100")}, workers);
  ASSERT_TRUE(r.ok());
  const PendingJobStatus& p = FindPending(*r, "big");
  EXPECT_EQ(p.reason, PendingReason::kExceedsCapacity);
  EXPECT_THAT(p.message,
              HasSubstr("needs 6 cuda (h100) slots, the cluster has 5 in total across 2 workers"));
}

TEST(FlavorTest, AFlavorNoWorkerHasWaitsNamingIt) {
  std::vector<WorkerSlots> workers = {Flavored(Gpu("a", 4), "a100"), Flavored(Gpu("b", 4), "h200"),
                                      Cpu("c", 4)};
  absl::StatusOr<ScheduleResult> r = Schedule({OfFlavor(Job("j", 1, kAuto), "h100")}, workers);
  ASSERT_TRUE(r.ok());
  const PendingJobStatus& p = FindPending(*r, "j");
  EXPECT_EQ(p.reason, PendingReason::kNoWorkerOfKind);
  EXPECT_EQ(p.kind, SlotKind::kGpu);
  EXPECT_EQ(p.message,
            "no schedulable worker has cuda (h100) slots (GPU flavors here: a100, h200)");
  // A GPU worker without a flavor (a mixed host) is not one of it either.
  r = Schedule({OfFlavor(Job("j", 1), "h100")}, {Gpu("m", 2), Cpu("c", 4)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(FindPending(*r, "j").message,
            "no schedulable worker has cuda (h100) slots (no schedulable GPU worker has a flavor)");
}

TEST(FlavorTest, AFlavorOnACpuJobIsInvalid) {
  absl::StatusOr<ScheduleResult> r = Schedule({OfFlavor(Job("j", 1, kCpu), "h100")}, {Cpu("c", 4)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(FindPending(*r, "j").reason, PendingReason::kInvalidJob);
  EXPECT_EQ(FindPending(*r, "j").message, "gpu_flavor h100 asks for GPUs, but device is cpu");
}

TEST(FlavorTest, AnAutoJobWithAFlavorWaitsForItsGpusNotForCpus) {
  absl::StatusOr<ScheduleResult> r = Schedule({OfFlavor(Job("j", 2, kAuto), "h100")},
                                              {Flavored(Gpu("g", 1, 2), "h100"), Cpu("c", 8)});
  ASSERT_TRUE(r.ok());
  const PendingJobStatus& p = FindPending(*r, "j");
  EXPECT_EQ(p.reason, PendingReason::kInsufficientFreeSlots);
  EXPECT_THAT(p.message, HasSubstr("needs 2 cuda (h100) slots, 1 of 2 free on 1 worker"));
}

TEST(FlavorTest, TheHeadOfAFlavorReservesOnlyItsFlavorsSlots) {
  // h100: 3 of 4 free; a 4-rank h100 job blocks and holds the 3. A later
  // 2-rank h100 job waits behind it; a later a100 job starts at once.
  std::vector<WorkerSlots> workers = {Flavored(Gpu("h", 3, 4), "h100"),
                                      Flavored(Gpu("a", 2), "a100")};
  std::vector<PendingJob> jobs = {OfFlavor(Job("head", 4, kCuda, 0, 1), "h100"),
                                  OfFlavor(Job("small", 2, kCuda, 0, 2), "h100"),
                                  OfFlavor(Job("other", 2, kCuda, 0, 3), "a100")};
  absl::StatusOr<ScheduleResult> r = Schedule(jobs, workers);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r),
            (std::map<std::string, std::string>{{"head", "pending:insufficient_free_slots"},
                                                {"small", "pending:blocked_by_reservation"},
                                                {"other", "a:0,1"}}));
  EXPECT_EQ(FindPending(*r, "head").reserved_slots.size(), 3u);
  EXPECT_EQ(FindPending(*r, "small").blocked_by, "head");
}

TEST(FlavorTest, PreemptsOnlyVictimsOfItsFlavor) {
  // Queue "team" (nominal 4 GPUs) lent to "other", which runs one job on
  // a100 and one on h100. Team's h100 job reclaims: only the h100 borrower
  // frees slots it can use.
  std::vector<WorkerSlots> workers = {Flavored(Gpu("a", 0, 2), "a100"),
                                      Flavored(Gpu("h", 0, 2), "h100")};
  QueueInput in;
  in.queues = {Queue("team", 4, -1, "c"), Queue("other", 0, -1, "c")};
  RunningJob on_a100 = Running("ra", "other", 2, 0, 2);
  on_a100.gpu_flavor = "a100";
  RunningJob on_h100 = Running("rh", "other", 2, 0, 1);
  on_h100.gpu_flavor = "h100";
  in.running = {on_a100, on_h100};
  absl::StatusOr<ScheduleResult> r =
      Schedule({Queued("team", OfFlavor(Job("j", 2), "h100"))}, workers, in);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->preemptions.size(), 1u) << Dump(*r);
  EXPECT_EQ(r->preemptions[0].victim_job_id, "rh");
  EXPECT_EQ(FindPending(*r, "j").reason, PendingReason::kPreempting);
  // Without a flavor the younger one goes: its slots serve any GPU job.
  r = Schedule({Queued("team", Job("any", 2))}, workers, in);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->preemptions.size(), 1u) << Dump(*r);
  EXPECT_EQ(r->preemptions[0].victim_job_id, "ra");
  // The a100 job is the younger one, picked first without a flavor; for
  // the h100 job it frees nothing (the quota is there), alone or not.
  in.running = {on_a100};
  r = Schedule({Queued("team", OfFlavor(Job("j", 2), "h100"))}, workers, in);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->preemptions.empty()) << Dump(*r);
}

QueueSpec WithFlavorQuota(QueueSpec q, std::string flavor, int nominal) {
  q.nominal_gpu_flavors[std::move(flavor)] = nominal;
  return q;
}

TEST(FlavorQuotaTest, AJobOfTheFlavorFitsOnlyWithinItsQueuesFlavorQuota) {
  // Plenty of h100s; queue "team" may hold 3 of them. A running job of the
  // queue holds 1 h100 slot: a 2-rank h100 job fits, a second one waits;
  // an a100 job (no a100 quota) and a job of another queue start.
  std::vector<WorkerSlots> workers = {Flavored(Gpu("h", 7, 8), "h100"),
                                      Flavored(Gpu("a", 4), "a100")};
  QueueInput in;
  in.queues = {WithFlavorQuota(Queue("team", -1), "h100", 3), Queue("other", -1)};
  RunningJob held = Running("r", "team", 1);
  held.gpu_flavor = "h100";
  in.running = {held};
  std::vector<PendingJob> jobs = {Queued("team", OfFlavor(Job("first", 2, kCuda, 0, 1), "h100")),
                                  Queued("team", OfFlavor(Job("second", 1, kCuda, 0, 2), "h100")),
                                  Queued("team", OfFlavor(Job("a100", 2, kCuda, 0, 3), "a100")),
                                  Queued("other", OfFlavor(Job("theirs", 4, kCuda, 0, 4), "h100"))};
  absl::StatusOr<ScheduleResult> r = Schedule(jobs, workers, in);
  ASSERT_TRUE(r.ok()) << r.status();
  std::map<std::string, std::string> got = Outcome(*r);
  EXPECT_NE(got["first"].rfind("h:", 0), std::string::npos) << Dump(*r);
  EXPECT_EQ(got["second"], "pending:quota_exceeded");
  EXPECT_EQ(FindPending(*r, "second").message,
            "needs 1 cuda (h100) slots, more than its queue's quota admits now (queue team: 3 of 3 "
            "cuda (h100) used)");
  EXPECT_EQ(got["a100"], "a:0,1");
  EXPECT_NE(got["theirs"].rfind("h:", 0), std::string::npos) << Dump(*r);
}

TEST(FlavorQuotaTest, ItCountsEveryJobOfTheQueueOnTheFlavorAndBoundsElasticSize) {
  std::vector<WorkerSlots> workers = {Flavored(Gpu("h", 8), "h100")};
  QueueInput in;
  in.queues = {WithFlavorQuota(Queue("team", -1), "h100", 4)};
  // This pass: a job without a flavor lands on the h100s and counts; the
  // elastic h100 job then gets what is left of the quota, not of the slots.
  PendingJob elastic = Queued("team", OfFlavor(Job("elastic", 6, kCuda, 0, 2), "h100"));
  elastic.min_world_size = 1;
  absl::StatusOr<ScheduleResult> r =
      Schedule({Queued("team", Job("plain", 3, kCuda, 0, 1)), elastic}, workers, in);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->placements.size(), 2u) << Dump(*r);
  EXPECT_EQ(r->placements[1].job_id, "elastic");
  EXPECT_EQ(r->placements[1].world_size, 1);
  // Larger than the quota: never fits this queue.
  r = Schedule({Queued("team", OfFlavor(Job("big", 5), "h100"))}, workers, in);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(FindPending(*r, "big").reason, PendingReason::kExceedsQueueLimit);
  EXPECT_EQ(FindPending(*r, "big").message,
            "needs 5 cuda (h100) slots, more than queue team's h100 quota with all its cohort "
            "could ever lend (4)");
  // A negative quota is malformed input.
  in.queues[0].nominal_gpu_flavors["h100"] = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(Schedule({}, workers, in).status()));
}

// Random clusters of flavored, unflavored and CPU workers and jobs of each
// sort: a flavored job's ranks are all on workers of its flavor, no slot
// is used twice, and every job ends in exactly one of placed or pending.
TEST(FlavorTest, RandomPassesKeepEveryRankOnItsFlavor) {
  std::mt19937 rng(48);
  const std::vector<std::string> flavors = {"", "a100", "h100"};
  for (int round = 0; round < 300; ++round) {
    std::vector<WorkerSlots> workers;
    std::map<std::string, std::string> flavor_of;
    const int nw = 1 + static_cast<int>(rng() % 6);
    for (int w = 0; w < nw; ++w) {
      const std::string id = absl::StrCat("w", w);
      const int total = 1 + static_cast<int>(rng() % 4);
      const int free = static_cast<int>(rng() % (total + 1));
      if (rng() % 4 == 0) {
        workers.push_back(Cpu(id, free, total));
      } else {
        workers.push_back(Flavored(Gpu(id, free, total), flavors[rng() % flavors.size()]));
        flavor_of[id] = workers.back().gpu_flavor;
      }
    }
    std::vector<PendingJob> jobs;
    const int nj = 1 + static_cast<int>(rng() % 6);
    for (int j = 0; j < nj; ++j) {
      const DeviceRequirement device = rng() % 3 == 0 ? kAuto : kCuda;
      jobs.push_back(
          OfFlavor(Job(absl::StrCat("j", j), 1 + static_cast<int>(rng() % 4), device, 0, j),
                   flavors[rng() % flavors.size()]));
    }
    absl::StatusOr<ScheduleResult> r = Schedule(jobs, workers);
    ASSERT_TRUE(r.ok()) << r.status();
    std::set<std::pair<std::string, int>> used;
    std::set<std::string> seen;
    for (const Placement& p : r->placements) {
      ASSERT_TRUE(seen.insert(p.job_id).second);
      const PendingJob& job = *std::find_if(
          jobs.begin(), jobs.end(), [&](const PendingJob& x) { return x.job_id == p.job_id; });
      for (const RankAssignment& rank : p.ranks) {
        EXPECT_TRUE(used.insert({rank.worker_id, rank.slot}).second) << Dump(*r);
        if (!job.gpu_flavor.empty()) {
          ASSERT_TRUE(flavor_of.count(rank.worker_id)) << "a flavored job on a CPU worker\n"
                                                       << Dump(*r);
          EXPECT_EQ(flavor_of[rank.worker_id], job.gpu_flavor) << Dump(*r);
        }
      }
    }
    for (const PendingJobStatus& p : r->pending) {
      ASSERT_TRUE(seen.insert(p.job_id).second);
      const PendingJob& job = *std::find_if(
          jobs.begin(), jobs.end(), [&](const PendingJob& x) { return x.job_id == p.job_id; });
      if (!job.gpu_flavor.empty() && p.reason != PendingReason::kInvalidJob) {
        EXPECT_THAT(p.message, HasSubstr(absl::StrCat("(", job.gpu_flavor, ")"))) << p.message;
      }
    }
    EXPECT_EQ(seen.size(), jobs.size());
  }
}

}  // namespace
}  // namespace trainctl::scheduler
