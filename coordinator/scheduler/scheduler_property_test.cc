// Randomized properties of the scheduler (fixed seeds): invariants on random
// clusters, determinism under permuted input, and no starvation; with
// queues: quota kept except by borrowing, gangs whole, victims eligible,
// sufficient and no more than needed, determinism, no starvation of a queue
// under its nominal quota, and no queues == one unlimited "default" queue;
// with resources: no worker over-committed, gangs whole, no starvation, and
// jobs without resources placed exactly as before.
#include "coordinator/scheduler/scheduler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/scheduler/scheduler_test_support.h"
#include "gtest/gtest.h"

namespace trainctl::scheduler {
namespace {

// ---------------------------------------------------------------------------
// Randomized properties (fixed seeds).

int uniform_int(std::mt19937& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

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
  int backfills = 0;
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
    // With every job's duration as its runtime bound, short jobs backfill
    // into the head's reservation (scheduler.h, Backfill by runtime), and
    // still every job starts: backfill never starves the head.
    SimResult bounded = Simulate(workers, jobs, 2000, {}, /*bounds=*/true);
    EXPECT_EQ(bounded.start_tick.size(), jobs.size());
    backfills += bounded.backfills;
    if (HasFailure()) return;
  }
  EXPECT_GT(backfills, 0) << "no backfill in 150 random clusters: the test no longer exercises it";
}

// Jobs with nodes (torchrun's --nnodes) mixed into random clusters: every
// placement spans exactly `nodes` workers with world_size / nodes ranks on
// each, the tightest hosts; pending reasons count whole hosts (the
// invariant checker applies both); the result does not depend on input
// order. A second generator draws them, so the
// tests above keep their inputs.
RandomInput WithNodes(RandomInput in, std::mt19937& rng) {
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (PendingJob& job : in.jobs) {
    if (uniform(0, 2) != 0) continue;
    job.nodes = uniform(0, 12) == 0 ? uniform(-1, 3) : uniform(1, 3);
    if (uniform(0, 6) != 0) job.world_size = std::max(1, job.nodes) * uniform(1, 4);
  }
  return in;
}

TEST(SchedulerPropertyTest, NodesJobsSpanExactlyTheirNodes) {
  std::mt19937 rng(4404), nodes_rng(8);
  int spread = 0, waiting = 0, never = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    RandomInput in = WithNodes(RandomCluster(rng), nodes_rng);
    SCOPED_TRACE(iter);
    absl::StatusOr<ScheduleResult> r = Schedule(in.jobs, in.workers);
    ASSERT_TRUE(r.ok()) << r.status();
    CheckInvariants(in.jobs, in.workers, *r);
    if (HasFatalFailure() || HasNonfatalFailure()) FAIL() << "result:\n" << Dump(*r);
    RandomInput shuffled = in;
    std::shuffle(shuffled.jobs.begin(), shuffled.jobs.end(), rng);
    std::shuffle(shuffled.workers.begin(), shuffled.workers.end(), rng);
    absl::StatusOr<ScheduleResult> again = Schedule(shuffled.jobs, shuffled.workers);
    ASSERT_TRUE(again.ok());
    ASSERT_EQ(Dump(*again), Dump(*r)) << "depends on input order";
    std::map<std::string, const PendingJob*> by_id;
    for (const PendingJob& j : in.jobs) by_id[j.job_id] = &j;
    for (const Placement& p : r->placements) spread += by_id[p.job_id]->nodes > 1;
    for (const PendingJobStatus& p : r->pending) {
      if (by_id[p.job_id]->nodes <= 0) continue;
      waiting += p.reason == PendingReason::kInsufficientFreeSlots;
      never += p.reason == PendingReason::kExceedsCapacity;
    }
  }
  EXPECT_GT(spread, 300);
  EXPECT_GT(waiting, 100);
  EXPECT_GT(never, 100);
}

TEST(SchedulerPropertyTest, NodesJobsThatFitEventuallyRun) {
  // As EveryJobThatFitsEventuallyRuns, with a third of the jobs on exactly
  // `nodes` workers: a head with nodes holds its targets until it starts.
  std::mt19937 rng(4405);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int with_nodes = 0;
  for (int iter = 0; iter < 150; ++iter) {
    SCOPED_TRACE(iter);
    std::vector<WorkerSlots> workers;
    const int num_workers = uniform(1, 5);
    for (int w = 0; w < num_workers; ++w) {
      workers.push_back(Worker(absl::StrCat("w", w), SlotKind::kCpu, {}, uniform(1, 8)));
    }
    std::vector<SimJob> jobs;
    const int num_jobs = uniform(5, 40);
    for (int j = 0; j < num_jobs; ++j) {
      SimJob sj;
      sj.spec = Job(absl::StrCat("j", j), uniform(1, 4), kCpu, uniform(0, 2),
                    static_cast<std::uint64_t>(j));
      if (uniform(0, 2) == 0) {
        sj.spec.nodes = uniform(1, 3);
        sj.spec.world_size = sj.spec.nodes * uniform(1, 3);
      }
      sj.arrival = uniform(0, 30);
      sj.duration = uniform(1, 6);
      const int per = sj.spec.nodes > 0 ? sj.spec.world_size / sj.spec.nodes : 1;
      int hosts = 0, capacity = 0;
      for (const WorkerSlots& w : workers) hosts += w.total_slots >= per, capacity += w.total_slots;
      if (sj.spec.world_size > capacity || hosts < std::max(1, sj.spec.nodes))
        continue;  // never fits
      with_nodes += sj.spec.nodes > 1;
      jobs.push_back(sj);
    }
    SimResult sim = Simulate(workers, jobs, 2000);
    EXPECT_EQ(sim.start_tick.size(), jobs.size());
    if (HasFailure()) return;
  }
  EXPECT_GT(with_nodes, 300);
}

// ---------------------------------------------------------------------------
// Queues (fixed seeds).

struct RandomQueueInput {
  std::vector<PendingJob> jobs;
  std::vector<WorkerSlots> workers;
  QueueInput queues;
};

