// GPU flavor quotas in a cohort (scheduler.h, "Flavor quotas"; issue #48):
// a queue borrows a flavor its cohort lends, up to its borrowing limit; a
// lender lends at most its lending limit; a queue under its nominal of a
// flavor reclaims it by preempting the flavor's borrowers only. And the
// same numbers outside a pass (quota.h).
#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/scheduler/quota.h"
#include "coordinator/scheduler/scheduler.h"
#include "coordinator/scheduler/scheduler_test_support.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl::scheduler {
namespace {

using ::testing::HasSubstr;

// A queue unlimited in slots with a nominal (and limits, -1 = none) for
// one flavor.
QueueSpec FlavorQueue(std::string name, std::string cohort, const std::string& flavor, int nominal,
                      int borrowing_limit = -1, int lending_limit = -1) {
  QueueSpec q = Queue(std::move(name), -1, -1, std::move(cohort));
  q.nominal_gpu_flavors[flavor] = nominal;
  if (borrowing_limit >= 0) q.borrowing_limit_gpu_flavors[flavor] = borrowing_limit;
  if (lending_limit >= 0) q.lending_limit_gpu_flavors[flavor] = lending_limit;
  return q;
}

RunningJob RunningOn(std::string id, std::string queue, int slots, std::string flavor,
                     int priority = 0, std::uint64_t start_seq = 0) {
  RunningJob r = Running(std::move(id), std::move(queue), slots, priority, start_seq);
  r.gpu_flavor = std::move(flavor);
  return r;
}

TEST(FlavorBorrowingTest, AQueueBorrowsItsCohortsIdleFlavorUpToItsBorrowingLimit) {
  // a: 2 h100 of its own, borrows at most 1; b lends its 4 idle h100.
  std::vector<WorkerSlots> workers = {Flavored(Gpu("h", 8), "h100")};
  QueueInput in;
  in.queues = {FlavorQueue("a", "c", "h100", 2, /*borrowing_limit=*/1),
               FlavorQueue("b", "c", "h100", 4)};
  std::vector<PendingJob> jobs = {Queued("a", OfFlavor(Job("a1", 2, kCuda, 0, 1), "h100")),
                                  Queued("a", OfFlavor(Job("a2", 2, kCuda, 0, 2), "h100")),
                                  Queued("a", OfFlavor(Job("a3", 1, kCuda, 0, 3), "h100"))};
  absl::StatusOr<ScheduleResult> r = Schedule(jobs, workers, in);
  ASSERT_TRUE(r.ok()) << r.status();
  std::map<std::string, std::string> got = Outcome(*r);
  // a1 within the nominal; a2 would hold 4 > 2 + 1; a3 borrows the one.
  EXPECT_EQ(got["a1"], "h:0,1") << Dump(*r);
  EXPECT_EQ(got["a2"], "pending:quota_exceeded");
  EXPECT_EQ(FindPending(*r, "a2").message,
            "needs 2 cuda (h100) slots, more than its queue's quota admits now (queue a: 2 of 2 "
            "cuda (h100) used, borrowing limit 1, cohort c: 2 of 6)");
  EXPECT_EQ(got["a3"], "h:2") << Dump(*r);

  // Without the limit a2 borrows two of b's.
  in.queues[0].borrowing_limit_gpu_flavors.clear();
  r = Schedule(jobs, workers, in);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->placements.size(), 3u) << Dump(*r);
  // Without a cohort there is nothing to borrow.
  in.queues[0].cohort = "";
  r = Schedule(jobs, workers, in);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r)["a2"], "pending:quota_exceeded") << Dump(*r);

  // Never more than nominal + borrowing limit, however idle the cohort.
  in.queues[0].cohort = "c";
  in.queues[0].borrowing_limit_gpu_flavors["h100"] = 1;
  r = Schedule({Queued("a", OfFlavor(Job("big", 4), "h100"))}, workers, in);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(FindPending(*r, "big").reason, PendingReason::kExceedsQueueLimit);
  EXPECT_EQ(FindPending(*r, "big").message,
            "needs 4 cuda (h100) slots, more than queue a's h100 quota with all its cohort could "
            "ever lend (3)");
  EXPECT_EQ(QueueFlavorCeiling(in.queues, "a", "h100"), 3);
  EXPECT_EQ(QueueFlavorCeiling(in.queues, "b", "h100"), 6) << "its own 4 and a's 2";
  EXPECT_EQ(QueueFlavorCeiling(in.queues, "a", "a100"), std::nullopt) << "no a100 quota";
}

