#include "coordinator/scheduler/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/scheduler/quota.h"
#include "coordinator/scheduler/scheduler_test_support.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl::scheduler {
namespace {

using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// Table-driven placement cases.

struct Case {
  std::string name;
  std::vector<WorkerSlots> workers;
  std::vector<PendingJob> jobs;
  std::map<std::string, std::string> want;  // job id -> Layout or "pending:reason"
};

std::vector<Case> PlacementCases() {
  return {
      {"single worker fits", {Gpu("a", 4)}, {Job("j", 2)}, {{"j", "a:0,1"}}},
      {"whole worker", {Gpu("a", 4)}, {Job("j", 4)}, {{"j", "a:0,1,2,3"}}},
      {"lowest free indices",
       {Worker("a", SlotKind::kGpu, {7, 3, 5, 1}, 8)},
       {Job("j", 3)},
       {{"j", "a:1,3,5"}}},
      {"prefers one worker over splitting",
       {Gpu("a", 2), Gpu("b", 2), Gpu("c", 4)},
       {Job("j", 4)},
       {{"j", "c:0,1,2,3"}}},
      {"best fit picks the tightest worker",
       {Gpu("a", 8), Gpu("b", 3), Gpu("c", 5), Gpu("d", 2)},
       {Job("j", 3)},
       {{"j", "b:0,1,2"}}},
      {"best fit tie broken by worker id",
       {Gpu("z", 4), Gpu("m", 4), Gpu("q", 4)},
       {Job("j", 3)},
       {{"j", "m:0,1,2"}}},
      {"split across workers, largest block first",
       {Gpu("a", 3), Gpu("b", 5)},
       {Job("j", 7)},
       {{"j", "b:0,1,2,3,4 a:0,1"}}},
      {"split: remainder on the tightest worker",
       {Gpu("a", 8), Gpu("b", 4), Gpu("c", 2)},
       {Job("j", 10)},
       {{"j", "a:0,1,2,3,4,5,6,7 c:0,1"}}},
      {"split: equal blocks by worker id",
       {Gpu("c", 2), Gpu("b", 2), Gpu("a", 2)},
       {Job("j", 5)},
       {{"j", "a:0,1 b:0,1 c:0"}}},
      {"fragmentation: enough in total but spread",
       {Worker("a", SlotKind::kGpu, {1}, 8), Worker("b", SlotKind::kGpu, {0, 6}, 8),
        Worker("c", SlotKind::kGpu, {2}, 8), Worker("d", SlotKind::kGpu, {5}, 8)},
       {Job("j", 4)},
       {{"j", "b:0,6 a:1 c:2"}}},
      {"gang: all or nothing",
       {Gpu("a", 2), Gpu("b", 1, 4)},
       {Job("j", 4)},
       {{"j", "pending:insufficient_free_slots"}}},
      {"placements consume slots as they go",
       {Gpu("a", 4), Gpu("b", 2)},
       {Job("j1", 2, kCuda, 0, 1), Job("j2", 2, kCuda, 0, 2), Job("j3", 2, kCuda, 0, 3),
        Job("j4", 1, kCuda, 0, 4)},
       {{"j1", "b:0,1"},
        {"j2", "a:0,1"},
        {"j3", "a:2,3"},
        {"j4", "pending:insufficient_free_slots"}}},
      {"priority: higher first",
       {Gpu("a", 4)},
       {Job("low", 4, kCuda, 0, 1), Job("high", 4, kCuda, 5, 2)},
       {{"high", "a:0,1,2,3"}, {"low", "pending:insufficient_free_slots"}}},
      {"FIFO within a priority",
       {Gpu("a", 4)},
       {Job("second", 3, kCuda, 1, 8), Job("first", 3, kCuda, 1, 7)},
       {{"first", "a:0,1,2"}, {"second", "pending:insufficient_free_slots"}}},
      {"cuda on a cpu-only cluster",
       {Cpu("c1", 8)},
       {Job("j", 1, kCuda)},
       {{"j", "pending:no_worker_of_kind"}}},
      {"cpu job never on GPU slots",
       {Gpu("g", 8), Cpu("c", 2)},
       {Job("j", 2, kCpu), Job("k", 1, kCpu)},
       {{"j", "c:0,1"}, {"k", "pending:insufficient_free_slots"}}},
      {"cpu job on a GPU-only cluster",
       {Gpu("g", 8)},
       {Job("j", 1, kCpu)},
       {{"j", "pending:no_worker_of_kind"}}},
      {"auto takes GPUs when the cluster has any",
       {Cpu("c", 8), Gpu("g", 2)},
       {Job("j", 2, kAuto)},
       {{"j", "g:0,1"}}},
      {"auto waits for busy GPUs instead of falling back to CPU",
       {Cpu("c", 8), Gpu("g", 0, 2)},
       {Job("j", 2, kAuto)},
       {{"j", "pending:insufficient_free_slots"}}},
      {"auto on a cpu-only cluster", {Cpu("c", 4)}, {Job("j", 3, kAuto)}, {{"j", "c:0,1,2"}}},
      {"auto ignores dead GPU workers",
       {Cpu("c", 4), Worker("g", SlotKind::kGpu, {0, 1}, 2, /*schedulable=*/false)},
       {Job("j", 2, kAuto)},
       {{"j", "c:0,1"}}},
      {"dead workers ignored",
       {Worker("dead", SlotKind::kGpu, {0, 1, 2, 3}, 4, false), Gpu("live", 2)},
       {Job("j", 2), Job("k", 3)},
       {{"j", "live:0,1"}, {"k", "pending:exceeds_capacity"}}},
      {"no workers at all",
       {},
       {Job("j", 1, kAuto), Job("k", 1, kCpu)},
       {{"j", "pending:no_worker_of_kind"}, {"k", "pending:no_worker_of_kind"}}},
      {"never fits does not block others",
       {Gpu("a", 4), Gpu("b", 4)},
       {Job("huge", 9, kCuda, 9, 1), Job("small", 2, kCuda, 0, 2)},
       {{"huge", "pending:exceeds_capacity"}, {"small", "a:0,1"}}},
      {"invalid world size does not block others",
       {Gpu("a", 4)},
       {Job("zero", 0, kCuda, 9, 1), Job("ok", 1, kCuda, 0, 2)},
       {{"zero", "pending:invalid_job"}, {"ok", "a:0"}}},
      {"blocked head on one kind does not block the other kind",
       {Gpu("g", 1, 8), Cpu("c", 4)},
       {Job("gpu-big", 8, kCuda, 5, 1), Job("cpu", 4, kCpu, 0, 2)},
       {{"gpu-big", "pending:insufficient_free_slots"}, {"cpu", "c:0,1,2,3"}}},
      {"zero-slot worker is no capacity",
       {Gpu("a", 0, 0)},
       {Job("j", 1)},
       {{"j", "pending:no_worker_of_kind"}}},
  };
}

TEST(SchedulerTest, PlacementTable) {
  for (const Case& c : PlacementCases()) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<ScheduleResult> result = Check(c.jobs, c.workers);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(Outcome(*result), c.want) << Dump(*result);
  }
}

TEST(SchedulerTest, RanksNodesAndLocalRanks) {
  // 7 ranks: 5 on b (node 0), 2 on a (node 1).
  absl::StatusOr<ScheduleResult> result = Check({Job("j", 7)}, {Gpu("a", 3), Gpu("b", 5)});
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result->placements.size(), 1u);
  const Placement& p = result->placements[0];
  EXPECT_EQ(p.num_nodes, 2);
  EXPECT_EQ(p.kind, SlotKind::kGpu);
  const std::vector<std::tuple<int, std::string, int, int, int, int>> want = {
      // rank, worker, slot, local_rank, local_world_size, node_rank
      {0, "b", 0, 0, 5, 0}, {1, "b", 1, 1, 5, 0}, {2, "b", 2, 2, 5, 0}, {3, "b", 3, 3, 5, 0},
      {4, "b", 4, 4, 5, 0}, {5, "a", 0, 0, 2, 1}, {6, "a", 1, 1, 2, 1},
  };
  ASSERT_EQ(p.ranks.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const RankAssignment& r = p.ranks[i];
    EXPECT_EQ(
        std::make_tuple(r.rank, r.worker_id, r.slot, r.local_rank, r.local_world_size, r.node_rank),
        want[i]);
  }
}

// ---------------------------------------------------------------------------
// Reasons a person reads.

// ---------------------------------------------------------------------------
// Reservation (no starvation of a large job at the head).

TEST(SchedulerTest, HeadReservesItsTargetWorkerAndOthersBackfill) {
  // big needs 6 and 5 GPUs are free. a and b could each hold it; a has more
  // free (3 vs 2), so a is the target and all its free GPUs are held. b and c
  // stay open for small jobs behind it.
  std::vector<WorkerSlots> workers = {Gpu("a", 3, 8), Gpu("b", 2, 8), Gpu("c", 0, 4)};
  std::vector<PendingJob> jobs = {Job("big", 6, kCuda, 0, 1), Job("s1", 1, kCuda, 0, 2),
                                  Job("s2", 2, kCuda, 0, 3), Job("s3", 1, kCuda, 0, 4)};
  auto r = Check(jobs, workers);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r),
            (std::map<std::string, std::string>{{"big", "pending:insufficient_free_slots"},
                                                {"s1", "b:0"},
                                                {"s2", "pending:blocked_by_reservation"},
                                                {"s3", "b:1"}}))
      << Dump(*r);
  const PendingJobStatus& big = FindPending(*r, "big");
  ASSERT_EQ(big.reserved_slots.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(big.reserved_slots[i].worker_id, "a");
    EXPECT_EQ(big.reserved_slots[i].slot, i);
  }
  EXPECT_THAT(big.message,
              HasSubstr("needs 6 cuda slots, 5 of 20 free on 3 workers; first in line, holds 3"));
  EXPECT_EQ(FindPending(*r, "s2").blocked_by, "big");
}

TEST(SchedulerTest, MultiWorkerHeadReservesItsShareOnEachTarget) {
  // big needs 12 of 11 free on 8-GPU workers: targets a (8) and b (the
  // remainder 4; tightest by total, ties by id). b's GPUs beyond its share of
  // 4 and all of c stay open for backfill.
  std::vector<WorkerSlots> workers = {Gpu("a", 4, 8), Gpu("b", 6, 8), Gpu("c", 1, 8)};
  std::vector<PendingJob> jobs = {Job("big", 12, kCuda, 0, 1), Job("s1", 2, kCuda, 0, 2),
                                  Job("s2", 3, kCuda, 0, 3), Job("s3", 1, kCuda, 0, 4)};
  auto r = Check(jobs, workers);
  ASSERT_TRUE(r.ok());
  const PendingJobStatus& big = FindPending(*r, "big");
  std::vector<std::string> reserved;
  for (const SlotRef& s : big.reserved_slots) reserved.push_back(absl::StrCat(s.worker_id, s.slot));
  EXPECT_EQ(reserved, (std::vector<std::string>{"a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"}));
  EXPECT_EQ(Outcome(*r),
            (std::map<std::string, std::string>{{"big", "pending:insufficient_free_slots"},
                                                {"s1", "b:4,5"},
                                                {"s2", "pending:blocked_by_reservation"},
                                                {"s3", "c:0"}}))
      << Dump(*r);
}

TEST(SchedulerTest, OnlyTheHeadReserves) {
  // big1 holds a; big2 (also blocked) reserves nothing; small fits on b.
  auto r = Check(
      {Job("big1", 4, kCuda, 0, 1), Job("big2", 4, kCuda, 0, 2), Job("small", 1, kCuda, 0, 3)},
      {Gpu("a", 2, 4), Gpu("b", 1, 4)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r),
            (std::map<std::string, std::string>{{"big1", "pending:insufficient_free_slots"},
                                                {"big2", "pending:insufficient_free_slots"},
                                                {"small", "b:0"}}))
      << Dump(*r);
  EXPECT_EQ(FindPending(*r, "big1").reserved_slots.size(), 2u);
  EXPECT_TRUE(FindPending(*r, "big2").reserved_slots.empty());
  EXPECT_EQ(FindPending(*r, "big2").blocked_by, "big1");
}

int StartedBefore(const SimResult& sim, const std::string& prefix, int tick) {
  int n = 0;
  for (const auto& [id, t] : sim.start_tick) n += id.rfind(prefix, 0) == 0 && t < tick;
  return n;
}