// Random queues (finite, unlimited and zero quotas; cohorts, mostly one
// shared; size limits; usage), running jobs (some stopping), RandomCluster's
// workers and jobs of modest size, each job in a random queue (a few
// undefined).
// `limits`: draw borrowing and lending limits too (an oracle that models
// none passes false).
RandomQueueInput RandomQueues(std::mt19937& rng, int max_jobs = 12, bool limits = true) {
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  RandomQueueInput in;
  in.workers = RandomCluster(rng).workers;
  auto nominal = [&] { return uniform(0, 3) == 0 ? -1 : uniform(0, 8); };
  const int num_queues = uniform(1, 4);
  for (int q = 0; q < num_queues; ++q) {
    QueueSpec spec;
    spec.name = q == 0 && uniform(0, 1) ? "default" : absl::StrCat("q", q);
    spec.nominal_gpu = nominal();
    spec.nominal_cpu = nominal();
    const int cohort = uniform(0, 4);
    spec.cohort = cohort == 0 ? "" : cohort == 1 ? "c2" : "c1";
    spec.max_job_size = uniform(0, 4) == 0 ? uniform(1, 6) : 0;
    // Borrowing and lending limits on about one queue in three (a lending
    // limit above the nominal reads as the nominal).
    auto limit = [&] { return uniform(0, 2) == 0 && limits ? uniform(0, 9) : -1; };
    spec.borrowing_limit_gpu = limit();
    spec.borrowing_limit_cpu = limit();
    spec.lending_limit_gpu = limit();
    spec.lending_limit_cpu = limit();
    spec.usage_gpu = uniform(0, 2) == 0 ? 0 : uniform(0, 40) / 4.0;
    spec.usage_cpu = uniform(0, 2) == 0 ? 0 : uniform(0, 40) / 4.0;
    in.queues.queues.push_back(std::move(spec));
  }
  auto some_queue = [&] { return in.queues.queues[uniform(0, num_queues - 1)].name; };
  const int num_jobs = uniform(0, max_jobs);
  for (int j = 0; j < num_jobs; ++j) {
    PendingJob job;
    job.job_id = absl::StrCat("j", j);
    job.world_size = uniform(0, 30) == 0 ? 0 : uniform(1, uniform(0, 3) == 0 ? 12 : 4);
    job.device = static_cast<DeviceRequirement>(uniform(0, 2));
    job.priority = uniform(0, 2);
    job.submit_seq = static_cast<std::uint64_t>(uniform(0, 20));
    const int pick = uniform(0, 29);
    job.queue = pick == 0 ? "nope" : pick == 1 ? "" : some_queue();
    if (uniform(0, 5) == 0 && job.world_size > 1)
      job.min_world_size = uniform(1, job.world_size - 1);
    in.jobs.push_back(std::move(job));
  }
  const int num_running = uniform(0, 10);
  for (int r = 0; r < num_running; ++r) {
    RunningJob job;
    job.job_id = absl::StrCat("r", r);
    job.queue = some_queue();
    job.kind = uniform(0, 2) == 0 ? SlotKind::kCpu : SlotKind::kGpu;
    job.slots = uniform(0, 12) == 0 ? 0 : uniform(1, 5);
    job.priority = uniform(0, 2);
    job.start_seq = static_cast<std::uint64_t>(uniform(0, 20));
    job.stopping = uniform(0, 6) == 0;
    in.queues.running.push_back(std::move(job));
  }
  return in;
}

TEST(SchedulerQueuePropertyTest, InvariantsOnRandomQueues) {
  std::mt19937 rng(20260126);
  std::map<std::string, int> seen;
  for (int iter = 0; iter < 6000; ++iter) {
    RandomQueueInput in = RandomQueues(rng);
    SCOPED_TRACE(iter);
    absl::StatusOr<ScheduleResult> r = Schedule(in.jobs, in.workers, in.queues);
    ASSERT_TRUE(r.ok()) << r.status();
    CheckQueueInvariants(in.jobs, in.workers, in.queues, *r);
    if (HasFailure()) FAIL() << "result:\n" << Dump(*r);
    seen["placed"] += static_cast<int>(r->placements.size());
    seen["victims"] += static_cast<int>(r->preemptions.size());
    for (const PendingJobStatus& p : r->pending) ++seen[PendingReasonName(p.reason)];
    // Placements beyond the queue's own nominal (borrowing).
    std::map<std::pair<std::string, SlotKind>, long long> used;
    for (const RunningJob& j : in.queues.running) used[{j.queue, j.kind}] += j.slots;
    std::map<std::string, const PendingJob*> by_id;
    for (const PendingJob& j : in.jobs) by_id[j.job_id] = &j;
    for (const Placement& p : r->placements) {
      const std::string queue = by_id[p.job_id]->queue.empty() ? "default" : by_id[p.job_id]->queue;
      used[{queue, p.kind}] += p.world_size;
      for (const QueueSpec& q : in.queues.queues) {
        const int nominal = p.kind == SlotKind::kGpu ? q.nominal_gpu : q.nominal_cpu;
        if (q.name == queue && nominal >= 0 && used[{queue, p.kind}] > nominal) ++seen["borrowed"];
      }
    }
  }
  // The generator exercises every path.
  for (const char* what :
       {"placed", "borrowed", "victims", "preempting", "quota_exceeded", "exceeds_queue_limit",
        "unknown_queue", "insufficient_free_slots", "blocked_by_reservation"}) {
    EXPECT_GT(seen[what], 30) << what;
  }
}

