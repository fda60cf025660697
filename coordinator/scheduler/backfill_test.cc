// Backfill by runtime (scheduler.h): a later job whose runtime bound ends
// before the blocked head could start may take the head's reserved slots;
// without bounds, or with a longer one, it waits as before.
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "coordinator/scheduler/scheduler.h"
#include "coordinator/scheduler/scheduler_test_support.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl::scheduler {
namespace {

using ::testing::HasSubstr;

constexpr double kNoBound = std::numeric_limits<double>::infinity();

PendingJob Bounded(PendingJob job, double bound_s) {
  job.runtime_bound_s = bound_s;
  return job;
}

WorkerSlots WithBusy(WorkerSlots w, std::vector<WorkerSlots::Busy> busy) {
  w.busy = std::move(busy);
  return w;
}

// One 4-GPU worker: 2 free, 2 busy until `busy_s`. The head needs 4: it
// holds the 2 free ones until the busy ones end.
std::vector<WorkerSlots> HalfBusy(double busy_s) {
  return {WithBusy(Gpu("a", 2, 4), {{2, busy_s}})};
}

TEST(BackfillTest, AJobThatEndsBeforeTheHeadCouldStartTakesItsReservedSlots) {
  auto r = Check({Job("head", 4, kCuda, 0, 1), Bounded(Job("short", 2, kCuda, 0, 2), 60)},
                 HalfBusy(100));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r), (std::map<std::string, std::string>{
                             {"head", "pending:insufficient_free_slots"}, {"short", "a:0,1"}}))
      << Dump(*r);
  ASSERT_EQ(r->placements.size(), 1u);
  EXPECT_EQ(r->placements[0].backfilled_before, "head");
}

TEST(BackfillTest, ALongerOrUnboundedJobWaitsAndIsToldTheBoundThatWouldFit) {
  auto r = Check({Job("head", 4, kCuda, 0, 1), Bounded(Job("long", 2, kCuda, 0, 2), 101),
                  Job("open", 2, kCuda, 0, 3)},
                 HalfBusy(100));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r),
            (std::map<std::string, std::string>{{"head", "pending:insufficient_free_slots"},
                                                {"long", "pending:blocked_by_reservation"},
                                                {"open", "pending:blocked_by_reservation"}}))
      << Dump(*r);
  EXPECT_THAT(FindPending(*r, "open").message,
              HasSubstr("at most 100 s would let it start now (backfill)"));
}

TEST(BackfillTest, ExactlyAtTheShadowTimeFits) {
  auto r = Check({Job("head", 4, kCuda, 0, 1), Bounded(Job("edge", 2, kCuda, 0, 2), 100)},
                 HalfBusy(100));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r).at("edge"), "a:0,1") << Dump(*r);
}

TEST(BackfillTest, BusySlotsWithoutABoundNeverDateTheReservation) {
  // The busy slots are not listed (or listed without bound): the head's
  // start cannot be dated, so nothing backfills, as before bounds existed.
  for (const std::vector<WorkerSlots>& workers :
       {std::vector<WorkerSlots>{Gpu("a", 2, 4)}, HalfBusy(kNoBound),
        std::vector<WorkerSlots>{WithBusy(Gpu("a", 2, 4), {{1, 10}})}}) {
    auto r =
        Check({Job("head", 4, kCuda, 0, 1), Bounded(Job("short", 2, kCuda, 0, 2), 1)}, workers);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(Outcome(*r).at("short"), "pending:blocked_by_reservation") << Dump(*r);
    EXPECT_THAT(FindPending(*r, "short").message, ::testing::Not(HasSubstr("backfill")));
  }
}