TEST(FlavorBorrowingTest, BorrowingWaitsForTheSecondRound) {
  // Both queues want the last two h100s: b's job within its nominal goes
  // first, although a's job is older and of a higher priority.
  std::vector<WorkerSlots> workers = {Flavored(Gpu("h", 2), "h100")};
  QueueInput in;
  in.queues = {FlavorQueue("a", "c", "h100", 0), FlavorQueue("b", "c", "h100", 2)};
  absl::StatusOr<ScheduleResult> r =
      Schedule({Queued("a", OfFlavor(Job("borrower", 2, kCuda, 5, 1), "h100")),
                Queued("b", OfFlavor(Job("owner", 2, kCuda, 0, 2), "h100"))},
               workers, in);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->placements.size(), 1u) << Dump(*r);
  EXPECT_EQ(r->placements[0].job_id, "owner");
}

TEST(FlavorLendingTest, ALenderLendsAtMostItsLendingLimit) {
  // b has 4 h100s and lends at most 1; a has none of its own.
  std::vector<WorkerSlots> workers = {Flavored(Gpu("h", 8), "h100")};
  QueueInput in;
  in.queues = {FlavorQueue("a", "c", "h100", 0),
               FlavorQueue("b", "c", "h100", 4, -1, /*lending_limit=*/1)};
  absl::StatusOr<ScheduleResult> r =
      Schedule({Queued("a", OfFlavor(Job("two", 2, kCuda, 0, 1), "h100")),
                Queued("a", OfFlavor(Job("one", 1, kCuda, 0, 2), "h100"))},
               workers, in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(FindPending(*r, "two").reason, PendingReason::kExceedsQueueLimit);
  EXPECT_EQ(FindPending(*r, "two").message,
            "needs 2 cuda (h100) slots, more than queue a's h100 quota with all its cohort could "
            "ever lend (1)");
  ASSERT_EQ(r->placements.size(), 1u) << Dump(*r);
  EXPECT_EQ(r->placements[0].job_id, "one");

  // While a borrows that one, a second waits; b's three it never lends fit
  // b at once.
  in.running = {RunningOn("ra", "a", 1, "h100")};
  r = Schedule({Queued("a", OfFlavor(Job("more", 1, kCuda, 0, 1), "h100")),
                Queued("b", OfFlavor(Job("own", 3, kCuda, 0, 2), "h100"))},
               workers, in);
  ASSERT_TRUE(r.ok());
  std::map<std::string, std::string> got = Outcome(*r);
  EXPECT_EQ(got["more"], "pending:quota_exceeded") << Dump(*r);
  EXPECT_THAT(FindPending(*r, "more").message,
              HasSubstr("queue a: 1 of 0 cuda (h100) used, cohort c: 1 of 1"));
  EXPECT_NE(got["own"].rfind("h:", 0), std::string::npos) << Dump(*r);
  EXPECT_TRUE(r->preemptions.empty()) << Dump(*r);
}

TEST(FlavorReclaimTest, AQueueReclaimsItsFlavorByPreemptingOnlyThatFlavorsBorrowers) {
  // a and b have 2 h100s each. b runs two 2-slot h100 jobs (borrowing a's
  // two) and a 2-slot a100 job (no a100 quota: borrows nothing). Every
  // slot is busy. a's h100 job within its nominal preempts b's younger
  // h100 job, and nothing else.
  std::vector<WorkerSlots> workers = {Flavored(Gpu("h", 0, 4), "h100"),
                                      Flavored(Gpu("x", 0, 2), "a100")};
  QueueInput in;
  in.queues = {FlavorQueue("a", "c", "h100", 2), FlavorQueue("b", "c", "h100", 2)};
  in.running = {RunningOn("old-h", "b", 2, "h100", 0, 1),
                RunningOn("young-h", "b", 2, "h100", 0, 3),
                RunningOn("young-a", "b", 2, "a100", -5, 9)};
  absl::StatusOr<ScheduleResult> r =
      Schedule({Queued("a", OfFlavor(Job("mine", 2), "h100"))}, workers, in);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->preemptions.size(), 1u) << Dump(*r);
  EXPECT_EQ(r->preemptions[0].victim_job_id, "young-h");
  EXPECT_EQ(r->preemptions[0].for_job_id, "mine");
  const PendingJobStatus& p = FindPending(*r, "mine");
  EXPECT_EQ(p.reason, PendingReason::kPreempting);
  EXPECT_THAT(p.message, HasSubstr("within its queue's nominal quota (queue a: 0 of 2 cuda (h100) "
                                   "used, cohort c: 4 of 4)"));
  EXPECT_THAT(p.message, HasSubstr("preempting young-h (queue b, priority 0, 2 slots)"));

  // b within its own nominal is no borrower: nothing to reclaim, a waits.
  in.running = {RunningOn("old-h", "b", 2, "h100", 0, 1)};
  workers[0] = Flavored(Gpu("h", 0, 2), "h100");
  r = Schedule({Queued("a", OfFlavor(Job("mine", 2), "h100"))}, workers, in);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->preemptions.empty()) << Dump(*r);
  EXPECT_EQ(FindPending(*r, "mine").reason, PendingReason::kInsufficientFreeSlots);

  // A job without a flavor reclaims nothing by flavor: a has no GPU quota.
  in.running = {RunningOn("old-h", "b", 2, "h100", 0, 1),
                RunningOn("young-h", "b", 2, "h100", 0, 3)};
  workers[0] = Flavored(Gpu("h", 0, 4), "h100");
  r = Schedule({Queued("a", Job("plain", 2))}, workers, in);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->preemptions.empty()) << Dump(*r);
}