TEST(SchedulerQueuePropertyTest, DeterministicUnderPermutedInput) {
  std::mt19937 rng(11);
  for (int iter = 0; iter < 2000; ++iter) {
    RandomQueueInput in = RandomQueues(rng);
    SCOPED_TRACE(iter);
    absl::StatusOr<ScheduleResult> want = Schedule(in.jobs, in.workers, in.queues);
    ASSERT_TRUE(want.ok());
    for (int perm = 0; perm < 3; ++perm) {
      RandomQueueInput shuffled = in;
      std::shuffle(shuffled.jobs.begin(), shuffled.jobs.end(), rng);
      std::shuffle(shuffled.workers.begin(), shuffled.workers.end(), rng);
      for (WorkerSlots& w : shuffled.workers)
        std::shuffle(w.free_slots.begin(), w.free_slots.end(), rng);
      std::shuffle(shuffled.queues.queues.begin(), shuffled.queues.queues.end(), rng);
      std::shuffle(shuffled.queues.running.begin(), shuffled.queues.running.end(), rng);
      absl::StatusOr<ScheduleResult> got =
          Schedule(shuffled.jobs, shuffled.workers, shuffled.queues);
      ASSERT_TRUE(got.ok());
      ASSERT_EQ(Dump(*got), Dump(*want));
    }
  }
}

// The hard requirement: without queues the result is the same as with
// every job (and running job) in one unlimited "default" queue, and the
// same as the two-argument Schedule().
TEST(SchedulerQueuePropertyTest, NoQueuesEqualsOneUnlimitedDefaultQueue) {
  std::mt19937 rng(26);
  int compared = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    RandomQueueInput in = RandomQueues(rng);
    SCOPED_TRACE(iter);
    QueueInput none;
    none.running = in.queues.running;  // in whatever queues they name
    absl::StatusOr<ScheduleResult> without = Schedule(in.jobs, in.workers, none);
    absl::StatusOr<ScheduleResult> plain = Schedule(in.jobs, in.workers);
    ASSERT_TRUE(without.ok() && plain.ok());
    ASSERT_EQ(Dump(*without), Dump(*plain));
    CheckInvariants(in.jobs, in.workers, *without);

    RandomQueueInput one = in;
    QueueSpec unlimited;
    unlimited.name = "default";
    unlimited.usage_gpu = iter % 7;  // usage alone changes nothing
    one.queues.queues = {unlimited};
    for (PendingJob& j : one.jobs) j.queue = iter % 2 ? "default" : "";
    for (RunningJob& r : one.queues.running) r.queue = iter % 3 ? "default" : "";
    absl::StatusOr<ScheduleResult> with = Schedule(one.jobs, one.workers, one.queues);
    ASSERT_TRUE(with.ok()) << with.status();
    ASSERT_EQ(Dump(*with), Dump(*without));
    EXPECT_TRUE(with->preemptions.empty());
    compared += !with->placements.empty();
  }
  EXPECT_GT(compared, 1000);
}

// With a single pending job nothing else takes slots or quota first, so the
// victim rule can be replayed exactly: blocked (and not merely borrowing),
// the job picks eligible candidates in victim order until slots and quota
// (its group's and its queue's own) suffice, and picks none when they never
// do or stopping jobs already do.
TEST(SchedulerQueuePropertyTest, VictimsAreEligibleSufficientAndNoMoreThanNeeded) {
  std::mt19937 rng(3);
  int preempted = 0, waited = 0, refused = 0;
  for (int iter = 0; iter < 40000; ++iter) {
    // This oracle models quotas without borrowing or lending limits (the
    // invariant checker covers those on every other random input).
    RandomQueueInput in = RandomQueues(rng, /*max_jobs=*/1, /*limits=*/false);
    if (in.jobs.empty()) continue;
    SCOPED_TRACE(iter);
    absl::StatusOr<ScheduleResult> r = Schedule(in.jobs, in.workers, in.queues);
    ASSERT_TRUE(r.ok()) << r.status();
    CheckQueueInvariants(in.jobs, in.workers, in.queues, *r);

    const PendingJob& job = in.jobs[0];
    std::map<SlotKind, long long> capacity, free;
    for (const WorkerSlots& w : in.workers) {
      if (!w.schedulable) continue;
      capacity[w.kind] += w.total_slots;
      free[w.kind] += static_cast<long long>(w.free_slots.size());
    }
    const SlotKind kind = job.device == kCpu             ? SlotKind::kCpu
                          : job.device == kCuda          ? SlotKind::kGpu
                          : capacity[SlotKind::kGpu] > 0 ? SlotKind::kGpu
                                                         : SlotKind::kCpu;
    const long long need = job.min_world_size >= 1 && job.min_world_size < job.world_size
                               ? job.min_world_size
                               : job.world_size;
    auto nominal = [&](const QueueSpec& q) -> long long {
      return kind == SlotKind::kGpu ? q.nominal_gpu : q.nominal_cpu;
    };
    const QueueSpec* queue = nullptr;
    for (const QueueSpec& q : in.queues.queues) {
      if (q.name == (job.queue.empty() ? "default" : job.queue)) queue = &q;
    }
    auto in_group = [&](const QueueSpec& q) {
      return nominal(q) >= 0 &&
             (q.name == queue->name || (!queue->cohort.empty() && q.cohort == queue->cohort));
    };
    const bool eligible_job = job.world_size >= 1 && queue != nullptr && nominal(*queue) >= 0 &&
                              (queue->max_job_size == 0 || need <= queue->max_job_size) &&
                              need <= capacity[kind];
    long long group_nominal = 0, group_used = 0, group_stopping = 0, queue_used = 0, stopping = 0;
    std::map<std::string, long long> used, queue_stopping;
    if (eligible_job) {
      for (const QueueSpec& q : in.queues.queues) group_nominal += in_group(q) ? nominal(q) : 0;
      for (const RunningJob& run : in.queues.running) {
        if (run.kind != kind) continue;
        used[run.queue] += run.slots;
        if (run.stopping) stopping += run.slots, queue_stopping[run.queue] += run.slots;
      }
      for (const QueueSpec& q : in.queues.queues) {
        if (!in_group(q)) continue;
        group_used += used[q.name];
        group_stopping += queue_stopping[q.name];
      }
      queue_used = used[queue->name];
    }
    // Every admission but borrowing may preempt when blocked: within its
    // nominal (blocked for slots or by lent quota), or over it (then only
    // its queue's lower-priority jobs can make room: the queue condition in
    // `enough`).
    const bool over_own = eligible_job && queue_used + need > nominal(*queue);
    const bool group_fits = group_used + need <= group_nominal;
    const bool tries = eligible_job && need <= group_nominal && !(over_own && group_fits);
    const bool blocked = free[kind] < need || !group_fits || over_own;
    if (!tries || !blocked) {
      EXPECT_TRUE(r->preemptions.empty()) << Dump(*r);
      continue;
    }
    // Replay the rule.
    std::vector<const RunningJob*> candidates;
    for (const RunningJob& run : in.queues.running) {
      if (run.kind != kind || run.stopping || run.slots == 0) continue;
      const QueueSpec* rq = nullptr;
      for (const QueueSpec& q : in.queues.queues) rq = q.name == run.queue ? &q : rq;
      if (run.queue == queue->name ? run.priority < job.priority : in_group(*rq)) {
        candidates.push_back(&run);
      }
    }
    std::sort(candidates.begin(), candidates.end(), [](const RunningJob* a, const RunningJob* b) {
      return std::make_tuple(a->priority, -static_cast<long long>(a->start_seq), a->slots,
                             a->job_id) < std::make_tuple(b->priority,
                                                          -static_cast<long long>(b->start_seq),
                                                          b->slots, b->job_id);
    });
    long long picked = 0;
    std::map<std::string, long long> picked_from;
    auto enough = [&] {
      return free[kind] + stopping + picked >= need &&
             group_used - group_stopping - picked + need <= group_nominal &&
             queue_used - queue_stopping[queue->name] - picked_from[queue->name] + need <=
                 nominal(*queue);
    };
    std::vector<std::string> want;
    bool ok = enough();
    for (const RunningJob* c : candidates) {
      if (ok) break;
      if (c->queue != queue->name) {
        const QueueSpec* cq = nullptr;
        for (const QueueSpec& q : in.queues.queues) cq = q.name == c->queue ? &q : cq;
        if (used[c->queue] - queue_stopping[c->queue] - picked_from[c->queue] <= nominal(*cq)) {
          continue;
        }
      }
      want.push_back(absl::StrCat(c->job_id, ">", job.job_id));
      picked += c->slots;
      picked_from[c->queue] += c->slots;
      ok = enough();
    }
    if (!ok) want.clear();
    std::vector<std::string> got;
    for (const Preemption& p : r->preemptions) got.push_back(p.victim_job_id + ">" + p.for_job_id);
    ASSERT_EQ(got, want) << Dump(*r);
    ASSERT_EQ(r->pending.size(), 1u);
    if (ok) {
      EXPECT_EQ(r->pending[0].reason, PendingReason::kPreempting) << Dump(*r);
      (want.empty() ? waited : preempted)++;
    } else {
      EXPECT_NE(r->pending[0].reason, PendingReason::kPreempting) << Dump(*r);
      ++refused;
    }
    if (HasFailure()) return;
  }
  EXPECT_GT(preempted, 100);
  EXPECT_GT(waited, 20);
  EXPECT_GT(refused, 100);
}