TEST(BackfillTest, TheHeadWaitsForItsLastNeededSlotNotItsFirst) {
  // The head needs 3 more than are free: slots end at 10, 50 and 200 s, so
  // it can start at 200 s. A 150 s job fits before that; a 300 s one does not.
  std::vector<WorkerSlots> workers = {WithBusy(Gpu("a", 1, 4), {{1, 200}, {1, 10}, {1, 50}})};
  auto r = Check({Job("head", 4, kCuda, 0, 1), Bounded(Job("mid", 1, kCuda, 0, 2), 150),
                  Bounded(Job("late", 1, kCuda, 0, 3), 300)},
                 workers);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r),
            (std::map<std::string, std::string>{{"head", "pending:insufficient_free_slots"},
                                                {"mid", "a:0"},
                                                {"late", "pending:insufficient_free_slots"}}))
      << Dump(*r);
}

TEST(BackfillTest, AnOverLongBusyListIsReadAsLateAsItCanBe) {
  // 2 busy slots, 3 listed: the longest two count (100 and 50), so the
  // head's start is 100 s, not 50.
  std::vector<WorkerSlots> workers = {WithBusy(Gpu("a", 2, 4), {{1, 5}, {1, 50}, {1, 100}})};
  auto r = Check({Job("head", 4, kCuda, 0, 1), Bounded(Job("j", 2, kCuda, 0, 2), 80)}, workers);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r).at("j"), "a:0,1") << Dump(*r);
  r = Check({Job("head", 4, kCuda, 0, 1), Bounded(Job("j", 2, kCuda, 0, 2), 101)}, workers);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r).at("j"), "pending:blocked_by_reservation") << Dump(*r);
}

TEST(BackfillTest, AJobWithResourcesDoesNotBackfill) {
  // Reservations of jobs with resources hold CPUs and memory too: not in
  // whole slots, so neither such a job nor such a head backfills.
  std::vector<WorkerSlots> workers = {WithBusy(Sized(Gpu("a", 2, 4), 8, 0), {{2, 100}})};
  auto r = Check({Job("head", 4, kCuda, 0, 1), Bounded(Needs(Job("j", 2, kCuda, 0, 2), 1), 10)},
                 workers);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r).at("j"), "pending:blocked_by_reservation") << Dump(*r);
  r = Check({Needs(Job("head", 4, kCuda, 0, 1), 1), Bounded(Job("j", 2, kCuda, 0, 2), 10)},
            workers);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r).at("j"), "pending:blocked_by_reservation") << Dump(*r);
}

TEST(BackfillTest, APlacementInThePassCountsWithItsOwnBound) {
  // `first` (priority 1) takes one of a's 3 free GPUs before the head, which
  // then holds the other 2 and needs both busy ones: the one busy for 100 s
  // and `first`'s. Bounded at 500 s, `first` dates the head at 500 s and a
  // 300 s job backfills; unbounded, the head cannot be dated.
  std::vector<WorkerSlots> workers = {WithBusy(Gpu("a", 3, 4), {{1, 100}})};
  auto r = Check({Bounded(Job("first", 1, kCuda, 1, 1), 500), Job("head", 4, kCuda, 0, 2),
                  Bounded(Job("j", 1, kCuda, 0, 3), 300)},
                 workers);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r),
            (std::map<std::string, std::string>{
                {"first", "a:0"}, {"head", "pending:insufficient_free_slots"}, {"j", "a:1"}}))
      << Dump(*r);
  r = Check({Job("first", 1, kCuda, 1, 1), Job("head", 4, kCuda, 0, 2),
             Bounded(Job("j", 1, kCuda, 0, 3), 300)},
            workers);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r).at("j"), "pending:blocked_by_reservation") << Dump(*r);
}

TEST(BackfillTest, RefusesAMalformedBoundNamingTheField) {
  auto r = Schedule({Bounded(Job("j", 1), -1)}, {Gpu("a", 1)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("runtime_bound_s"));
  r = Schedule({Job("j", 1)}, {WithBusy(Gpu("a", 1, 2), {{1, -5}})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("busy"));
}

}  // namespace
}  // namespace trainctl::scheduler