// Starvation scenario: every slot starts busy (ending at staggered ticks
// up to 20), a big job is queued first, and behind it `per_tick` small jobs
// arrive every tick for 60 ticks, more than the cluster can run. Without a
// reservation each slot the big job cannot use at once goes to the next small
// job, and it would wait until the stream stops and the backlog drains.
SimResult RunStream(int num_workers, int slots_per_worker, int big_size, int small_size,
                    int per_tick) {
  std::vector<WorkerSlots> workers;
  BusyUntil busy;
  for (int w = 0; w < num_workers; ++w) {
    const std::string id(1, static_cast<char>('a' + w));
    workers.push_back(Gpu(id, 0, slots_per_worker));
    for (int s = 0; s < slots_per_worker; ++s) busy[{id, s}] = 1 + (s * 7 + w * 3) % 20;
  }
  std::vector<SimJob> jobs;
  std::uint64_t seq = 0;
  jobs.push_back({Job("big", big_size, kCuda, 0, seq++), 0, 10});
  for (int t = 0; t < 60; ++t) {
    for (int k = 0; k < per_tick; ++k) {
      jobs.push_back(
          {Job(absl::StrCat("small-", 1000 + seq), small_size, kCuda, 0, seq), t, 4 + k});
      ++seq;
    }
  }
  SimResult sim = Simulate(workers, jobs, 2000, busy);
  EXPECT_EQ(sim.start_tick.size(), jobs.size()) << "every job eventually ran";
  return sim;
}

TEST(SchedulerTest, BigJobAtHeadIsNotStarvedByAStreamOfSmallOnes) {
  // Three 8-GPU workers; an 8-GPU job; five 1-GPU jobs a tick.
  SimResult sim = RunStream(3, 8, 8, 1, 5);
  ASSERT_TRUE(sim.start_tick.count("big"));
  // Its target worker drains as the initial load ends (by tick 20; it starts
  // at 10). Without the reservation it starts only after the stream stops
  // (tick 83).
  EXPECT_LE(sim.start_tick["big"], 20);
  // Small jobs kept running meanwhile on slots the big job did not hold.
  EXPECT_GT(StartedBefore(sim, "small-", sim.start_tick["big"]), 5);
}

TEST(SchedulerTest, MultiWorkerHeadIsNotStarved) {
  // Four 4-GPU workers; a 6-GPU job (targets a:4 + b:2); four 1-GPU jobs a tick.
  SimResult sim = RunStream(4, 4, 6, 1, 4);
  ASSERT_TRUE(sim.start_tick.count("big"));
  // It starts at 8; without the reservation at 90.
  EXPECT_LE(sim.start_tick["big"], 20);
  EXPECT_GT(StartedBefore(sim, "small-", sim.start_tick["big"]), 2);
}

// ---------------------------------------------------------------------------
// Input handling.

WorkerSlots NegativeTotal() {
  WorkerSlots w = Gpu("a", 0);
  w.total_slots = -1;
  return w;
}

TEST(SchedulerTest, RejectsMalformedInput) {
  struct Bad {
    std::string name;
    std::vector<PendingJob> jobs;
    std::vector<WorkerSlots> workers;
    std::string field;
  };
  const std::vector<Bad> cases = {
      {"duplicate job", {Job("j", 1), Job("j", 2)}, {Gpu("a", 4)}, "job_id: duplicate"},
      {"empty job id", {Job("", 1)}, {Gpu("a", 4)}, "job_id: empty"},
      {"duplicate worker", {}, {Gpu("a", 4), Cpu("a", 4)}, "worker_id: duplicate"},
      {"empty worker id", {}, {Gpu("", 4)}, "worker_id: empty"},
      {"duplicate slot", {}, {Worker("a", SlotKind::kGpu, {1, 1}, 4)}, "duplicate index 1"},
      {"negative slot", {}, {Worker("a", SlotKind::kGpu, {-1}, 4)}, "negative index -1"},
      {"more free than total", {}, {Worker("a", SlotKind::kGpu, {0, 1, 2}, 2)}, "total_slots is 2"},
      {"negative total", {}, {NegativeTotal()}, "total_slots: must be >= 0"},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<ScheduleResult> r = Schedule(c.jobs, c.workers);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.field));
  }
}

TEST(SchedulerTest, EmptyInput) {
  auto r = Check({}, {});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->placements.empty());
  EXPECT_TRUE(r->pending.empty());
}

// Rank 0 moves to the node whose worker holds the checkpoint; every node
// keeps its slots and ranks stay contiguous per node.
TEST(PreferNodeZeroTest, MovesThePreferredNodeFirstAndRenumbers) {
  Placement p;
  p.job_id = "j";
  p.world_size = 5;
  p.num_nodes = 3;
  auto add = [&](int rank, const std::string& w, int slot, int local, int lws, int node) {
    RankAssignment r;
    r.rank = rank;
    r.worker_id = w;
    r.slot = slot;
    r.local_rank = local;
    r.local_world_size = lws;
    r.node_rank = node;
    p.ranks.push_back(r);
  };
  add(0, "a", 0, 0, 2, 0);
  add(1, "a", 1, 1, 2, 0);
  add(2, "b", 3, 0, 1, 1);
  add(3, "c", 0, 0, 2, 2);
  add(4, "c", 5, 1, 2, 2);

  Placement same = p;
  EXPECT_FALSE(PreferNodeZero(same, [](const std::string& w) { return w == "zz"; }));
  EXPECT_EQ(same.ranks[0].worker_id, "a");
  EXPECT_TRUE(PreferNodeZero(same, [](const std::string& w) { return w == "a"; }));
  EXPECT_EQ(same.ranks[2].worker_id, "b");

  ASSERT_TRUE(PreferNodeZero(p, [](const std::string& w) { return w == "c"; }));
  ASSERT_EQ(p.ranks.size(), 5u);
  std::vector<std::string> workers;
  for (size_t i = 0; i < p.ranks.size(); ++i) {
    EXPECT_EQ(p.ranks[i].rank, static_cast<int>(i));
    workers.push_back(p.ranks[i].worker_id);
  }
  EXPECT_EQ(workers, (std::vector<std::string>{"c", "c", "a", "a", "b"}));
  EXPECT_EQ(p.ranks[0].node_rank, 0);
  EXPECT_EQ(p.ranks[1].slot, 5);
  EXPECT_EQ(p.ranks[1].local_rank, 1);
  EXPECT_EQ(p.ranks[2].node_rank, 1);
  EXPECT_EQ(p.ranks[4].node_rank, 2);
  EXPECT_EQ(p.ranks[4].slot, 3);
}

}  // namespace
}  // namespace trainctl::scheduler

namespace trainctl::scheduler {
namespace {

PendingJob Elastic(std::string id, int world_size, int min_world_size, std::uint64_t seq = 0) {
  PendingJob j = Job(std::move(id), world_size, DeviceRequirement::kCpu, 0, seq);
  j.min_world_size = min_world_size;
  return j;
}

// An elastic job takes world_size slots when they are free, else what is
// free down to its minimum; below that it waits and reserves its minimum.
TEST(SchedulerTest, ElasticJobTakesWhatIsFreeDownToItsMinimum) {
  auto full = Check({Elastic("e", 3, 2)}, {Cpu("a", 1), Cpu("b", 1), Cpu("c", 1)});
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(Outcome(*full), (std::map<std::string, std::string>{{"e", "a:0 b:0 c:0"}}))
      << Dump(*full);

  auto two = Check({Elastic("e", 3, 2)}, {Cpu("a", 1), Cpu("b", 1), Cpu("c", 0, 1)});
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(Outcome(*two), (std::map<std::string, std::string>{{"e", "a:0 b:0"}})) << Dump(*two);
  ASSERT_EQ(two->placements.size(), 1u);
  EXPECT_EQ(two->placements[0].world_size, 2);

  // One free slot: below the minimum; it waits, holds what is free, and a
  // plain job behind it does not take that slot.
  auto one = Check({Elastic("e", 3, 2, 1), Job("p", 1, DeviceRequirement::kCpu, 0, 2)},
                   {Cpu("a", 1), Cpu("b", 0, 1), Cpu("c", 0, 1)});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(Outcome(*one),
            (std::map<std::string, std::string>{{"e", "pending:insufficient_free_slots"},
                                                {"p", "pending:blocked_by_reservation"}}))
      << Dump(*one);
  EXPECT_THAT(FindPending(*one, "e").message,
              HasSubstr("needs at least 2 (elastic, up to 3) cpu slots"));

  // Capacity below the minimum never fits; at the minimum it does.
  auto small = Check({Elastic("e", 4, 3)}, {Cpu("a", 2)});
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(Outcome(*small),
            (std::map<std::string, std::string>{{"e", "pending:exceeds_capacity"}}));
  auto enough = Check({Elastic("e", 4, 2)}, {Cpu("a", 2)});
  ASSERT_TRUE(enough.ok());
  EXPECT_EQ(Outcome(*enough), (std::map<std::string, std::string>{{"e", "a:0,1"}}))
      << Dump(*enough);
}

}  // namespace
}  // namespace trainctl::scheduler

// ---------------------------------------------------------------------------
// Queues, quotas, cohorts, fair share and preemption.