// A cluster whose capacity covers every queue's nominal quota, running
// random jobs (some borrowing) through passes: finished jobs leave,
// victims stop a tick or two after they are picked and go back to pending
// with the work they had left, usage decays. Every job, borrower or not,
// eventually runs to completion: in particular no queue under its nominal
// quota starves.
TEST(SchedulerQueuePropertyTest, NoQueueUnderItsNominalQuotaStarves) {
  std::mt19937 rng(126);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int preemptions = 0, borrowed = 0;
  for (int iter = 0; iter < 200; ++iter) {
    SCOPED_TRACE(iter);
    // Workers of both kinds; quotas summing to at most the capacity.
    std::vector<WorkerSlots> workers;
    std::map<SlotKind, int> capacity;
    const int num_workers = uniform(1, 4);
    for (int w = 0; w < num_workers; ++w) {
      const SlotKind kind = w == 0               ? SlotKind::kGpu
                            : uniform(0, 2) == 0 ? SlotKind::kCpu
                                                 : SlotKind::kGpu;
      const int total = uniform(2, 8);
      workers.push_back(Worker(absl::StrCat("w", w), kind, {}, total));
      capacity[kind] += total;
    }
    QueueInput input;
    const int num_queues = uniform(2, 4);
    std::map<SlotKind, int> left = capacity;
    for (int q = 0; q < num_queues; ++q) {
      QueueSpec spec = Queue(absl::StrCat("q", q), 0, 0, uniform(0, 2) ? "c" : "");
      spec.nominal_gpu = uniform(0, left[SlotKind::kGpu] / (num_queues - q));
      spec.nominal_cpu = uniform(0, left[SlotKind::kCpu] / (num_queues - q));
      left[SlotKind::kGpu] -= spec.nominal_gpu;
      left[SlotKind::kCpu] -= spec.nominal_cpu;
      input.queues.push_back(spec);
    }
    auto group_nominal = [&](const QueueSpec& of, SlotKind k) {
      int sum = 0;
      for (const QueueSpec& q : input.queues) {
        if (q.name == of.name || (!of.cohort.empty() && q.cohort == of.cohort)) {
          sum += k == SlotKind::kGpu ? q.nominal_gpu : q.nominal_cpu;
        }
      }
      return sum;
    };
    struct Work {
      PendingJob spec;
      int arrival = 0;
      int left = 0;  // ticks of work left
    };
    std::vector<Work> work;
    const int num_jobs = uniform(5, 30);
    for (int j = 0; j < num_jobs; ++j) {
      const QueueSpec& q = input.queues[uniform(0, num_queues - 1)];
      const SlotKind kind = uniform(0, 3) == 0 ? SlotKind::kCpu : SlotKind::kGpu;
      const int most = group_nominal(q, kind);
      if (most == 0) continue;
      const int own = kind == SlotKind::kGpu ? q.nominal_gpu : q.nominal_cpu;
      // Mostly within the queue's own nominal; some must borrow.
      const int size = own > 0 && uniform(0, 3) ? uniform(1, own) : uniform(1, most);
      Work w{Queued(q.name, Job(absl::StrCat("j", j), size, kind == SlotKind::kGpu ? kCuda : kCpu,
                                uniform(0, 2), static_cast<std::uint64_t>(j))),
             uniform(0, 30), uniform(1, 8)};
      work.push_back(w);
    }
    struct Live {
      RunningJob job;
      std::vector<std::pair<std::string, int>> slots;
      int end = 0;
      int stop_at = -1;
      Work* work = nullptr;
    };
    std::map<std::string, Live> live;
    std::map<std::string, Work*> pending;
    std::set<std::string> done;
    std::uint64_t start_seq = 0;
    for (int tick = 0; tick < 3000 && done.size() < work.size(); ++tick) {
      for (Work& w : work) {
        if (w.arrival == tick) pending[w.spec.job_id] = &w;
      }
      for (auto it = live.begin(); it != live.end();) {
        Live& l = it->second;
        if (l.end <= tick) {
          done.insert(it->first);
        } else if (l.stop_at >= 0 && l.stop_at <= tick) {
          l.work->left = l.end - tick;  // resumes from its checkpoint
          pending[it->first] = l.work;
        } else {
          ++it;
          continue;
        }
        it = live.erase(it);
      }
      // Usage: decayed slot-ticks (half-life of about 3 ticks).
      for (QueueSpec& q : input.queues) q.usage_gpu *= 0.8, q.usage_cpu *= 0.8;
      std::map<std::string, std::set<int>> busy;
      input.running.clear();
      for (const auto& [id, l] : live) {
        for (const auto& [w, s] : l.slots) busy[w].insert(s);
        RunningJob r = l.job;
        r.stopping = l.stop_at >= 0;
        input.running.push_back(r);
        for (QueueSpec& q : input.queues) {
          if (q.name != r.queue) continue;
          (r.kind == SlotKind::kGpu ? q.usage_gpu : q.usage_cpu) += r.slots;
        }
      }
      for (WorkerSlots& w : workers) {
        w.free_slots.clear();
        for (int s = 0; s < w.total_slots; ++s) {
          if (!busy[w.worker_id].count(s)) w.free_slots.push_back(s);
        }
      }
      std::vector<PendingJob> jobs;
      for (const auto& [id, w] : pending) jobs.push_back(w->spec);
      absl::StatusOr<ScheduleResult> r = CheckQ(jobs, workers, input);
      ASSERT_TRUE(r.ok()) << r.status();
      if (HasFailure()) FAIL() << "tick " << tick << "\n" << Dump(*r);
      for (const Preemption& p : r->preemptions) {
        live.at(p.victim_job_id).stop_at = tick + uniform(1, 2);
        ++preemptions;
      }
      for (const Placement& p : r->placements) {
        Work* w = pending.at(p.job_id);
        Live l{
            Running(p.job_id, w->spec.queue, p.world_size, w->spec.priority, start_seq++, p.kind),
            {},
            tick + w->left,
            -1,
            w};
        for (const RankAssignment& a : p.ranks) l.slots.push_back({a.worker_id, a.slot});
        live[p.job_id] = l;
        pending.erase(p.job_id);
        const QueueSpec& q =
            *std::find_if(input.queues.begin(), input.queues.end(),
                          [&](const QueueSpec& s) { return s.name == w->spec.queue; });
        long long used = 0;
        for (const auto& [id, other] : live) {
          used += other.job.queue == q.name && other.job.kind == p.kind ? other.job.slots : 0;
        }
        borrowed += used > (p.kind == SlotKind::kGpu ? q.nominal_gpu : q.nominal_cpu);
      }
    }
    EXPECT_EQ(done.size(), work.size()) << "some job never finished";
    if (HasFailure()) {
      for (const auto& [id, w] : pending) ADD_FAILURE() << "still pending: " << id;
      return;
    }
  }
  // The generator exercises borrowing and reclaiming.
  EXPECT_GT(borrowed, 200);
  EXPECT_GT(preemptions, 80);
}

