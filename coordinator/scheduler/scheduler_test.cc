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

const PendingJobStatus& FindPending(const ScheduleResult& r, const std::string& id) {
  for (const PendingJobStatus& p : r.pending) {
    if (p.job_id == id) return p;
  }
  ADD_FAILURE() << id << " is not pending";
  static const PendingJobStatus none;
  return none;
}

TEST(SchedulerTest, AvoidedWorkersAreSkippedWhenTheOthersSuffice) {
  PendingJob j = Job("j", 2);
  j.avoid_workers = {"a"};
  // a would be the tightest fit; b and c hold the job without it.
  std::vector<PendingJob> jobs{j};
  std::vector<WorkerSlots> w1{Gpu("a", 2), Gpu("b", 1), Gpu("c", 4)};
  auto r = Schedule(jobs, w1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r), (std::map<std::string, std::string>{{"j", "c:0,1"}}));
  // Without enough elsewhere, the avoided worker is used as any other.
  std::vector<WorkerSlots> w2{Gpu("a", 2), Gpu("b", 1)};
  r = Schedule(jobs, w2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r), (std::map<std::string, std::string>{{"j", "a:0,1"}}));
  jobs[0].avoid_workers = {"b"};
  std::vector<WorkerSlots> w3{Gpu("a", 1), Gpu("b", 1), Gpu("c", 1)};
  r = Schedule(jobs, w3);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Outcome(*r), (std::map<std::string, std::string>{{"j", "a:0 c:0"}}));
}

TEST(SchedulerTest, PendingMessages) {
  {
    auto r = Check({Job("j", 4)}, {Gpu("a", 2, 4), Gpu("b", 0, 4)});
    ASSERT_TRUE(r.ok());
    EXPECT_THAT(FindPending(*r, "j").message,
                HasSubstr("needs 4 cuda slots, 2 of 8 free on 2 workers"));
  }
  {
    auto r = Check({Job("j", 1, kCuda)}, {Cpu("c", 4)});
    ASSERT_TRUE(r.ok());
    EXPECT_THAT(FindPending(*r, "j").message, HasSubstr("no schedulable worker has cuda slots"));
  }
  {
    auto r = Check({Job("j", 9, kCuda)}, {Gpu("a", 4), Gpu("b", 0, 4)});
    ASSERT_TRUE(r.ok());
    EXPECT_THAT(FindPending(*r, "j").message,
                HasSubstr("needs 9 cuda slots, the cluster has 8 in total across 2 workers"));
  }
  {
    auto r = Check({Job("j", 0)}, {Gpu("a", 4)});
    ASSERT_TRUE(r.ok());
    EXPECT_THAT(FindPending(*r, "j").message, HasSubstr("world_size must be >= 1, got 0"));
  }
  {
    auto r = Check({Job("big", 4, kCuda, 1, 1), Job("small", 2, kCuda, 0, 2)}, {Gpu("a", 3, 4)});
    ASSERT_TRUE(r.ok());
    const PendingJobStatus& small = FindPending(*r, "small");
    EXPECT_EQ(small.reason, PendingReason::kBlockedByReservation);
    EXPECT_EQ(small.blocked_by, "big");
    EXPECT_THAT(small.message, HasSubstr("waiting behind job big (priority 1, reserved)"));
  }
}

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
  EXPECT_EQ(Outcome(*full), (std::map<std::string, std::string>{{"e", "a:0 b:0 c:0"}})) << Dump(*full);

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
  EXPECT_EQ(Outcome(*one), (std::map<std::string, std::string>{{"e", "pending:insufficient_free_slots"},
                                                               {"p", "pending:blocked_by_reservation"}}))
      << Dump(*one);
  EXPECT_THAT(FindPending(*one, "e").message, HasSubstr("needs at least 2 (elastic, up to 3) cpu slots"));

  // Capacity below the minimum never fits; at the minimum it does.
  auto small = Check({Elastic("e", 4, 3)}, {Cpu("a", 2)});
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(Outcome(*small), (std::map<std::string, std::string>{{"e", "pending:exceeds_capacity"}}));
  auto enough = Check({Elastic("e", 4, 2)}, {Cpu("a", 2)});
  ASSERT_TRUE(enough.ok());
  EXPECT_EQ(Outcome(*enough), (std::map<std::string, std::string>{{"e", "a:0,1"}})) << Dump(*enough);
}

}  // namespace
}  // namespace trainctl::scheduler