namespace trainctl::scheduler {
namespace {

using ::testing::HasSubstr;

const PendingJobStatus& PendingOf(const ScheduleResult& r, const std::string& id) {
  for (const PendingJobStatus& p : r.pending) {
    if (p.job_id == id) return p;
  }
  ADD_FAILURE() << id << " is not pending";
  static const PendingJobStatus none;
  return none;
}

std::vector<std::string> Victims(const ScheduleResult& r) {
  std::vector<std::string> out;
  for (const Preemption& p : r.preemptions) out.push_back(p.victim_job_id + ">" + p.for_job_id);
  return out;
}

std::vector<std::string> PlacementOrder(const ScheduleResult& r) {
  std::vector<std::string> out;
  for (const Placement& p : r.placements) out.push_back(p.job_id);
  return out;
}

using Outcomes = std::map<std::string, std::string>;

TEST(SchedulerQueueTest, WithoutQueuesQueueNamesAndRunningJobsChangeNothing) {
  std::vector<PendingJob> jobs = {Queued("a", Job("j1", 4, kCuda, 0, 1)),
                                  Queued("nope", Job("j2", 2, kCuda, 1, 2)),
                                  Job("j3", 8, kCuda, 0, 3)};
  std::vector<WorkerSlots> workers = {Gpu("g1", 3, 4), Gpu("g2", 4)};
  QueueInput input;
  input.running = {Running("r1", "a", 1, 9), Running("r2", "zzz", 4, -1, 5, SlotKind::kGpu, true)};
  auto plain = Check(jobs, workers);
  auto with = CheckQ(jobs, workers, input);
  ASSERT_TRUE(plain.ok() && with.ok());
  EXPECT_EQ(Dump(*with), Dump(*plain));
  EXPECT_TRUE(with->preemptions.empty());
}

// The worked example of issue #26: two teams in one cohort on 2 workers x 2
// GPUs. B borrows A's idle quota for a 4-rank job; A submits 2 ranks within
// its nominal quota; B's job is preempted for it; once B's job is gone, A's
// job starts and B's job, back in the queue, waits for quota.
TEST(SchedulerQueueTest, WorkedExampleReclaimsBorrowedQuotaByPreemption) {
  QueueInput input;
  input.queues = {Queue("A", 2, -1, "c"), Queue("B", 2, -1, "c")};
  std::vector<PendingJob> jobs = {Queued("A", Job("a-job", 2, kCuda, 0, 10))};

  // Pass 1: B's job runs on all 4 GPUs (borrowing 2 of A's). A's job is
  // within A's nominal quota: B's job is picked.
  input.running = {Running("b-job", "B", 4, 0, 1)};
  std::vector<WorkerSlots> busy = {Gpu("w1", 0, 2), Gpu("w2", 0, 2)};
  auto r1 = CheckQ(jobs, busy, input);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(Victims(*r1), std::vector<std::string>{"b-job>a-job"});
  const PendingJobStatus& a1 = PendingOf(*r1, "a-job");
  EXPECT_EQ(a1.reason, PendingReason::kPreempting);
  EXPECT_THAT(a1.message, HasSubstr("within its queue's nominal quota (queue A: 0 of 2 cuda used, "
                                    "cohort c: 4 of 4)"));
  EXPECT_THAT(a1.message, HasSubstr("preempting b-job (queue B, priority 0, 4 slots)"));

  // Pass 2: the caller asked b-job to stop; it still holds its slots. A's
  // job waits for it; nothing more is preempted.
  input.running[0].stopping = true;
  auto r2 = CheckQ(jobs, busy, input);
  ASSERT_TRUE(r2.ok());
  EXPECT_TRUE(r2->preemptions.empty());
  EXPECT_EQ(PendingOf(*r2, "a-job").reason, PendingReason::kPreempting);
  EXPECT_THAT(PendingOf(*r2, "a-job").message,
              HasSubstr("waiting for stopping jobs b-job to free their slots"));

  // Pass 3: b-job checkpointed and exited: it is pending again. A's job
  // starts; B's job is over what the cohort has idle now.
  input.running.clear();
  jobs.push_back(Queued("B", Job("b-job", 4, kCuda, 0, 1)));
  auto r3 = CheckQ(jobs, {Gpu("w1", 2), Gpu("w2", 2)}, input);
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(Outcome(*r3), (Outcomes{{"a-job", "w1:0,1"}, {"b-job", "pending:quota_exceeded"}}))
      << Dump(*r3);
  EXPECT_TRUE(r3->preemptions.empty());
  EXPECT_THAT(PendingOf(*r3, "b-job").message,
              HasSubstr("queue B: 0 of 2 cuda used, cohort c: 2 of 4"));
}

TEST(SchedulerQueueTest, QuotaBlockedJobHoldsNoReservationAndBlocksNobody) {
  QueueInput input;
  input.queues = {Queue("A", 2), Queue("U", -1)};
  input.running = {Running("a-running", "A", 1)};
  // A has 1 of 2 in use: its 2-rank job is over quota (of the running job's
  // priority, so it does not preempt it), its 1-rank job fits.
  auto r =
      CheckQ({Queued("A", Job("a-big", 2, kCuda, 0, 1)),
              Queued("A", Job("a-small", 1, kCuda, 0, 2)), Queued("U", Job("u", 3, kCuda, 0, 3))},
             {Gpu("w", 4)}, input);
  ASSERT_TRUE(r.ok()) << r.status();
  // Both shares are 0: U, holding fewer slots, goes first.
  EXPECT_EQ(Outcome(*r),
            (Outcomes{{"a-big", "pending:quota_exceeded"}, {"a-small", "w:3"}, {"u", "w:0,1,2"}}))
      << Dump(*r);
  EXPECT_TRUE(PendingOf(*r, "a-big").reserved_slots.empty());
  EXPECT_THAT(PendingOf(*r, "a-big").message,
              HasSubstr("more than its queue's quota admits now (queue A: 1 of 2 cuda used)"));
}

TEST(SchedulerQueueTest, AFullQueueMakesRoomByPreemptingItsOwnLowerPriorityJobs) {
  QueueInput input;
  input.queues = {Queue("A", 2)};
  input.running = {Running("low-old", "A", 1, 0, 1), Running("low-young", "A", 1, 0, 2)};
  // A's quota is full of priority-0 jobs and 2 slots are free: a priority-5
  // job of 1 rank preempts the youngest one (never borrowing through it).
  auto r = CheckQ({Queued("A", Job("high", 1, kCuda, 5, 3))}, {Gpu("w", 4)}, input);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r), (Outcomes{{"high", "pending:preempting"}})) << Dump(*r);
  ASSERT_EQ(r->preemptions.size(), 1u);
  EXPECT_EQ(r->preemptions[0].victim_job_id, "low-young");
  // Of the same priority: no preemption, it waits for quota.
  auto same = CheckQ({Queued("A", Job("same", 1, kCuda, 0, 3))}, {Gpu("w", 4)}, input);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(Outcome(*same), (Outcomes{{"same", "pending:quota_exceeded"}}));
  EXPECT_TRUE(same->preemptions.empty());
  // Larger than the whole nominal once the lower jobs are gone: none picked.
  input.running = {Running("low", "A", 1, 0, 1), Running("peer", "A", 1, 5, 2)};
  auto big = CheckQ({Queued("A", Job("big", 2, kCuda, 5, 3))}, {Gpu("w", 4)}, input);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(Outcome(*big), (Outcomes{{"big", "pending:quota_exceeded"}}));
  EXPECT_TRUE(big->preemptions.empty());
}

TEST(SchedulerQueueTest, CohortLendsIdleQuotaWithoutLendingItTwice) {
  QueueInput input;
  input.queues = {Queue("A", 2, -1, "c"), Queue("B", 2, -1, "c"), Queue("C", 2, -1, "c")};
  // B already borrows 1 of A's 2 idle slots: 1 is left to lend.
  input.running = {Running("b", "B", 3)};
  std::vector<WorkerSlots> workers = {Gpu("w", 8, 11)};
  auto over = CheckQ({Queued("C", Job("c4", 4))}, workers, input);
  ASSERT_TRUE(over.ok());
  // Counting only the others' idle quota (2 from A) would admit it and put
  // the cohort at 7 of 6.
  EXPECT_EQ(Outcome(*over), (Outcomes{{"c4", "pending:quota_exceeded"}})) << Dump(*over);
  auto fits = CheckQ({Queued("C", Job("c3", 3))}, workers, input);
  ASSERT_TRUE(fits.ok());
  EXPECT_EQ(Outcome(*fits), (Outcomes{{"c3", "w:0,1,2"}})) << Dump(*fits);
}

TEST(SchedulerQueueTest, QueueWithoutCohortNeverExceedsItsNominal) {
  QueueInput input;
  input.queues = {Queue("A", 3, 0)};
  auto r = CheckQ({Queued("A", Job("a1", 2, kCuda, 0, 1)), Queued("A", Job("a2", 2, kCuda, 0, 2)),
                   Queued("A", Job("a3", 1, kCuda, 0, 3)), Queued("A", Job("cpu", 1, kCpu, 0, 4))},
                  {Gpu("g", 8), Cpu("c", 8)}, input);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r), (Outcomes{{"a1", "g:0,1"},
                                   {"a2", "pending:quota_exceeded"},
                                   {"a3", "g:2"},
                                   {"cpu", "pending:exceeds_queue_limit"}}))
      << Dump(*r);
  EXPECT_THAT(
      PendingOf(*r, "cpu").message,
      HasSubstr("more than queue A's nominal quota with all its cohort could ever lend (0)"));
}

TEST(SchedulerQueueTest, JobsLargerThanTheQueueAllowsNeverWait) {
  QueueInput input;
  input.queues = {Queue("A", 4, -1, "c", /*max_job_size=*/3), Queue("B", 2, -1, "c")};
  PendingJob elastic = Queued("A", Job("elastic", 6, kCuda, 0, 4));
  elastic.min_world_size = 2;
  auto r = CheckQ({Queued("A", Job("too-big", 4, kCuda, 9, 1)),
                   Queued("B", Job("over-cohort", 7, kCuda, 9, 2)), elastic},
                  {Gpu("w", 8)}, input);
  ASSERT_TRUE(r.ok());
  // The elastic job is capped at max_job_size; the others never fit their
  // queue, hold nothing and block nobody.
  EXPECT_EQ(Outcome(*r), (Outcomes{{"too-big", "pending:exceeds_queue_limit"},
                                   {"over-cohort", "pending:exceeds_queue_limit"},
                                   {"elastic", "w:0,1,2"}}))
      << Dump(*r);
  EXPECT_THAT(PendingOf(*r, "too-big").message,
              HasSubstr("queue A takes jobs of at most 3 (max_job_size)"));
  EXPECT_THAT(PendingOf(*r, "over-cohort").message, HasSubstr("could ever lend (6)"));
}

// Issue #48: Kueue's borrowingLimit. A (2 GPUs, may borrow 1) and B (4) in
// one cohort on an idle 8-GPU cluster: A borrows up to 3 in all, however
// much B has idle.
TEST(SchedulerQueueTest, BorrowingStopsAtTheBorrowingLimit) {
  QueueInput input;
  input.queues = {Queue("A", 2, -1, "c"), Queue("B", 4, -1, "c")};
  input.queues[0].borrowing_limit_gpu = 1;
  const std::vector<WorkerSlots> idle = {Gpu("w", 8)};
  // 3 = nominal 2 + borrowing limit 1 fits; 4 never will (B's 4 idle
  // slots do not matter).
  auto r = CheckQ({Queued("A", Job("a3", 3, kCuda, 0, 1))}, idle, input);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r), (Outcomes{{"a3", "w:0,1,2"}})) << Dump(*r);
  auto big = CheckQ({Queued("A", Job("a4", 4, kCuda, 0, 1))}, idle, input);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(Outcome(*big), (Outcomes{{"a4", "pending:exceeds_queue_limit"}})) << Dump(*big);
  EXPECT_THAT(PendingOf(*big, "a4").message, HasSubstr("could ever lend (3)"));
  // A holds 3 (1 borrowed): one more waits, saying the limit, though the
  // cohort has 3 idle.
  input.running = {Running("a-run", "A", 3)};
  auto more = CheckQ({Queued("A", Job("a1", 1, kCuda, 0, 2))}, {Gpu("w", 5, 8)}, input);
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(Outcome(*more), (Outcomes{{"a1", "pending:quota_exceeded"}})) << Dump(*more);
  EXPECT_THAT(PendingOf(*more, "a1").message,
              HasSubstr("queue A: 3 of 2 cuda used, borrowing limit 1, cohort c: 3 of 6"));
  EXPECT_TRUE(more->preemptions.empty());
  // An elastic job that borrows (its minimum is over A's nominal) grows
  // only up to the limit, though 8 are idle.
  input.running.clear();
  PendingJob elastic = Queued("A", Job("elastic", 6, kCuda, 0, 3));
  elastic.min_world_size = 3;
  auto grown = CheckQ({elastic}, idle, input);
  ASSERT_TRUE(grown.ok());
  EXPECT_EQ(Outcome(*grown), (Outcomes{{"elastic", "w:0,1,2"}})) << Dump(*grown);
}

// Issue #48: Kueue's lendingLimit. A has 4 GPUs but lends at most 1; B has
// none of its own. B borrows at most 1; A's other 3 stay free for it, so A
// starts 3 at once without preempting, and preempts B only for its 4th.
TEST(SchedulerQueueTest, ALendingLimitKeepsPartOfALendersQuotaFreeForIt) {
  QueueInput input;
  input.queues = {Queue("A", 4, -1, "c"), Queue("B", 0, -1, "c")};
  input.queues[0].lending_limit_gpu = 1;
  auto b2 = CheckQ({Queued("B", Job("b2", 2, kCuda, 0, 1))}, {Gpu("w", 8)}, input);
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_EQ(Outcome(*b2), (Outcomes{{"b2", "pending:exceeds_queue_limit"}})) << Dump(*b2);
  auto b1 = CheckQ({Queued("B", Job("b1", 1, kCuda, 0, 1))}, {Gpu("w", 8)}, input);
  ASSERT_TRUE(b1.ok());
  EXPECT_EQ(Outcome(*b1), (Outcomes{{"b1", "w:0"}})) << Dump(*b1);
  // B holds its 1 borrowed slot; a second one of B's waits for quota.
  input.running = {Running("b1", "B", 1, 0, 1)};
  const std::vector<WorkerSlots> rest = {Worker("w", SlotKind::kGpu, {1, 2, 3, 4, 5, 6, 7}, 8)};
  auto again = CheckQ({Queued("B", Job("b-more", 1, kCuda, 0, 2))}, rest, input);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(Outcome(*again), (Outcomes{{"b-more", "pending:quota_exceeded"}})) << Dump(*again);
  EXPECT_THAT(PendingOf(*again, "b-more").message, HasSubstr("cohort c: 1 of 1"));
  // A's 3 reserved slots need nobody's.
  auto a3 = CheckQ({Queued("A", Job("a3", 3, kCuda, 0, 3))}, rest, input);
  ASSERT_TRUE(a3.ok());
  EXPECT_EQ(Outcome(*a3), (Outcomes{{"a3", "w:1,2,3"}})) << Dump(*a3);
  EXPECT_TRUE(a3->preemptions.empty());
  // Its 4th is the one it lent: B's job is preempted for it.
  auto a4 = CheckQ({Queued("A", Job("a4", 4, kCuda, 0, 3))}, {Gpu("w", 3, 4)}, input);
  ASSERT_TRUE(a4.ok());
  EXPECT_EQ(Victims(*a4), std::vector<std::string>{"b1>a4"});
  EXPECT_THAT(PendingOf(*a4, "a4").message, HasSubstr("lends at most 1"));
}