// ---------------------------------------------------------------------------
// Resources (fixed seeds).

// What workers report, at random: allocatable CPUs and memory (0 =
// unknown), whether they enforce limits, and what running ranks reserve
// (now and then more than the allocatable). Values are exact in binary so
// that the checker's plain arithmetic agrees with the scheduler's.
void RandomWorkerResources(std::mt19937& rng, std::vector<WorkerSlots>& workers) {
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (WorkerSlots& w : workers) {
    const int cpus[] = {0, 2, 4, 8, 16};
    const int gib[] = {0, 4, 8, 16, 32};
    w.allocatable_cpus = cpus[uniform(0, 4)];
    w.allocatable_memory = gib[uniform(0, 4)] * kGiB;
    w.enforces_limits = uniform(0, 4) != 0;
    w.reserved_cpus = uniform(0, 2) == 0 ? 0 : uniform(0, 20) / 2.0;
    w.reserved_memory = uniform(0, 2) == 0 ? 0 : uniform(0, 40) * (kGiB / 2);
  }
}

// Some jobs ask for resources: CPUs, memory, both, or a pids limit only.
void RandomJobResources(std::mt19937& rng, std::vector<PendingJob>& jobs) {
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (PendingJob& j : jobs) {
    const double cpus[] = {0, 0.5, 1, 1.5, 2, 4, 8};
    const int gib[] = {0, 1, 2, 4, 8, 16, 64};
    switch (uniform(0, 4)) {
      case 0:
        break;  // none
      case 1:
        j.cpus = cpus[uniform(1, 6)];
        break;
      case 2:
        j.memory_bytes = gib[uniform(1, 6)] * kGiB;
        break;
      case 3:
        j.cpus = cpus[uniform(0, 6)];
        j.memory_bytes = gib[uniform(0, 6)] * kGiB;
        j.other_limits = uniform(0, 3) == 0;
        break;
      default:
        j.other_limits = true;
        break;
    }
  }
}