TEST(FlavorReclaimTest, ALenderReclaimsWhatItLentBeyondWhatItKeeps) {
  // b lends 1 of its 4 h100s; a borrows it. b's job of 4 needs it back.
  std::vector<WorkerSlots> workers = {Flavored(Gpu("h", 3, 4), "h100")};
  QueueInput in;
  in.queues = {FlavorQueue("a", "c", "h100", 0),
               FlavorQueue("b", "c", "h100", 4, -1, /*lending_limit=*/1)};
  in.running = {RunningOn("borrowed", "a", 1, "h100")};
  absl::StatusOr<ScheduleResult> r =
      Schedule({Queued("b", OfFlavor(Job("all", 4), "h100"))}, workers, in);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->preemptions.size(), 1u) << Dump(*r);
  EXPECT_EQ(r->preemptions[0].victim_job_id, "borrowed");
  // Three fit within what b never lends: no preemption.
  r = Schedule({Queued("b", OfFlavor(Job("three", 3), "h100"))}, workers, in);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->preemptions.empty()) << Dump(*r);
  EXPECT_EQ(r->placements.size(), 1u) << Dump(*r);
}

TEST(FlavorQuotaTest, AnElasticJobGrowsOnlyWithinItsOwnFlavorNominal) {
  // Outside a pass (JobPlacer's growth check): one more h100 rank of a.
  QueueInput in;
  in.queues = {FlavorQueue("a", "c", "h100", 2), FlavorQueue("b", "c", "h100", 4)};
  std::vector<RunningJob> running = {RunningOn("r", "a", 1, "h100")};
  EXPECT_TRUE(QueueHasResourceRoom(in.queues, running, "a", 0, 0, "h100"));
  running[0].slots = 2;
  EXPECT_FALSE(QueueHasResourceRoom(in.queues, running, "a", 0, 0, "h100")) << "only by borrowing";
  EXPECT_TRUE(QueueHasResourceRoom(in.queues, running, "a", 0, 0, "a100")) << "no a100 quota";
  EXPECT_TRUE(QueueHasResourceRoom(in.queues, running, "a", 0, 0)) << "no flavor asked";
}

TEST(FlavorQuotaTest, MalformedFlavorLimitsAreRefusedNamingThem) {
  QueueInput in;
  in.queues = {FlavorQueue("a", "c", "h100", 2)};
  in.queues[0].lending_limit_gpu_flavors["h100"] = -2;
  absl::Status s = Schedule({}, {}, in).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("lending_limit_gpu_flavors[\"h100\"]"));
}