// Issue #48: quotas in CPUs and memory (scheduler.h, "Resource quotas").
// Schedule() directly: the invariant model (CheckQ) counts slots only.
QueueSpec WithMemory(QueueSpec q, std::int64_t nominal) {
  q.nominal_memory_bytes = nominal;
  return q;
}
QueueSpec WithCpus(QueueSpec q, double nominal, double borrowing = -1, double lending = -1) {
  q.nominal_cpus = nominal;
  q.borrowing_limit_cpus = borrowing;
  q.lending_limit_cpus = lending;
  return q;
}
RunningJob Holding(RunningJob r, double cpus, std::int64_t memory) {
  r.cpus = cpus;
  r.memory_bytes = memory;
  return r;
}

// A fits by slots (4 GPUs, 1 held) but not by its 32 GiB memory quota:
// it waits, the message naming memory; one that fits both starts; one
// larger than the quota ever allows is never runnable, naming the field.
TEST(SchedulerResourceQuotaTest, AJobThatFitsBySlotsButNotByMemoryQuotaWaits) {
  QueueInput input;
  input.queues = {WithMemory(Queue("A", 4), 32 * kGiB)};
  input.running = {Holding(Running("a-run", "A", 1, 0, 1), 0, 16 * kGiB)};
  const std::vector<WorkerSlots> workers = {
      Sized(Worker("w", SlotKind::kGpu, {1, 2, 3}, 4), 64, 256 * kGiB)};
  auto r = Schedule({Queued("A", Needs(Job("two", 2, kCuda, 0, 2), 0, 16 * kGiB))}, workers, input);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r), (Outcomes{{"two", "pending:quota_exceeded"}})) << Dump(*r);
  EXPECT_THAT(PendingOf(*r, "two").message, HasSubstr("queue A: 16 GiB of 32 GiB memory used"));
  EXPECT_TRUE(r->preemptions.empty());
  auto one =
      Schedule({Queued("A", Needs(Job("one", 1, kCuda, 0, 2), 0, 16 * kGiB))}, workers, input);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(Outcome(*one), (Outcomes{{"one", "w:1"}})) << Dump(*one);
  // A job without resources holds no memory: the memory quota never stops it.
  auto plain = Schedule({Queued("A", Job("plain", 3, kCuda, 0, 2))}, workers, input);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(Outcome(*plain), (Outcomes{{"plain", "w:1,2,3"}})) << Dump(*plain);
  input.running.clear();
  auto never =
      Schedule({Queued("A", Needs(Job("never", 3, kCuda, 0, 2), 0, 16 * kGiB))}, workers, input);
  ASSERT_TRUE(never.ok());
  EXPECT_EQ(Outcome(*never), (Outcomes{{"never", "pending:exceeds_queue_limit"}})) << Dump(*never);
  EXPECT_THAT(PendingOf(*never, "never").message, HasSubstr("needs 48 GiB memory"));
  EXPECT_THAT(PendingOf(*never, "never").message, HasSubstr("could ever lend (32 GiB memory)"));
}

// A (4 CPUs, may borrow 2) and B (8 CPUs) in one cohort: A borrows CPUs
// up to 6 in all, however many B has idle.
TEST(SchedulerResourceQuotaTest, CpusAreBorrowedWithinTheBorrowingLimit) {
  QueueInput input;
  input.queues = {WithCpus(Queue("A", -1, -1, "c"), 4, 2), WithCpus(Queue("B", -1, -1, "c"), 8)};
  const std::vector<WorkerSlots> idle = {Sized(Cpu("w", 16), 32, 0)};
  auto r = Schedule({Queued("A", Needs(Job("a3", 3, kCpu, 0, 1), 2))}, idle, input);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r), (Outcomes{{"a3", "w:0,1,2"}})) << Dump(*r);
  auto big = Schedule({Queued("A", Needs(Job("a4", 4, kCpu, 0, 1), 2))}, idle, input);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(Outcome(*big), (Outcomes{{"a4", "pending:exceeds_queue_limit"}})) << Dump(*big);
  EXPECT_THAT(PendingOf(*big, "a4").message, HasSubstr("could ever lend (6 cpus)"));
  // A holds 6 (2 borrowed): one more CPU waits, saying the limit, though B
  // has 8 idle.
  input.running = {Holding(Running("a-run", "A", 3, 0, 1, SlotKind::kCpu), 2, 0)};
  auto more = Schedule({Queued("A", Needs(Job("a1", 1, kCpu, 0, 2), 1))},
                       {Sized(Worker("w", SlotKind::kCpu, {3, 4, 5}, 16), 32, 0, true, 6)}, input);
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(Outcome(*more), (Outcomes{{"a1", "pending:quota_exceeded"}})) << Dump(*more);
  EXPECT_THAT(PendingOf(*more, "a1").message,
              HasSubstr("queue A: 6 of 4 cpus used, borrowing limit 2, cohort c: 6 of 12"));
  EXPECT_TRUE(more->preemptions.empty());
  // Borrowing comes after the jobs that do not borrow: B's job first.
  input.running.clear();
  auto order = Schedule({Queued("A", Needs(Job("a-borrow", 3, kCpu, 9, 1), 2)),
                         Queued("B", Needs(Job("b-own", 4, kCpu, 0, 2), 2))},
                        {Sized(Cpu("w", 16), 12, 0)}, input);
  ASSERT_TRUE(order.ok());
  ASSERT_EQ(order->placements.size(), 1u) << Dump(*order);
  EXPECT_EQ(order->placements[0].job_id, "b-own");
}

// A has 8 CPUs but lends at most 2; B has none of its own. B borrows at
// most 2; A's other 6 stay free for it, and A preempts B only for the 2
// it lent.
TEST(SchedulerResourceQuotaTest, ALendingLimitKeepsCpusBackForTheLender) {
  QueueInput input;
  input.queues = {WithCpus(Queue("A", -1, -1, "c"), 8, -1, 2),
                  WithCpus(Queue("B", -1, -1, "c"), 0)};
  const std::vector<WorkerSlots> idle = {Sized(Cpu("w", 8), 16, 0)};
  auto b2 = Schedule({Queued("B", Needs(Job("b2", 2, kCpu, 0, 1), 2))}, idle, input);
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_EQ(Outcome(*b2), (Outcomes{{"b2", "pending:exceeds_queue_limit"}})) << Dump(*b2);
  auto b1 = Schedule({Queued("B", Needs(Job("b1", 1, kCpu, 0, 1), 2))}, idle, input);
  ASSERT_TRUE(b1.ok());
  EXPECT_EQ(Outcome(*b1), (Outcomes{{"b1", "w:0"}})) << Dump(*b1);
  input.running = {Holding(Running("b1", "B", 1, 0, 1, SlotKind::kCpu), 2, 0)};
  const std::vector<WorkerSlots> rest = {
      Sized(Worker("w", SlotKind::kCpu, {1, 2, 3, 4, 5, 6, 7}, 8), 16, 0, true, 2)};
  auto again = Schedule({Queued("B", Needs(Job("b-more", 1, kCpu, 0, 2), 1))}, rest, input);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(Outcome(*again), (Outcomes{{"b-more", "pending:quota_exceeded"}})) << Dump(*again);
  EXPECT_THAT(PendingOf(*again, "b-more").message, HasSubstr("cohort c: 2 of 2"));
  // A's 6 kept-back CPUs need nobody's.
  auto a3 = Schedule({Queued("A", Needs(Job("a3", 3, kCpu, 0, 3), 2))}, rest, input);
  ASSERT_TRUE(a3.ok());
  EXPECT_EQ(Outcome(*a3), (Outcomes{{"a3", "w:1,2,3"}})) << Dump(*a3);
  EXPECT_TRUE(a3->preemptions.empty());
  // Its last 2 are the ones it lent: B's job is preempted for them.
  auto a4 = Schedule({Queued("A", Needs(Job("a4", 4, kCpu, 0, 3), 2))}, rest, input);
  ASSERT_TRUE(a4.ok());
  EXPECT_EQ(Victims(*a4), std::vector<std::string>{"b1>a4"});
  EXPECT_THAT(PendingOf(*a4, "a4").message, HasSubstr("lends at most 2"));
}

// Reclaim counts memory whatever the slot kind: B borrows A's memory quota
// with a CPU job; A's GPU job within its nominal preempts it.
TEST(SchedulerResourceQuotaTest, ReclaimTakesBackMemoryFromAJobOfTheOtherKind) {
  QueueInput input;
  input.queues = {WithMemory(Queue("A", -1, -1, "c"), 64 * kGiB),
                  WithMemory(Queue("B", -1, -1, "c"), 0)};
  input.running = {Holding(Running("b-cpu", "B", 2, 0, 1, SlotKind::kCpu), 0, 32 * kGiB)};
  const std::vector<WorkerSlots> workers = {
      Sized(Gpu("g", 2), 16, 128 * kGiB),
      Sized(Worker("c", SlotKind::kCpu, {2, 3}, 4), 16, 128 * kGiB, true, 0, 64 * kGiB)};
  auto r =
      Schedule({Queued("A", Needs(Job("a-gpu", 1, kCuda, 0, 2), 0, 32 * kGiB))}, workers, input);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r), (Outcomes{{"a-gpu", "pending:preempting"}})) << Dump(*r);
  EXPECT_EQ(Victims(*r), std::vector<std::string>{"b-cpu>a-gpu"});
  EXPECT_THAT(PendingOf(*r, "a-gpu").message, HasSubstr("cohort c: 64 GiB of 64 GiB"));
  // Once it stops (still counted while stopping), nothing more is picked.
  input.running[0].stopping = true;
  auto waiting =
      Schedule({Queued("A", Needs(Job("a-gpu", 1, kCuda, 0, 2), 0, 32 * kGiB))}, workers, input);
  ASSERT_TRUE(waiting.ok());
  EXPECT_EQ(Outcome(*waiting), (Outcomes{{"a-gpu", "pending:preempting"}})) << Dump(*waiting);
  EXPECT_TRUE(waiting->preemptions.empty());
  // Gone: A's job starts.
  input.running.clear();
  auto placed =
      Schedule({Queued("A", Needs(Job("a-gpu", 1, kCuda, 0, 2), 0, 32 * kGiB))}, workers, input);
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ(Outcome(*placed), (Outcomes{{"a-gpu", "g:0"}})) << Dump(*placed);
}

// Sums of what jobs ask saturate instead of overflowing: a huge request is
// simply more than any quota.
TEST(SchedulerResourceQuotaTest, HugeRequestsAreOverAnyQuotaWithoutOverflow) {
  QueueInput input;
  input.queues = {WithMemory(Queue("A", -1), 64 * kGiB)};
  input.running = {Holding(Running("huge-run", "A", 4), 0, std::int64_t{1} << 62)};
  const std::vector<WorkerSlots> workers = {Sized(Gpu("w", 4, 8), 16, std::int64_t{1} << 62)};
  auto r = Schedule({Queued("A", Needs(Job("huge", 1, kCuda, 0, 1), 0, std::int64_t{1} << 62)),
                     Queued("A", Needs(Job("small", 1, kCuda, 0, 2), 0, kGiB))},
                    workers, input);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r), (Outcomes{{"huge", "pending:exceeds_queue_limit"},
                                   {"small", "pending:quota_exceeded"}}))
      << Dump(*r);
}

// An elastic job grows by a rank only within its queue's own CPU and memory
// quotas (JobPlacer asks before stopping it to grow).
TEST(SchedulerResourceQuotaTest, GrowthRoomIsWithinTheQueuesOwnResourceQuota) {
  const std::vector<QueueSpec> queues = {WithMemory(Queue("A", -1, -1, "c"), 32 * kGiB),
                                         WithMemory(Queue("B", -1, -1, "c"), 0), Queue("U", -1)};
  const std::vector<RunningJob> running = {
      Holding(Running("a", "A", 1), 0, 16 * kGiB),
      Holding(Running("gone", "deleted-queue", 8), 0, 64 * kGiB)};
  EXPECT_TRUE(QueueHasResourceRoom(queues, running, "A", 0, 16 * kGiB));
  EXPECT_FALSE(QueueHasResourceRoom(queues, running, "A", 0, 17 * kGiB)) << "past its own nominal";
  EXPECT_FALSE(QueueHasResourceRoom(queues, running, "B", 0, kGiB)) << "only by borrowing";
  EXPECT_TRUE(QueueHasResourceRoom(queues, running, "B", 4, 0)) << "B has no CPU quota";
  EXPECT_TRUE(QueueHasResourceRoom(queues, running, "U", 64, 64 * kGiB)) << "unlimited";
  EXPECT_TRUE(QueueHasResourceRoom({}, running, "A", 0, 64 * kGiB)) << "no queues";
}