// The hard requirement: when no job has resources the result is exactly
// today's, whatever the workers report (with and without queues).
TEST(SchedulerResourcesPropertyTest, WithoutJobResourcesWorkerResourcesChangeNothing) {
  std::mt19937 rng(2612);
  int compared = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    SCOPED_TRACE(iter);
    RandomInput in = RandomCluster(rng);
    std::vector<WorkerSlots> sized = in.workers;
    RandomWorkerResources(rng, sized);
    absl::StatusOr<ScheduleResult> today = Schedule(in.jobs, in.workers);
    absl::StatusOr<ScheduleResult> got = Schedule(in.jobs, sized);
    ASSERT_TRUE(today.ok() && got.ok());
    ASSERT_EQ(Dump(*got), Dump(*today));

    RandomQueueInput q = RandomQueues(rng);
    std::vector<WorkerSlots> q_sized = q.workers;
    RandomWorkerResources(rng, q_sized);
    absl::StatusOr<ScheduleResult> q_today = Schedule(q.jobs, q.workers, q.queues);
    absl::StatusOr<ScheduleResult> q_got = Schedule(q.jobs, q_sized, q.queues);
    ASSERT_TRUE(q_today.ok() && q_got.ok());
    ASSERT_EQ(Dump(*q_got), Dump(*q_today));
    compared += !today->placements.empty() && !q_today->placements.empty();
  }
  EXPECT_GT(compared, 500);
}

TEST(SchedulerResourcesPropertyTest, NeverOverCommitsAndKeepsGangsWhole) {
  std::mt19937 rng(4096);
  std::map<std::string, int> seen;
  for (int iter = 0; iter < 6000; ++iter) {
    SCOPED_TRACE(iter);
    RandomInput in = RandomCluster(rng);
    RandomWorkerResources(rng, in.workers);
    RandomJobResources(rng, in.jobs);
    for (PendingJob& j : in.jobs) {
      if (uniform_int(rng, 0, 5) == 0 && j.world_size > 1)
        j.min_world_size = uniform_int(rng, 1, j.world_size - 1);
    }
    absl::StatusOr<ScheduleResult> r = Schedule(in.jobs, in.workers);
    ASSERT_TRUE(r.ok()) << r.status();
    CheckResourceInvariants(in.jobs, in.workers, *r);
    if (HasFailure()) FAIL() << "result:\n" << Dump(*r);
    std::map<std::string, const PendingJob*> by_id;
    for (const PendingJob& j : in.jobs) by_id[j.job_id] = &j;
    for (const Placement& p : r->placements) {
      const PendingJob& j = *by_id[p.job_id];
      ++seen[HasResources(j) ? "placed with resources" : "placed without"];
      if (HasResources(j) && p.num_nodes > 1) ++seen["split with resources"];
    }
    for (const PendingJobStatus& p : r->pending) {
      const bool res = HasResources(*by_id[p.job_id]);
      ++seen[absl::StrCat(PendingReasonName(p.reason), res ? " with resources" : "")];
      if (res && !p.reserved_slots.empty()) ++seen["head with resources"];
    }
  }
  for (const char* what :
       {"placed with resources", "placed without", "split with resources",
        "exceeds_capacity with resources", "insufficient_free_slots with resources",
        "blocked_by_reservation with resources", "head with resources"}) {
    EXPECT_GT(seen[what], 30) << what;
  }
}

TEST(SchedulerResourcesPropertyTest, WithQueuesNeverOverCommitsAndKeepsQuota) {
  std::mt19937 rng(8192);
  int placed = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    SCOPED_TRACE(iter);
    RandomQueueInput in = RandomQueues(rng);
    RandomWorkerResources(rng, in.workers);
    RandomJobResources(rng, in.jobs);
    absl::StatusOr<ScheduleResult> r = Schedule(in.jobs, in.workers, in.queues);
    ASSERT_TRUE(r.ok()) << r.status();
    CheckResourceInvariants(in.jobs, in.workers, *r);
    CheckQueueInvariants(in.jobs, in.workers, in.queues, *r);
    if (HasFailure()) FAIL() << "result:\n" << Dump(*r);
    placed += static_cast<int>(r->placements.size());
  }
  EXPECT_GT(placed, 1000);
}

// Issue #48: quotas in CPUs and memory (scheduler.h, "Resource quotas").
// RandomQueues with CPU and memory quotas (and limits) on some queues, jobs
// and running jobs asking for resources. CheckQueueInvariants models slots
// only; this checks the resource dimensions with their own small model.
RandomQueueInput RandomResourceQuotas(std::mt19937& rng) {
  RandomQueueInput in = RandomQueues(rng);
  RandomWorkerResources(rng, in.workers);
  RandomJobResources(rng, in.jobs);
  for (QueueSpec& q : in.queues.queues) {
    const double cpus[] = {-1, -1, 0, 2, 4, 8, 16};
    const int gib[] = {-1, -1, 0, 8, 16, 32, 64};
    q.nominal_cpus = cpus[uniform_int(rng, 0, 6)];
    q.nominal_memory_bytes = gib[uniform_int(rng, 0, 6)];
    if (q.nominal_memory_bytes > 0) q.nominal_memory_bytes *= kGiB;
    auto limit = [&](double unit) {
      return uniform_int(rng, 0, 2) == 0 ? uniform_int(rng, 0, 8) * unit : -1.0;
    };
    if (q.nominal_cpus >= 0) {
      q.borrowing_limit_cpus = limit(1);
      q.lending_limit_cpus = limit(2);
    }
    if (q.nominal_memory_bytes >= 0) {
      q.borrowing_limit_memory_bytes =
          static_cast<std::int64_t>(limit(static_cast<double>(4 * kGiB)));
      q.lending_limit_memory_bytes =
          static_cast<std::int64_t>(limit(static_cast<double>(8 * kGiB)));
    }
  }
  for (RunningJob& r : in.queues.running) {
    const double cpus[] = {0, 0, 1, 2, 4};
    const int gib[] = {0, 0, 4, 8, 16};
    r.cpus = cpus[uniform_int(rng, 0, 4)];
    r.memory_bytes = gib[uniform_int(rng, 0, 4)] * kGiB;
  }
  return in;
}