// Random cohorts with h100 quotas and limits, running jobs on h100 and
// a100, and flavored pending jobs: each placed job's queue stays within
// its nominal plus borrowing limit of its flavor; a cohort's lent use of
// a flavor ends at most at its nominal (or where running jobs had it);
// victims of a flavored job run on its flavor (no slot quotas here).
TEST(FlavorQuotaTest, RandomPassesKeepEveryCohortWithinItsFlavorQuota) {
  std::mt19937 rng(4802);
  const std::vector<std::string> flavors = {"a100", "h100"};
  int borrowing_placed = 0, preempted = 0;
  for (int round = 0; round < 400; ++round) {
    std::vector<WorkerSlots> workers;
    for (int w = 0; w < 1 + static_cast<int>(rng() % 4); ++w) {
      const int total = 1 + static_cast<int>(rng() % 4);
      workers.push_back(
          Flavored(Gpu(absl::StrCat("w", w), static_cast<int>(rng() % (total + 1)), total),
                   flavors[rng() % 2]));
    }
    QueueInput in;
    const int nq = 1 + static_cast<int>(rng() % 3);
    for (int q = 0; q < nq; ++q) {
      const std::string cohort = rng() % 4 == 0 ? "" : "c";
      if (rng() % 5 == 0) {
        in.queues.push_back(Queue(absl::StrCat("q", q), -1, -1, cohort));
        continue;
      }
      const int nominal = static_cast<int>(rng() % 5);
      in.queues.push_back(FlavorQueue(absl::StrCat("q", q), cohort, "h100", nominal,
                                      rng() % 2 ? static_cast<int>(rng() % 3) : -1,
                                      rng() % 2 ? static_cast<int>(rng() % (nominal + 1)) : -1));
    }
    for (int j = 0; j < static_cast<int>(rng() % 4); ++j) {
      in.running.push_back(RunningOn(absl::StrCat("r", j), absl::StrCat("q", rng() % nq),
                                     1 + static_cast<int>(rng() % 3), flavors[rng() % 2],
                                     static_cast<int>(rng() % 3), rng() % 10));
    }
    std::vector<PendingJob> jobs;
    for (int j = 0; j < 1 + static_cast<int>(rng() % 5); ++j) {
      jobs.push_back(Queued(absl::StrCat("q", rng() % nq),
                            OfFlavor(Job(absl::StrCat("j", j), 1 + static_cast<int>(rng() % 3),
                                         kCuda, static_cast<int>(rng() % 3), j),
                                     flavors[rng() % 2])));
    }
    absl::StatusOr<ScheduleResult> r = Schedule(jobs, workers, in);
    ASSERT_TRUE(r.ok()) << r.status();
    auto spec = [&](const std::string& name) -> const QueueSpec& {
      return *std::find_if(in.queues.begin(), in.queues.end(),
                           [&](const QueueSpec& q) { return q.name == name; });
    };
    auto value = [](const std::map<std::string, int>& m, long long absent) -> long long {
      auto it = m.find("h100");
      return it == m.end() ? absent : it->second;
    };
    // h100 used per queue, before and after the pass.
    std::map<std::string, long long> before, after;
    for (const RunningJob& run : in.running) {
      if (run.gpu_flavor == "h100") before[run.queue] += run.slots;
    }
    after = before;
    std::map<std::string, const PendingJob*> by_id;
    for (const PendingJob& job : jobs) by_id[job.job_id] = &job;
    for (const Placement& p : r->placements) {
      if (by_id[p.job_id]->gpu_flavor == "h100") after[by_id[p.job_id]->queue] += p.world_size;
    }
    for (const Placement& p : r->placements) {
      const PendingJob& job = *by_id[p.job_id];
      const QueueSpec& q = spec(job.queue);
      const long long nominal = value(q.nominal_gpu_flavors, -1);
      if (job.gpu_flavor != "h100" || nominal < 0) continue;
      const long long borrow = value(q.borrowing_limit_gpu_flavors, -1);
      if (borrow >= 0) {
        EXPECT_LE(after[job.queue], nominal + borrow) << Dump(*r);
      }
      if (q.cohort.empty()) {
        EXPECT_LE(after[job.queue], nominal) << Dump(*r);
      }
      if (after[job.queue] > nominal && before[job.queue] <= nominal) ++borrowing_placed;
    }
    // Each cohort (and each queue without one): lent use within nominal.
    std::map<std::string, std::vector<const QueueSpec*>> groups;
    for (const QueueSpec& q : in.queues) {
      if (value(q.nominal_gpu_flavors, -1) >= 0)
        groups[q.cohort.empty() ? "queue " + q.name : q.cohort].push_back(&q);
    }
    for (const auto& [group, members] : groups) {
      long long nominal = 0, lent_before = 0, lent_after = 0;
      for (const QueueSpec* q : members) {
        const long long n = value(q->nominal_gpu_flavors, -1);
        const long long lend = value(q->lending_limit_gpu_flavors, -1);
        const long long guaranteed = lend < 0 ? 0 : n - std::min(lend, n);
        nominal += n - guaranteed;
        lent_before += std::max(0LL, before[q->name] - guaranteed);
        lent_after += std::max(0LL, after[q->name] - guaranteed);
      }
      EXPECT_LE(lent_after, std::max(nominal, lent_before)) << group << "\n" << Dump(*r);
    }
    std::map<std::string, const RunningJob*> running;
    for (const RunningJob& run : in.running) running[run.job_id] = &run;
    for (const Preemption& p : r->preemptions) {
      EXPECT_EQ(running[p.victim_job_id]->gpu_flavor, by_id[p.for_job_id]->gpu_flavor) << Dump(*r);
      ++preempted;
    }
  }
  // The rounds reach both rules (a change of seed that loses them fails).
  EXPECT_GT(borrowing_placed, 0);
  EXPECT_GT(preempted, 0);
}

}  // namespace
}  // namespace trainctl::scheduler