TEST(SchedulerResourceQuotaTest, MalformedResourceQuotasAreRefusedNamingTheField) {
  QueueInput input;
  input.queues = {WithCpus(Queue("A", 1), std::nan(""))};
  auto r = Schedule({}, {Gpu("w", 1)}, input);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("queue \"A\": nominal_cpus: must be -1 (unlimited) or finite"));
  input.queues = {WithMemory(Queue("A", 1), -5)};
  r = Schedule({}, {Gpu("w", 1)}, input);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("nominal_memory_bytes"));
  input.queues = {Queue("A", 1)};
  input.running = {Holding(Running("r", "A", 1), -1, 0)};
  r = Schedule({}, {Gpu("w", 1)}, input);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("running job \"r\": cpus and memory_bytes"));
}

TEST(SchedulerQueueTest, UnknownQueueIsReportedLast) {
  QueueInput input;
  input.queues = {Queue("default", -1), Queue("A", 2)};
  auto r = CheckQ({Queued("nope", Job("lost", 1, kCuda, 9, 0)), Job("plain", 1, kCuda, 0, 1),
                   Queued("A", Job("a", 1, kCuda, 0, 2))},
                  {Gpu("w", 4)}, input);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r),
            (Outcomes{{"lost", "pending:unknown_queue"}, {"plain", "w:1"}, {"a", "w:0"}}))
      << Dump(*r);
  EXPECT_THAT(PendingOf(*r, "lost").message, HasSubstr("queue \"nope\" is not defined"));
  // Without a "default" queue, a job naming none is in an unknown queue.
  input.queues = {Queue("A", 2)};
  auto r2 = CheckQ({Job("plain", 1)}, {Gpu("w", 4)}, input);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(Outcome(*r2), (Outcomes{{"plain", "pending:unknown_queue"}}));
}

TEST(SchedulerQueueTest, FairShareInterleavesQueuesWithinAPass) {
  QueueInput input;
  input.queues = {Queue("A", 4), Queue("B", 4)};
  std::vector<PendingJob> jobs;
  for (int i = 0; i < 4; ++i) {
    // A's jobs are older and of higher priority: without queues they would
    // all go first.
    jobs.push_back(Queued("A", Job(absl::StrCat("a", i), 1, kCuda, 5, i)));
    jobs.push_back(Queued("B", Job(absl::StrCat("b", i), 1, kCuda, 0, 10 + i)));
  }
  auto r = CheckQ(jobs, {Gpu("w", 4)}, input);
  ASSERT_TRUE(r.ok());
  // Equal shares: A first by name; then whoever has placed less.
  EXPECT_EQ(PlacementOrder(*r), (std::vector<std::string>{"a0", "b0", "a1", "b1"}));
  // B used more lately: it goes after A until their shares meet.
  input.queues[1].usage_gpu = 1.5;
  auto r2 = CheckQ(jobs, {Gpu("w", 4)}, input);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(PlacementOrder(*r2), (std::vector<std::string>{"a0", "a1", "b0", "a2"}));
  // Dominant share: each queue's most used kind counts. GPU jobs raise A's
  // GPU share past its CPU share (0.5) only at the third placement.
  input.queues = {Queue("A", 4, 100), Queue("B", 4, 1)};
  input.queues[0].usage_cpu = 50;   // A: max(0/4, 50/100) = 0.5
  input.queues[1].usage_cpu = 0.6;  // B: max(0/4, 0.6/1) = 0.6
  auto r3 = CheckQ(jobs, {Gpu("w", 4)}, input);
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(PlacementOrder(*r3), (std::vector<std::string>{"a0", "a1", "a2", "b0"}));
}

TEST(SchedulerQueueTest, BorrowingJobsGoAfterJobsWithinNominal) {
  QueueInput input;
  input.queues = {Queue("A", 2, -1, "c"), Queue("B", 2, -1, "c")};
  // B has no recent use and would go first by share, but its job borrows.
  input.queues[0].usage_gpu = 100;
  input.running = {Running("b-running", "B", 2)};
  auto r =
      CheckQ({Queued("B", Job("b-borrows", 2, kCuda, 0, 1)), Queued("A", Job("a", 2, kCuda, 0, 2))},
             {Gpu("w", 2, 4)}, input);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r), (Outcomes{{"a", "w:0,1"}, {"b-borrows", "pending:quota_exceeded"}}))
      << Dump(*r);
  // With room for both, the borrower starts too, after A's job.
  auto r2 =
      CheckQ({Queued("B", Job("b-borrows", 1, kCuda, 9, 1)), Queued("A", Job("a", 1, kCuda, 0, 2))},
             {Gpu("w", 2, 4)}, input);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(PlacementOrder(*r2), (std::vector<std::string>{"a", "b-borrows"}));
}

TEST(SchedulerQueueTest, ElasticJobsSizeToTheirQuota) {
  QueueInput input;
  input.queues = {Queue("A", 2, -1, "c"), Queue("B", 4, -1, "c")};
  PendingJob e = Queued("A", Job("e", 6, kCuda, 0, 1));
  e.min_world_size = 1;
  // Its minimum fits A's nominal: it starts within it, without borrowing.
  auto r = CheckQ({e}, {Gpu("w", 8)}, input);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r), (Outcomes{{"e", "w:0,1"}})) << Dump(*r);
  // A's nominal is in use: it borrows what the cohort has idle (B's 4).
  input.running = {Running("a-running", "A", 2)};
  auto r2 = CheckQ({e}, {Gpu("w", 6, 8)}, input);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(Outcome(*r2), (Outcomes{{"e", "w:0,1,2,3"}})) << Dump(*r2);
}

// Victims: lowest priority, then youngest, then fewest slots, then id; only
// while their queue borrows.
TEST(SchedulerQueueTest, VictimOrderAndOnlyBorrowedQuotaIsReclaimed) {
  QueueInput input;
  input.queues = {Queue("A", 4, -1, "c"), Queue("B", 3, -1, "c")};
  input.running = {Running("old-low", "B", 1, 0, 1), Running("young-low", "B", 1, 0, 5),
                   Running("young-low-2", "B", 2, 0, 5), Running("high", "B", 2, 7, 9),
                   Running("a-low", "A", 1, -5, 0)};
  // 7 GPUs, all busy. A uses 1 of 4; B uses 6 of 3 (borrows 3).
  std::vector<WorkerSlots> busy = {Gpu("w", 0, 7)};
  auto r = CheckQ({Queued("A", Job("a2", 2, kCuda, 0, 1))}, busy, input);
  ASSERT_TRUE(r.ok());
  // a-low, A's own job of lower priority (-5 < 0), goes first by priority;
  // then B's youngest, fewest slots first.
  EXPECT_EQ(Victims(*r), (std::vector<std::string>{"a-low>a2", "young-low>a2"})) << Dump(*r);

  // A job of A's priority -5 has no same-queue victim; it needs 3: B's
  // lowest-priority jobs, youngest first, fewest slots first.
  auto r2 = CheckQ({Queued("A", Job("a3", 3, kCuda, -5, 1))}, busy, input);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(Victims(*r2), (std::vector<std::string>{"young-low>a3", "young-low-2>a3"}))
      << Dump(*r2);

  // A queue is a candidate only while it borrows: once picks bring B to its
  // nominal, its older job b1 is skipped and C's youngest borrower is next.
  input.queues = {Queue("A", 6, -1, "c"), Queue("B", 3, -1, "c"), Queue("C", 1, -1, "c")};
  input.running = {Running("x", "B", 2, 0, 9), Running("b2", "B", 2, 0, 8),
                   Running("b1", "B", 2, 0, 7), Running("c1", "C", 1, 0, 1),
                   Running("c0", "C", 1, 0, 0)};
  auto r3 = CheckQ({Queued("A", Job("a6", 6, kCuda, 0, 1))}, {Gpu("w", 1, 9)}, input);
  ASSERT_TRUE(r3.ok());
  // B: 6 > 3 (x), 4 > 3 (b2), 2 (b1 skipped); C: 2 > 1 (c1), then 1 + 5
  // picked >= 6 slots.
  EXPECT_EQ(Victims(*r3), (std::vector<std::string>{"x>a6", "b2>a6", "c1>a6"})) << Dump(*r3);
}

TEST(SchedulerQueueTest, NeverPreemptsUselessly) {
  // U (no cohort, unlimited) holds 2 of 6 GPUs; B borrows 2 of A's. A's job
  // of 4 is within A's nominal, but B's borrowed 2 cannot make 4 slots free.
  QueueInput input;
  input.queues = {Queue("A", 4, -1, "c"), Queue("B", 2, -1, "c"), Queue("U", -1)};
  input.running = {Running("u", "U", 2), Running("b1", "B", 2, 0, 1), Running("b2", "B", 2, 0, 2)};
  auto r = CheckQ({Queued("A", Job("a", 4, kCuda, 0, 1))}, {Gpu("w", 0, 6)}, input);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->preemptions.empty()) << Dump(*r);
  EXPECT_EQ(PendingOf(*r, "a").reason, PendingReason::kQuotaExceeded);
  EXPECT_THAT(PendingOf(*r, "a").message, HasSubstr("preempting borrowers cannot free enough"));
}

TEST(SchedulerQueueTest, SameQueuePreemptionNeedsStrictlyLowerPriority) {
  QueueInput input;
  input.queues = {Queue("A", 4)};
  input.running = {Running("low", "A", 2, 0, 1), Running("mid", "A", 2, 3, 2)};
  std::vector<WorkerSlots> busy = {Gpu("w", 0, 4)};
  // A uses 4 of 4: a new job makes room within A's nominal by preempting
  // the lowest-priority job of A.
  auto r = CheckQ({Queued("A", Job("urgent", 2, kCuda, 9, 1))}, busy, input);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Victims(*r), std::vector<std::string>{"low>urgent"});
  EXPECT_EQ(PendingOf(*r, "urgent").reason, PendingReason::kPreempting);
  // With A's quota larger than the cluster: within nominal, blocked for slots.
  input.queues = {Queue("A", 8)};
  auto r2 = CheckQ({Queued("A", Job("urgent", 2, kCuda, 3, 1))}, busy, input);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(Victims(*r2), std::vector<std::string>{"low>urgent"});
  // Equal priority is no reason: it waits (and holds the head's place).
  auto r3 = CheckQ({Queued("A", Job("peer", 2, kCuda, 0, 1))}, busy, input);
  ASSERT_TRUE(r3.ok());
  EXPECT_TRUE(r3->preemptions.empty());
  EXPECT_EQ(PendingOf(*r3, "peer").reason, PendingReason::kInsufficientFreeSlots);
}

TEST(SchedulerQueueTest, OnePreemptorPerKindAndItHoldsItsSlots) {
  QueueInput input;
  input.queues = {Queue("A", 4, 4, "c"), Queue("B", 0, 0, "c"), Queue("U", -1, -1)};
  input.running = {Running("b-gpu-1", "B", 2, 0, 1), Running("b-gpu-2", "B", 2, 0, 2),
                   Running("b-cpu", "B", 2, 0, 3, SlotKind::kCpu)};
  // 2 GPUs free of 6: A's first job is within nominal but the cohort (4)
  // lent all of it to B. It preempts one of B's jobs and holds the 2 free
  // GPUs; A's second job does not preempt in this pass; U's job, later in
  // the order, may not take the held GPUs. On CPU, independently, A's job
  // preempts B's.
  auto r = CheckQ({Queued("A", Job("a1", 2, kCuda, 0, 1)), Queued("A", Job("a2", 2, kCuda, 0, 2)),
                   Queued("A", Job("a-cpu", 2, kCpu, 0, 3)), Queued("U", Job("u", 1, kCuda, 0, 4))},
                  {Gpu("w", 2, 6), Cpu("c", 0, 2)}, input);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Victims(*r), (std::vector<std::string>{"b-gpu-2>a1", "b-cpu>a-cpu"})) << Dump(*r);
  EXPECT_EQ(Outcome(*r), (Outcomes{{"a1", "pending:preempting"},
                                   {"a2", "pending:quota_exceeded"},
                                   {"a-cpu", "pending:preempting"},
                                   {"u", "pending:blocked_by_reservation"}}))
      << Dump(*r);
  EXPECT_EQ(PendingOf(*r, "a1").reserved_slots.size(), 2u);
  EXPECT_EQ(PendingOf(*r, "u").blocked_by, "a1");
}