// The model: per queue and resource (0 = CPUs in thousandths, 1 = bytes).
struct ResourceModel {
  const QueueInput& in;
  static std::string Name(const std::string& q) { return q.empty() ? "default" : q; }
  static long long Milli(double cpus) {
    return static_cast<long long>(std::ceil(cpus * 1000 - 1e-6));
  }
  static long long PerRank(double cpus, std::int64_t memory, int r) {
    return r == 0 ? (cpus > 0 ? std::max(1LL, Milli(cpus)) : 0) : memory;
  }
  static long long Nominal(const QueueSpec& q, int r) {
    return r == 0 ? (q.nominal_cpus < 0 ? -1 : Milli(q.nominal_cpus)) : q.nominal_memory_bytes;
  }
  static long long Borrow(const QueueSpec& q, int r) {
    return r == 0 ? (q.borrowing_limit_cpus < 0 ? -1 : Milli(q.borrowing_limit_cpus))
                  : q.borrowing_limit_memory_bytes;
  }
  static long long Guaranteed(const QueueSpec& q, int r) {
    const long long lend = r == 0 ? (q.lending_limit_cpus < 0 ? -1 : Milli(q.lending_limit_cpus))
                                  : q.lending_limit_memory_bytes;
    return lend < 0 ? 0 : Nominal(q, r) - std::min(lend, Nominal(q, r));
  }
  static std::string Group(const QueueSpec& q) {
    return q.cohort.empty() ? "queue:" + q.name : "cohort:" + q.cohort;
  }
};

TEST(SchedulerResourceQuotaPropertyTest, EveryDimensionKeepsItsQuota) {
  std::mt19937 rng(4848);
  std::map<std::string, int> seen;
  for (int iter = 0; iter < 5000; ++iter) {
    SCOPED_TRACE(iter);
    RandomQueueInput in = RandomResourceQuotas(rng);
    absl::StatusOr<ScheduleResult> r = Schedule(in.jobs, in.workers, in.queues);
    ASSERT_TRUE(r.ok()) << r.status();
    CheckResourceInvariants(in.jobs, in.workers, *r);
    std::map<std::string, const PendingJob*> by_id;
    for (const PendingJob& j : in.jobs) by_id[j.job_id] = &j;
    std::map<std::string, const QueueSpec*> queues;
    for (const QueueSpec& q : in.queues.queues) queues[q.name] = &q;
    // used[queue][resource]: running plus placed; placed: queues that placed.
    std::map<std::string, std::array<long long, 2>> used;
    std::set<std::pair<std::string, int>> placed;
    for (const RunningJob& j : in.queues.running) {
      for (int res = 0; res < 2; ++res) {
        used[ResourceModel::Name(j.queue)][res] +=
            ResourceModel::PerRank(j.cpus, j.memory_bytes, res) * j.slots;
      }
    }
    for (const Placement& p : r->placements) {
      const PendingJob& j = *by_id[p.job_id];
      for (int res = 0; res < 2; ++res) {
        const long long amount = ResourceModel::PerRank(j.cpus, j.memory_bytes, res) * p.world_size;
        used[ResourceModel::Name(j.queue)][res] += amount;
        if (amount > 0) placed.insert({ResourceModel::Name(j.queue), res});
      }
    }
    for (const auto& [name, res] : placed) {
      const QueueSpec& q = *queues.at(name);
      const long long nominal = ResourceModel::Nominal(q, res);
      if (nominal < 0) continue;
      SCOPED_TRACE(absl::StrCat(name, res == 0 ? " cpus" : " memory"));
      ++seen["placed under a resource quota"];
      const long long mine = used[name][res];
      if (mine > nominal) ++seen["borrowed"];
      if (ResourceModel::Borrow(q, res) >= 0) {
        EXPECT_LE(mine, nominal + ResourceModel::Borrow(q, res));
      }
      if (q.cohort.empty()) {
        EXPECT_LE(mine, nominal);
      }
      if (mine > ResourceModel::Guaranteed(q, res)) {
        long long group_used = 0, group_nominal = 0;
        for (const auto& [other, m] : queues) {
          if (ResourceModel::Group(*m) != ResourceModel::Group(q) ||
              ResourceModel::Nominal(*m, res) < 0)
            continue;
          group_nominal += ResourceModel::Nominal(*m, res) - ResourceModel::Guaranteed(*m, res);
          group_used += std::max(0LL, used[other][res] - ResourceModel::Guaranteed(*m, res));
        }
        EXPECT_LE(group_used, group_nominal) << "over the group's nominal";
      }
    }
    // Victims are in the preemptor's group; quota_exceeded in a queue
    // without slot quota is the resources'.
    std::map<std::string, const RunningJob*> running;
    for (const RunningJob& j : in.queues.running) running[j.job_id] = &j;
    for (const Preemption& v : r->preemptions) {
      const QueueSpec* victim = queues.at(ResourceModel::Name(running.at(v.victim_job_id)->queue));
      const QueueSpec* for_q = queues.at(ResourceModel::Name(by_id.at(v.for_job_id)->queue));
      EXPECT_EQ(ResourceModel::Group(*victim), ResourceModel::Group(*for_q));
      ++seen["victims"];
    }
    for (const PendingJobStatus& p : r->pending) {
      auto q = queues.find(ResourceModel::Name(by_id.at(p.job_id)->queue));
      if (q == queues.end() || p.reason != PendingReason::kQuotaExceeded) continue;
      if (q->second->nominal_gpu < 0 && q->second->nominal_cpu < 0) {
        const PendingJob& j = *by_id.at(p.job_id);
        const bool uses = (j.cpus > 0 && q->second->nominal_cpus >= 0) ||
                          (j.memory_bytes > 0 && q->second->nominal_memory_bytes >= 0);
        EXPECT_TRUE(uses) << p.message;
        ++seen["quota_exceeded by resources"];
      }
    }
    if (HasFailure()) FAIL() << "result:\n" << Dump(*r);
    // The same whatever the input order.
    RandomQueueInput shuffled = in;
    std::shuffle(shuffled.jobs.begin(), shuffled.jobs.end(), rng);
    std::shuffle(shuffled.workers.begin(), shuffled.workers.end(), rng);
    std::shuffle(shuffled.queues.queues.begin(), shuffled.queues.queues.end(), rng);
    std::shuffle(shuffled.queues.running.begin(), shuffled.queues.running.end(), rng);
    absl::StatusOr<ScheduleResult> again =
        Schedule(shuffled.jobs, shuffled.workers, shuffled.queues);
    ASSERT_TRUE(again.ok());
    ASSERT_EQ(Dump(*again), Dump(*r));
  }
  for (const char* what :
       {"placed under a resource quota", "borrowed", "victims", "quota_exceeded by resources"}) {
    EXPECT_GT(seen[what], 30) << what;
  }
}