TEST(SchedulerQueueTest, UnlimitedQueuesNeverPreempt) {
  QueueInput input;
  input.queues = {Queue("default", -1)};
  input.running = {Running("low", "default", 4, -10, 1)};
  auto r = CheckQ({Job("high", 4, kCuda, 10, 1)}, {Gpu("w", 0, 4)}, input);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->preemptions.empty());
  EXPECT_EQ(PendingOf(*r, "high").reason, PendingReason::kInsufficientFreeSlots);
}

TEST(SchedulerQueueTest, RejectsMalformedQueueInput) {
  auto queue = [](std::function<void(QueueSpec&)> edit) {
    QueueSpec q = Queue("A", 2);
    edit(q);
    return q;
  };
  struct Bad {
    std::string name;
    QueueInput input;
    std::string field;
  };
  const std::vector<Bad> cases = {
      {"empty queue name",
       {{queue([](QueueSpec& q) { q.name = ""; })}, {}},
       "queues[0].name: empty"},
      {"duplicate queue", {{Queue("A", 1), Queue("A", 2)}, {}}, "queue name: duplicate \"A\""},
      {"nominal below -1", {{queue([](QueueSpec& q) { q.nominal_cpu = -2; })}, {}}, "nominal_cpu"},
      {"negative max size",
       {{queue([](QueueSpec& q) { q.max_job_size = -1; })}, {}},
       "max_job_size"},
      {"negative usage", {{queue([](QueueSpec& q) { q.usage_gpu = -1; })}, {}}, "usage_gpu"},
      {"nan usage", {{queue([](QueueSpec& q) { q.usage_cpu = std::nan(""); })}, {}}, "usage_cpu"},
      {"running empty id", {{Queue("A", 2)}, {Running("", "A", 1)}}, "running job_id: empty"},
      {"running duplicate",
       {{Queue("A", 2)}, {Running("r", "A", 1), Running("r", "A", 1)}},
       "running job_id: duplicate"},
      {"running also pending",
       {{Queue("A", 2)}, {Running("p", "A", 1)}},
       "job_id: also a pending job"},
      {"running negative slots", {{Queue("A", 2)}, {Running("r", "A", -1)}}, "slots: must be >= 0"},
      {"running unknown queue",
       {{Queue("A", 2)}, {Running("r", "Z", 1)}},
       "queue: \"Z\" is not defined"},
      {"running in no queue without default",
       {{Queue("A", 2)}, {Running("r", "", 1)}},
       "queue: \"default\" is not defined"},
      {"running checked without queues too", {{}, {Running("r", "", -3)}}, "slots: must be >= 0"},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<ScheduleResult> r = Schedule({Job("p", 1)}, {Gpu("w", 1)}, c.input);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.field));
  }
}

// Issue #26's starvation worry: a stream of borrowing jobs never keeps a job
// within its queue's nominal quota waiting, even when fair share puts the
// borrowers' queue first (else the borrowers would take back, pass after
// pass, the slots their preempted jobs freed). Victims stop one tick after
// they are picked.
TEST(SchedulerQueueTest, JobWithinNominalStartsDespiteAStreamOfBorrowers) {
  QueueInput input;
  input.queues = {Queue("A", 4, -1, "c"), Queue("B", 4, -1, "c")};
  input.queues[0].usage_gpu = 1000;  // A used much lately; B goes first
  struct Live {
    RunningJob job;
    std::vector<std::pair<std::string, int>> slots;
    int end = 0;
  };
  std::map<std::string, Live> live;
  std::map<std::string, int> stop_at;
  std::vector<PendingJob> pending;
  std::map<std::string, int> started;
  std::uint64_t seq = 0, start_seq = 0;
  for (int tick = 0; tick < 60 && !started.count("a-job"); ++tick) {
    // B submits two 1-GPU jobs a tick, each running 30 ticks: far more than
    // its quota; A submits one 4-GPU job at tick 10.
    for (int k = 0; k < 2; ++k) {
      pending.push_back(Queued("B", Job(absl::StrCat("b", seq), 1, kCuda, 0, seq)));
      ++seq;
    }
    if (tick == 10) pending.push_back(Queued("A", Job("a-job", 4, kCuda, 0, seq++)));
    std::map<std::string, std::set<int>> busy;
    input.running.clear();
    for (auto it = live.begin(); it != live.end();) {
      const bool stopped = stop_at.count(it->first) && stop_at[it->first] <= tick;
      if (it->second.end <= tick || stopped) {
        it = live.erase(it);
        continue;
      }
      for (const auto& [w, s] : it->second.slots) busy[w].insert(s);
      RunningJob r = it->second.job;
      r.stopping = stop_at.count(it->first) > 0;
      input.running.push_back(r);
      ++it;
    }
    std::vector<WorkerSlots> workers;
    for (const std::string w : {"w1", "w2"}) {
      std::vector<int> free;
      for (int s = 0; s < 4; ++s) {
        if (!busy[w].count(s)) free.push_back(s);
      }
      workers.push_back(Worker(w, SlotKind::kGpu, free, 4));
    }
    auto r = CheckQ(pending, workers, input);
    ASSERT_TRUE(r.ok()) << r.status();
    for (const Preemption& p : r->preemptions) stop_at[p.victim_job_id] = tick + 1;
    std::vector<PendingJob> still;
    for (const PendingJob& j : pending) {
      const Placement* placed = nullptr;
      for (const Placement& p : r->placements) placed = p.job_id == j.job_id ? &p : placed;
      if (placed == nullptr) {
        still.push_back(j);
        continue;
      }
      started[j.job_id] = tick;
      Live l{Running(j.job_id, j.queue, placed->world_size, 0, start_seq++), {}, tick + 30};
      for (const RankAssignment& a : placed->ranks) l.slots.push_back({a.worker_id, a.slot});
      live[j.job_id] = l;
    }
    pending = still;
  }
  ASSERT_TRUE(started.count("a-job")) << "A's job starved";
  // Tick 10: B's borrowers are picked; 11: they stop; 11 or 12: A starts.
  EXPECT_LE(started["a-job"], 12);
}

// Issue #48: queues without quota share idle capacity by weight, and the
// owners of one queue share it by their weights. A simulated cluster of one
// 4-GPU worker, one tick a second: jobs that ran their time end, every
// (queue, owner)'s usage decays (half-life 300 s, as JobPlacer ages it) and
// grows by the slots it holds, then one pass runs. Each stream always has
// work waiting: 1-GPU jobs of 5..40 s, the same sequence for every stream.
// Returns the slot-seconds each stream got.
struct Stream {
  std::string queue;
  std::string owner;
};
std::vector<double> SimulateFairShare(std::vector<QueueSpec> queues,
                                      const std::vector<Stream>& streams, int ticks = 8000) {
  const double half_life = 300;
  const double decay = std::exp2(-1 / half_life);
  struct Live {
    RunningJob job;
    size_t stream = 0;
    int slot = 0;
    int end = 0;
  };
  std::vector<Live> live;
  std::vector<std::vector<PendingJob>> waiting(streams.size());
  std::vector<std::mt19937> rngs(streams.size(), std::mt19937(48));
  std::vector<double> held_seconds(streams.size(), 0);
  // Decayed usage per stream (a stream is one owner of one queue).
  std::vector<double> usage(streams.size(), 0);
  std::map<std::string, size_t> stream_of;
  std::uint64_t seq = 0;
  for (int tick = 0; tick < ticks; ++tick) {
    std::set<int> busy;
    std::vector<Live> still_live;
    for (Live& l : live) {
      if (l.end <= tick) continue;
      busy.insert(l.slot);
      still_live.push_back(l);
    }
    live = std::move(still_live);
    for (double& u : usage) u *= decay;
    for (const Live& l : live) {
      usage[l.stream] += 1;
      held_seconds[l.stream] += 1;
    }
    QueueInput input;
    input.queues = queues;
    for (QueueSpec& q : input.queues) {
      q.usage_gpu = 0;
      for (size_t i = 0; i < streams.size(); ++i) {
        if (streams[i].queue != q.name) continue;
        q.usage_gpu += usage[i];
        auto it = std::find_if(q.owners.begin(), q.owners.end(), [&](const QueueSpec::Owner& o) {
          return o.name == streams[i].owner;
        });
        if (it == q.owners.end())
          it = q.owners.insert(q.owners.end(), QueueSpec::Owner{streams[i].owner});
        it->usage_gpu = usage[i];
      }
    }
    std::vector<PendingJob> pending;
    for (size_t i = 0; i < streams.size(); ++i) {
      while (waiting[i].size() < 6) {
        PendingJob j = Queued(streams[i].queue, Job(absl::StrCat("j", seq), 1, kCuda, 0, seq));
        ++seq;
        j.owner = streams[i].owner;
        stream_of[j.job_id] = i;
        waiting[i].push_back(j);
      }
      pending.insert(pending.end(), waiting[i].begin(), waiting[i].end());
    }
    for (const Live& l : live) input.running.push_back(l.job);
    std::vector<int> free;
    for (int s = 0; s < 4; ++s) {
      if (!busy.count(s)) free.push_back(s);
    }
    auto r = CheckQ(pending, {Worker("w", SlotKind::kGpu, free, 4)}, input);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return held_seconds;
    for (const Placement& p : r->placements) {
      const size_t i = stream_of[p.job_id];
      std::uniform_int_distribution<int> runtime(5, 40);
      live.push_back({Running(p.job_id, streams[i].queue, 1, 0, seq++), i, p.ranks[0].slot,
                      tick + runtime(rngs[i])});
      waiting[i].erase(std::find_if(waiting[i].begin(), waiting[i].end(),
                                    [&](const PendingJob& j) { return j.job_id == p.job_id; }));
    }
  }
  return held_seconds;
}

double Fraction(const std::vector<double>& seconds, size_t i) {
  double total = 0;
  for (double s : seconds) total += s;
  return seconds[i] / total;
}

TEST(SchedulerFairShareTest, QueuesWithoutQuotaAndEqualWeightsSplitTheClusterEvenly) {
  // Before weights, "a" got ~98% of the slot-seconds: two shares of 0 tied
  // and the tie went by name.
  const std::vector<double> got =
      SimulateFairShare({Queue("a", -1), Queue("b", -1)}, {{"a", "alice"}, {"b", "bob"}});
  EXPECT_NEAR(Fraction(got, 0), 0.5, 0.05) << got[0] << " vs " << got[1];
  // Queue order is not name order: "b" gets as much when it sorts first.
  const std::vector<double> swapped =
      SimulateFairShare({Queue("b", -1), Queue("a", -1)}, {{"b", "bob"}, {"a", "alice"}});
  EXPECT_NEAR(Fraction(swapped, 0), 0.5, 0.05);
}

TEST(SchedulerFairShareTest, QueueWeightsThreeToOneGiveThreeQuarters) {
  std::vector<QueueSpec> queues = {Queue("a", -1), Queue("b", -1)};
  queues[1].weight = 3;  // the heavier queue sorts second
  const std::vector<double> got = SimulateFairShare(queues, {{"a", "alice"}, {"b", "bob"}});
  EXPECT_NEAR(Fraction(got, 1), 0.75, 0.05) << got[0] << " vs " << got[1];
}

TEST(SchedulerFairShareTest, OwnersOfOneQueueShareItByTheirWeights) {
  std::vector<QueueSpec> queues = {Queue("a", -1)};
  std::vector<double> even = SimulateFairShare(queues, {{"a", "alice"}, {"a", "bob"}});
  EXPECT_NEAR(Fraction(even, 0), 0.5, 0.05) << even[0] << " vs " << even[1];
  queues[0].owners = {QueueSpec::Owner{"bob", 3}};
  std::vector<double> weighted = SimulateFairShare(queues, {{"a", "alice"}, {"a", "bob"}});
  EXPECT_NEAR(Fraction(weighted, 1), 0.75, 0.05) << weighted[0] << " vs " << weighted[1];
  // Two levels: queue b gets half the cluster, a's two owners a quarter each.
  std::vector<double> tree = SimulateFairShare({Queue("a", -1), Queue("b", -1)},
                                               {{"a", "alice"}, {"a", "bob"}, {"b", "carol"}});
  EXPECT_NEAR(Fraction(tree, 2), 0.5, 0.05);
  EXPECT_NEAR(Fraction(tree, 0), 0.25, 0.05);
  EXPECT_NEAR(Fraction(tree, 1), 0.25, 0.05);
}

TEST(SchedulerFairShareTest, EqualSharesGoToTheQueueHoldingFewerSlots) {
  QueueInput input;
  input.queues = {Queue("a", -1), Queue("b", -1)};
  input.running = {Running("a-running", "a", 1)};
  auto r = CheckQ({Queued("a", Job("a1", 1, kCuda, 0, 1)), Queued("b", Job("b1", 1, kCuda, 0, 2))},
                  {Gpu("w", 1, 2)}, input);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r), (Outcomes{{"b1", "w:0"}, {"a1", "pending:insufficient_free_slots"}}))
      << Dump(*r);
}

TEST(SchedulerFairShareTest, BadWeightsAreRefusedNamingTheField) {
  QueueInput input;
  input.queues = {Queue("a", -1)};
  input.queues[0].weight = 0;
  auto r = Schedule({}, {Gpu("w", 1)}, input);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("queue \"a\": weight: must be finite and > 0"));
  input.queues[0].weight = 1;
  input.queues[0].owners = {QueueSpec::Owner{"alice", -2}};
  r = Schedule({}, {Gpu("w", 1)}, input);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("owner \"alice\": weight"));
  input.queues[0].owners = {QueueSpec::Owner{"alice"}, QueueSpec::Owner{"alice"}};
  r = Schedule({}, {Gpu("w", 1)}, input);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("duplicate"));
}

// ---------------------------------------------------------------------------
// Resources (CPUs and memory per rank; scheduler.h, "Resources").

absl::StatusOr<ScheduleResult> CheckR(const std::vector<PendingJob>& jobs,
                                      const std::vector<WorkerSlots>& workers) {
  absl::StatusOr<ScheduleResult> result = Schedule(jobs, workers);
  if (result.ok()) CheckResourceInvariants(jobs, workers, *result);
  return result;
}

TEST(SchedulerResourcesTest, JobsWhoseMemoryDoesNotFitTogetherGoToDifferentWorkers) {
  // By slots alone both would share a (tightest, then id); 2 x 12 GiB does
  // not fit in a's 16 GiB.
  const std::vector<WorkerSlots> two = {Sized(Cpu("a", 4), 8, 16 * kGiB),
                                        Sized(Cpu("b", 4), 8, 16 * kGiB)};
  const std::vector<PendingJob> jobs = {Needs(Job("j1", 1, kCpu, 0, 1), 0, 12 * kGiB),
                                        Needs(Job("j2", 1, kCpu, 0, 2), 0, 12 * kGiB)};
  auto r = CheckR(jobs, two);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r), (std::map<std::string, std::string>{{"j1", "a:0"}, {"j2", "b:0"}}))
      << Dump(*r);

  // One worker: the second waits, saying memory is what is short; a job
  // without resources still uses a's slots outside the reservation.
  std::vector<PendingJob> three = jobs;
  three.push_back(Job("plain", 1, kCpu, 0, 3));
  r = CheckR(three, {two[0]});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r),
            (std::map<std::string, std::string>{
                {"j1", "a:0"}, {"j2", "pending:insufficient_free_slots"}, {"plain", "a:2"}}))
      << Dump(*r);
  const PendingJobStatus& j2 = FindPending(*r, "j2");
  EXPECT_THAT(j2.message,
              HasSubstr("needs 1 cpu slots of 12 GiB memory per rank, room for 0 ranks on 1 worker "
                        "(3 of 4 slots, 4 GiB of 16 GiB memory free); first in line"));
  ASSERT_EQ(j2.reserved_slots.size(), 1u);
  EXPECT_EQ(j2.reserved_slots[0].slot, 1);
}

TEST(SchedulerResourcesTest, AJobWithResourcesSkipsWorkersThatDoNotEnforceLimits) {
  // a is the tighter fit and has more CPUs, but cannot enforce limits: a hard
  // filter (the daemon would fail the launch), not a preference.
  const std::vector<WorkerSlots> workers = {Sized(Cpu("a", 2), 64, 64 * kGiB, /*enforces=*/false),
                                            Sized(Cpu("b", 4), 8, 16 * kGiB)};
  PendingJob pids_only = Job("pids", 1, kCpu, 0, 3);
  pids_only.other_limits = true;
  auto r = CheckR({Needs(Job("limited", 2, kCpu, 0, 1), 1), Job("plain", 2, kCpu, 0, 2), pids_only},
                  workers);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r), (std::map<std::string, std::string>{
                             {"limited", "b:0,1"}, {"plain", "a:0,1"}, {"pids", "b:2"}}))
      << Dump(*r);

  r = CheckR({Needs(Job("limited", 1, kCpu), 1)}, {workers[0]});
  ASSERT_TRUE(r.ok()) << r.status();
  const PendingJobStatus& p = FindPending(*r, "limited");
  EXPECT_EQ(p.reason, PendingReason::kExceedsCapacity);
  EXPECT_THAT(
      p.message,
      HasSubstr("needs 1 cpu per rank, and no schedulable cpu worker enforces resource limits"));
}

TEST(SchedulerResourcesTest, NeverFitsNamesTheResourceAndBlocksNobody) {
  {
    auto r = CheckR({Needs(Job("j", 1, kCpu), 8), Needs(Job("after", 1, kCpu, 0, 1), 2)},
                    {Sized(Cpu("a", 4), 4, 8 * kGiB), Sized(Cpu("b", 4), 2, 64 * kGiB)});
    ASSERT_TRUE(r.ok()) << r.status();
    const PendingJobStatus& p = FindPending(*r, "j");
    EXPECT_EQ(p.reason, PendingReason::kExceedsCapacity);
    EXPECT_TRUE(p.reserved_slots.empty());
    EXPECT_THAT(
        p.message,
        HasSubstr("needs 8 cpus per rank; the largest cpu worker that enforces limits has 4 "
                  "allocatable"));
    EXPECT_EQ(Outcome(*r)["after"], "b:0") << Dump(*r);
  }
  {
    auto r = CheckR({Needs(Job("j", 1, kCuda), 0, 16 * kGiB)}, {Sized(Gpu("g", 8), 32, 8 * kGiB)});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(
        FindPending(*r, "j").message,
        HasSubstr(
            "needs 16 GiB memory per rank; the largest cuda worker that enforces limits has 8 GiB "
            "allocatable"));
  }
  {
    // Each rank fits a worker, but idle the two hold 2 such ranks, not 3.
    auto r = CheckR({Needs(Job("j", 3, kCpu), 3, kGiB)},
                    {Sized(Cpu("a", 4), 4, 8 * kGiB), Sized(Cpu("b", 4), 4, 8 * kGiB)});
    ASSERT_TRUE(r.ok()) << r.status();
    const PendingJobStatus& p = FindPending(*r, "j");
    EXPECT_EQ(p.reason, PendingReason::kExceedsCapacity);
    EXPECT_THAT(
        p.message,
        HasSubstr("needs 3 cpu slots of 3 cpus and 1 GiB memory per rank; idle, the 2 workers "
                  "that enforce limits would hold 2 such ranks (a: 1, b: 1)"));
  }
}

TEST(SchedulerResourcesTest, UnknownAllocatableDoesNotBound) {
  // 0 = the daemon could not read it: that resource does not bound the
  // worker (it still must enforce limits).
  auto r = CheckR({Needs(Job("huge", 2, kCpu), 100, 1024 * kGiB)}, {Sized(Cpu("a", 4), 0, 0)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r)["huge"], "a:0,1");
  // Known CPUs, unknown memory: CPUs bound, memory does not.
  r = CheckR({Needs(Job("j", 4, kCpu), 2, 1024 * kGiB)}, {Sized(Cpu("a", 8), 4, 0)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(FindPending(*r, "j").reason, PendingReason::kExceedsCapacity);
  EXPECT_THAT(FindPending(*r, "j").message, HasSubstr("would hold 2 such ranks"));
}

TEST(SchedulerResourcesTest, WhatRunningRanksReserveIsNotFree) {
  // 8 CPUs, 6 reserved by running ranks: 2 left.
  const WorkerSlots a =
      Sized(Cpu("a", 3, 4), 8, 16 * kGiB, true, /*reserved_cpus=*/6, /*reserved_memory=*/4 * kGiB);
  auto r = CheckR({Needs(Job("four", 1, kCpu, 0, 1), 4)}, {a});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(FindPending(*r, "four").reason, PendingReason::kInsufficientFreeSlots);
  EXPECT_THAT(FindPending(*r, "four").message, HasSubstr("2 of 8 cpus"));
  r = CheckR({Needs(Job("two", 1, kCpu, 0, 1), 2, 12 * kGiB)}, {a});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r)["two"], "a:0");
  // More reserved than allocatable (it shrank): nothing with resources fits.
  r = CheckR({Needs(Job("one", 1, kCpu), 0.5)}, {Sized(Cpu("a", 3, 4), 2, 0, true, 3)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(FindPending(*r, "one").reason, PendingReason::kInsufficientFreeSlots);
}

TEST(SchedulerResourcesTest, PacksOnTheTightestWorkerThatHasTheResources) {
  // By slots b and a tie at 8; by CPUs a holds 2 ranks of 4, b 4, c 2.
  auto r = CheckR({Needs(Job("j", 4, kCpu), 4)},
                  {Sized(Cpu("a", 8), 8, 0), Sized(Cpu("b", 8), 16, 0), Sized(Cpu("c", 2), 32, 0)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r)["j"], "b:0,1,2,3");
  // Split: the largest blocks by what fits first (b's 4 ranks, then 2 more).
  r = CheckR({Needs(Job("j", 6, kCpu), 4)},
             {Sized(Cpu("a", 8), 8, 0), Sized(Cpu("b", 8), 16, 0), Sized(Cpu("c", 2), 32, 0)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r)["j"], "b:0,1,2,3 a:0,1");
}

TEST(SchedulerResourcesTest, TheHeadHoldsCpusSoSmallerJobsCannotTakeThem) {
  // 2 CPUs are left on a; the head needs 4 (one rank). It holds the 2, so a
  // later 2-CPU job does not take them, and will not take the next 2 that
  // free up either: the head's CPUs accumulate until it fits.
  const WorkerSlots a = Sized(Cpu("a", 3, 4), 8, 0, true, /*reserved_cpus=*/6);
  auto r = CheckR({Needs(Job("head", 1, kCpu, 1, 1), 4), Needs(Job("small", 1, kCpu, 0, 2), 2),
                   Job("plain", 1, kCpu, 0, 3)},
                  {a});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r),
            (std::map<std::string, std::string>{{"head", "pending:insufficient_free_slots"},
                                                {"small", "pending:blocked_by_reservation"},
                                                {"plain", "a:1"}}))
      << Dump(*r);
  EXPECT_EQ(FindPending(*r, "small").blocked_by, "head");
  // Running ranks ended: 6 left, the head starts and the small job fits too.
  r = CheckR({Needs(Job("head", 1, kCpu, 1, 1), 4), Needs(Job("small", 1, kCpu, 0, 2), 2)},
             {Sized(Cpu("a", 3, 4), 8, 0, true, 2)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r)["head"], "a:0");
  EXPECT_EQ(Outcome(*r)["small"], "a:1");
}