TEST(SchedulerResourcesPropertyTest, DeterministicUnderPermutedInput) {
  std::mt19937 rng(77);
  for (int iter = 0; iter < 1500; ++iter) {
    SCOPED_TRACE(iter);
    RandomInput in = RandomCluster(rng);
    RandomWorkerResources(rng, in.workers);
    RandomJobResources(rng, in.jobs);
    absl::StatusOr<ScheduleResult> want = Schedule(in.jobs, in.workers);
    ASSERT_TRUE(want.ok());
    RandomInput shuffled = in;
    std::shuffle(shuffled.jobs.begin(), shuffled.jobs.end(), rng);
    std::shuffle(shuffled.workers.begin(), shuffled.workers.end(), rng);
    absl::StatusOr<ScheduleResult> got = Schedule(shuffled.jobs, shuffled.workers);
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(Dump(*got), Dump(*want));
  }
}

// Random clusters under a stream of jobs with resources, where CPUs and
// memory (not slots) are mostly what is short: every job that fits the
// cluster idle eventually starts (the reservation holds resources and does
// not deadlock), and no pass over-commits a worker.
TEST(SchedulerResourcesPropertyTest, EveryJobThatFitsEventuallyRuns) {
  std::mt19937 rng(31);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int resource_waits = 0;
  for (int iter = 0; iter < 150; ++iter) {
    SCOPED_TRACE(iter);
    std::vector<WorkerSlots> workers;
    const int num_workers = uniform(1, 4);
    for (int w = 0; w < num_workers; ++w) {
      WorkerSlots ws = Sized(Cpu(absl::StrCat("w", w), 0, uniform(2, 8)), uniform(1, 4) * 2,
                             uniform(1, 4) * 4 * kGiB,
                             /*enforces=*/uniform(0, 5) != 0);
      workers.push_back(ws);
    }
    struct Sim {
      PendingJob spec;
      int arrival = 0;
      int duration = 1;
    };
    std::vector<Sim> jobs;
    const int num_jobs = uniform(5, 40);
    for (int j = 0; j < num_jobs; ++j) {
      Sim sj{Job(absl::StrCat("j", j), uniform(1, uniform(0, 4) == 0 ? 6 : 2), kCpu, uniform(0, 2),
                 static_cast<std::uint64_t>(j)),
             uniform(0, 30), uniform(1, 6)};
      if (uniform(0, 4) != 0) {
        const double cpus[] = {0, 0.5, 1, 2, 3, 4};
        sj.spec.cpus = cpus[uniform(0, 5)];
        sj.spec.memory_bytes = uniform(0, 8) * kGiB;
        sj.spec.other_limits = sj.spec.cpus == 0 && sj.spec.memory_bytes == 0;
      }
      long long idle = 0;
      for (const WorkerSlots& w : workers) idle += IdleRanks(sj.spec, w);
      if (sj.spec.world_size > idle) continue;  // never fits: reported as such
      jobs.push_back(sj);
    }
    struct Live {
      std::vector<std::pair<std::string, int>> slots;
      int end = 0;
      double cpus = 0;
      std::int64_t memory = 0;
    };
    std::map<std::string, Live> live;
    std::map<std::string, int> started;
    for (int tick = 0; tick < 2000 && started.size() < jobs.size(); ++tick) {
      for (auto it = live.begin(); it != live.end();)
        it = it->second.end <= tick ? live.erase(it) : std::next(it);
      for (WorkerSlots& w : workers) {
        std::set<int> busy;
        w.reserved_cpus = 0;
        w.reserved_memory = 0;
        for (const auto& [id, l] : live) {
          for (const auto& [wid, slot] : l.slots) {
            if (wid != w.worker_id) continue;
            busy.insert(slot);
            w.reserved_cpus += l.cpus;
            w.reserved_memory += l.memory;
          }
        }
        w.free_slots.clear();
        for (int s = 0; s < w.total_slots; ++s) {
          if (!busy.count(s)) w.free_slots.push_back(s);
        }
      }
      std::vector<PendingJob> pending;
      for (const Sim& j : jobs) {
        if (j.arrival <= tick && !started.count(j.spec.job_id)) pending.push_back(j.spec);
      }
      absl::StatusOr<ScheduleResult> r = Schedule(pending, workers);
      ASSERT_TRUE(r.ok()) << r.status();
      CheckResourceInvariants(pending, workers, *r);
      if (HasFailure()) FAIL() << "tick " << tick << "\n" << Dump(*r);
      for (const PendingJobStatus& p : r->pending) {
        resource_waits += p.reason == PendingReason::kInsufficientFreeSlots &&
                          p.message.find("room for") != std::string::npos;
      }
      for (const Placement& p : r->placements) {
        const Sim& sj = *std::find_if(jobs.begin(), jobs.end(),
                                      [&](const Sim& s) { return s.spec.job_id == p.job_id; });
        Live l{{}, tick + sj.duration, sj.spec.cpus, sj.spec.memory_bytes};
        for (const RankAssignment& a : p.ranks) l.slots.push_back({a.worker_id, a.slot});
        live[p.job_id] = l;
        started[p.job_id] = tick;
      }
    }
    EXPECT_EQ(started.size(), jobs.size()) << "a job that fits never started";
    if (HasFailure()) return;
  }
  EXPECT_GT(resource_waits, 200);
}

}  // namespace
}  // namespace trainctl::scheduler