TEST(SchedulerResourcesTest, AHeadShortOfCpusIsNotStarvedByAStreamOfSmallJobs) {
  // One worker, 8 slots and 8 CPUs, full of 2-CPU jobs ending one a tick; a
  // 2-CPU job arrives every tick; the oldest job needs 6 CPUs. CPUs free up
  // 2 at a time: unless the head holds them as they come, each piece goes to
  // the next small job and the head starts only after the stream stops.
  struct Live {
    int slot = 0;
    int end = 0;
    double cpus = 0;
  };
  std::map<std::string, Live> live;
  for (int i = 0; i < 4; ++i) live[absl::StrCat("init-", i)] = {i, 1 + i, 2};
  std::map<std::string, int> started;
  for (int tick = 0; tick < 120 && !started.count("big"); ++tick) {
    for (auto it = live.begin(); it != live.end();)
      it = it->second.end <= tick ? live.erase(it) : std::next(it);
    WorkerSlots a = Sized(Cpu("a", 0, 8), 8, 0);
    std::set<int> busy;
    for (const auto& [id, l] : live) busy.insert(l.slot), a.reserved_cpus += l.cpus;
    for (int s = 0; s < 8; ++s) {
      if (!busy.count(s)) a.free_slots.push_back(s);
    }
    std::vector<PendingJob> pending = {Needs(Job("big", 1, kCpu, 0, 0), 6)};
    for (int t = 0; t <= std::min(tick, 80); ++t) {
      const std::string id = absl::StrCat("small-", t);
      if (!started.count(id))
        pending.push_back(Needs(Job(id, 1, kCpu, 0, static_cast<std::uint64_t>(t + 1)), 2));
    }
    auto r = CheckR(pending, {a});
    ASSERT_TRUE(r.ok()) << r.status();
    for (const Placement& p : r->placements) {
      started[p.job_id] = tick;
      live[p.job_id] = {p.ranks[0].slot, tick + (p.job_id == "big" ? 50 : 4),
                        p.job_id == "big" ? 6.0 : 2.0};
    }
  }
  ASSERT_TRUE(started.count("big")) << "starved";
  // Ticks 1, 2, 3 free 2 CPUs each; the head holds them and starts at 3.
  EXPECT_EQ(started["big"], 3);
}

TEST(SchedulerResourcesTest, ElasticJobTakesTheRanksItsResourcesAllow) {
  PendingJob job = Needs(Job("e", 4, kCpu), 3);
  job.min_world_size = 1;
  auto r = CheckR({job}, {Sized(Cpu("a", 8), 8, 0)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r)["e"], "a:0,1");
}

TEST(SchedulerResourcesTest, HugeRequestsNeitherOverflowNorFit) {
  const int64_t huge_memory = std::numeric_limits<int64_t>::max() / 2;
  // Unknown allocatable: not a bound, whatever the size.
  auto r = CheckR({Needs(Job("j", 3, kCpu), 1e300, huge_memory)}, {Sized(Cpu("a", 4), 0, 0)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r)["j"], "a:0,1,2");
  // Known allocatable: never fits, and nothing wraps around.
  r = CheckR(
      {Needs(Job("j", 3, kCpu, 1, 1), 1e300, huge_memory), Needs(Job("k", 1, kCpu, 0, 2), 1, kGiB)},
      {Sized(Cpu("a", 4), 8, 64 * kGiB)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(FindPending(*r, "j").reason, PendingReason::kExceedsCapacity);
  EXPECT_EQ(Outcome(*r)["k"], "a:0");
}

TEST(SchedulerResourcesTest, RejectsMalformedResources) {
  const std::vector<std::pair<std::vector<PendingJob>, std::vector<WorkerSlots>>> bad = {
      {{Needs(Job("j", 1), -1)}, {}},
      {{Needs(Job("j", 1), std::nan(""))}, {}},
      {{Needs(Job("j", 1), 0, -5)}, {}},
      {{}, {Sized(Cpu("a", 1), -2, 0)}},
      {{}, {Sized(Cpu("a", 1), 1, -1)}},
      {{}, {Sized(Cpu("a", 1), 1, 1, true, std::numeric_limits<double>::infinity())}},
      {{}, {Sized(Cpu("a", 1), 1, 1, true, 0, -1)}},
  };
  const char* fields[] = {"job \"j\": cpus",
                          "job \"j\": cpus",
                          "job \"j\": memory_bytes",
                          "worker \"a\": allocatable_cpus",
                          "worker \"a\": allocatable_memory",
                          "worker \"a\": reserved_cpus",
                          "worker \"a\": reserved_memory"};
  for (size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE(fields[i]);
    absl::StatusOr<ScheduleResult> r = Schedule(bad[i].first, bad[i].second);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(fields[i]));
  }
}

// ---------------------------------------------------------------------------
// Nodes (torchrun's --nnodes): exactly N workers, world_size / N on each.

TEST(SchedulerNodesTest, SpreadsOverExactlyNWorkersTheTightestFirst) {
  // Without nodes the 4 ranks would share one worker (a, best fit).
  const std::vector<WorkerSlots> workers = {Cpu("a", 4), Cpu("b", 4), Cpu("c", 2)};
  auto plain = Check({Job("j", 4, kCpu)}, workers);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(Outcome(*plain).at("j"), "a:0,1,2,3");

  auto r = Check({OnNodes(Job("j", 4, kCpu), 2)}, workers);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->placements.size(), 1u) << Dump(*r);
  const Placement& p = r->placements[0];
  // c (2 free) is the tightest that holds 2; a before b by id. Nodes in id order.
  EXPECT_EQ(Layout(p), "a:0,1 c:0,1");
  EXPECT_EQ(p.num_nodes, 2);
  EXPECT_EQ(p.world_size, 4);
  const std::vector<std::tuple<int, std::string, int, int, int>> want = {
      {0, "a", 0, 2, 0}, {1, "a", 1, 2, 0}, {2, "c", 0, 2, 1}, {3, "c", 1, 2, 1}};
  for (int i = 0; i < 4; ++i) {
    const RankAssignment& a = p.ranks[i];
    EXPECT_EQ(std::make_tuple(a.rank, a.worker_id, a.local_rank, a.local_world_size, a.node_rank),
              want[i]);
  }

  // One rank on each of three workers, though one could hold them all.
  auto three =
      Check({OnNodes(Job("t", 3, kCpu), 3)}, {Cpu("a", 8), Cpu("b", 1), Cpu("c", 2), Cpu("d", 3)});
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(Outcome(*three).at("t"), "b:0 c:0 d:0");

  // nodes: 1 keeps every rank on one worker, where a plain job would split.
  auto one = Check({OnNodes(Job("o", 2, kCpu), 1), Job("plain", 2, kCpu, 0, 1)},
                   {Cpu("a", 1, 2), Cpu("b", 1, 2)});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(Outcome(*one).at("o"), "pending:insufficient_free_slots");
}

TEST(SchedulerNodesTest, WaitsWhileOnlyNMinusOneWorkersHaveRoomAndReserves) {
  // 5 slots free, but only a has room for 2: the job waits as the head and
  // holds what it can on its two targets; a later job takes what is left.
  auto r = Check({OnNodes(Job("big", 4, kCpu, 0, 1), 2), Job("small", 2, kCpu, 0, 2)},
                 {Cpu("a", 4), Cpu("b", 1, 4)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Outcome(*r), (std::map<std::string, std::string>{
                             {"big", "pending:insufficient_free_slots"}, {"small", "a:2,3"}}))
      << Dump(*r);
  const PendingJobStatus& big = r->pending[0];
  EXPECT_THAT(big.message, HasSubstr("needs 4 cpu slots on 2 workers, 2 on each"));
  EXPECT_THAT(big.message,
              HasSubstr("5 of 8 slots free on 2 workers, 1 of them with room for 2 ranks"));
  std::vector<std::string> held;
  for (const SlotRef& s : big.reserved_slots)
    held.push_back(absl::StrCat(s.worker_id, "/", s.slot));
  EXPECT_EQ(held, (std::vector<std::string>{"a/0", "a/1", "b/0"}));

  // Once b has a second slot free the job starts across a and b.
  auto later = Check({OnNodes(Job("big", 4, kCpu, 0, 1), 2)}, {Cpu("a", 2, 4), Cpu("b", 2, 4)});
  ASSERT_TRUE(later.ok());
  EXPECT_EQ(Outcome(*later).at("big"), "a:0,1 b:0,1");
}

TEST(SchedulerNodesTest, NeverFitsWithFewerThanNWorkersThatHoldItsShare) {
  // 6 slots in all, but only one worker could ever hold 2.
  auto r = Check({OnNodes(Job("j", 4, kCpu), 2)}, {Cpu("a", 4), Cpu("b", 1), Cpu("c", 1)});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->pending.size(), 1u);
  EXPECT_EQ(r->pending[0].reason, PendingReason::kExceedsCapacity);
  EXPECT_THAT(
      r->pending[0].message,
      HasSubstr("needs 4 cpu slots on 2 workers, 2 on each (scheduling.nodes), and 1 of the 3 "
                "schedulable "
                "workers of its kind has 2 slots or more; it cannot fit until workers join"));
  EXPECT_TRUE(r->pending[0].reserved_slots.empty());
  // More nodes than workers.
  auto more = Check({OnNodes(Job("m", 3, kCpu), 3)}, {Cpu("a", 4), Cpu("b", 4)});
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(more->pending[0].reason, PendingReason::kExceedsCapacity);
}

TEST(SchedulerNodesTest, InvalidNodesStayPendingAsInvalid) {
  PendingJob elastic = OnNodes(Job("e", 4, kCpu), 2);
  elastic.min_world_size = 2;
  auto r = Check({OnNodes(Job("odd", 3, kCpu), 2), OnNodes(Job("neg", 2, kCpu), -1), elastic,
                  Job("ok", 1, kCpu)},
                 {Cpu("a", 4), Cpu("b", 4)});
  ASSERT_TRUE(r.ok()) << r.status();
  std::map<std::string, std::string> why;
  for (const PendingJobStatus& p : r->pending) {
    EXPECT_EQ(p.reason, PendingReason::kInvalidJob) << p.job_id;
    why[p.job_id] = p.message;
  }
  EXPECT_THAT(why["odd"], HasSubstr("world_size 3 is not a multiple of nodes (2)"));
  EXPECT_THAT(why["neg"], HasSubstr("nodes must be >= 0"));
  EXPECT_THAT(why["e"], HasSubstr("does not combine with an elastic world size"));
  EXPECT_EQ(Outcome(*r).at("ok"), "a:0");
}

TEST(SchedulerNodesTest, AvoidanceAndResourcesCountWholeHosts) {
  // Avoiding a, two other workers still have room for one rank each.
  PendingJob avoid = OnNodes(Job("j", 2, kCpu), 2);
  avoid.avoid_workers = {"a"};
  auto r = Check({avoid}, {Cpu("a", 1), Cpu("b", 1), Cpu("c", 1)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r).at("j"), "b:0 c:0");

  // 2 cpus per rank: b has CPUs for none, c for one, a for four: a and c.
  const std::vector<WorkerSlots> sized = {Sized(Cpu("a", 4), 8, 0), Sized(Cpu("b", 4), 1, 0),
                                          Sized(Cpu("c", 4), 2, 0)};
  auto res = Schedule({OnNodes(Needs(Job("r", 2, kCpu), 2), 2)}, sized);
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(Outcome(*res).at("r"), "a:0 c:0") << Dump(*res);
  auto too_big = Schedule({OnNodes(Needs(Job("r", 4, kCpu), 2), 2)}, sized);
  ASSERT_TRUE(too_big.ok());
  EXPECT_EQ(too_big->pending[0].reason, PendingReason::kExceedsCapacity) << Dump(*too_big);
}

// The worked example of issue #26 with A's job on exactly 2 workers: it
// preempts B's borrowing job as any job would, holds what it can, and once
// B's job is gone starts with one rank on each worker.
TEST(SchedulerNodesTest, ReclaimsBorrowedQuotaByPreemptionAndStartsOnItsNodes) {
  QueueInput input;
  input.queues = {Queue("A", 2, -1, "c"), Queue("B", 2, -1, "c")};
  std::vector<PendingJob> jobs = {Queued("A", OnNodes(Job("a-job", 2, kCuda, 0, 10), 2))};
  input.running = {Running("b-job", "B", 4, 0, 1)};
  auto r1 = Schedule(jobs, {Gpu("w1", 0, 2), Gpu("w2", 0, 2)}, input);
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_EQ(r1->preemptions.size(), 1u) << Dump(*r1);
  EXPECT_EQ(r1->preemptions[0].victim_job_id, "b-job");
  ASSERT_EQ(r1->pending.size(), 1u);
  EXPECT_EQ(r1->pending[0].reason, PendingReason::kPreempting);
  EXPECT_THAT(r1->pending[0].message, HasSubstr("needs 2 cuda slots on 2 workers, 1 on each"));

  input.running.clear();
  auto r2 = Schedule(jobs, {Gpu("w1", 2), Gpu("w2", 2)}, input);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(Outcome(*r2).at("a-job"), "w1:0 w2:0") << Dump(*r2);
  EXPECT_TRUE(r2->preemptions.empty());
}

}  // namespace
}  // namespace trainctl::scheduler
