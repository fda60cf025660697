// Queues through the JobManager (job_placer.h, docs/queues.md): quotas
// hold jobs back with free slots, a cohort lends idle quota and takes it
// back by preempting the borrower (attempt CANCELLED with preempted_for, the
// job RESTARTING without a restart counted, its ranks stopped with the
// preemption grace), the preempting job starts once the victim's ranks have
// stopped, and the victim resumes later; usage decays with its half-life.
#include "coordinator/jobs/job_manager_fixture.h"

#include <cmath>

#include "common/time_util.h"
#include "coordinator/jobs/job_transitions.h"

namespace trainctl::coordinator {
namespace {

class JobQueuesTest : public JobManagerTest {
 protected:
  // Queues a and b in cohort "c", 2 CPU slots of nominal quota each.
  void TwoQueuesInACohort() {
    queues_ = {Queue("a", 2, "c"), Queue("b", 2, "c")};
    owners_->placer.SetQueueSource([this] { return queues_; });
  }
  static scheduler::QueueSpec Queue(const std::string& name, int cpu,
                                    const std::string& cohort = "") {
    scheduler::QueueSpec q;
    q.name = name;
    q.nominal_cpu = cpu;
    q.cohort = cohort;
    return q;
  }
  std::string Submit(int world_size, const std::string& queue, int priority = 0) {
    v1::JobSpec spec = Spec(world_size);
    spec.set_queue(queue);
    spec.set_priority(priority);
    auto job = jobs_->Submit(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }
  // Every rank of the job's attempt `attempt` reports `state`.
  void AllRanks(const std::string& id, int attempt, v1::RankState state) {
    const v1::Job j = Get(id);
    ASSERT_GE(j.attempts_size(), attempt);
    for (const v1::RankAssignment& r : j.attempts(attempt - 1).ranks()) {
      ASSERT_TRUE(Status(r.worker_id(), id, attempt, r.rank(), state).ok())
          << id << " rank " << r.rank();
    }
  }
  std::vector<scheduler::QueueSpec> queues_;
};

TEST_F(JobQueuesTest, AQueuesQuotaHoldsAJobBackWhileSlotsAreFree) {
  queues_ = {Queue("a", 2)};
  owners_->placer.SetQueueSource([this] { return queues_; });
  AddWorker("w1", 4);
  const std::string first = Submit(2, "a");
  const std::string second = Submit(2, "a");
  EXPECT_EQ(Get(first).state(), v1::JOB_STATE_SCHEDULED);
  const v1::Job held = Get(second);
  EXPECT_EQ(held.state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(held.state_reason(), HasSubstr("quota"));

  // A job naming no defined queue stays pending and says so.
  const std::string lost = Submit(1, "nope");
  EXPECT_EQ(Get(lost).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(lost).state_reason(), HasSubstr("nope"));

  // The quota frees when the first job ends: the second starts.
  AllRanks(first, 1, v1::RANK_STATE_RUNNING);
  ASSERT_TRUE(jobs_->Cancel(first, "done").ok());
  AllRanks(first, 1, v1::RANK_STATE_STOPPED);
  EXPECT_EQ(Get(second).state(), v1::JOB_STATE_SCHEDULED);

  // Without queues none of this applies: a third job of "a" starts on the
  // free slots although a's quota is in use.
  ASSERT_TRUE(jobs_->Cancel(lost, "unknown queue").ok());
  queues_.clear();
  const std::string third = Submit(2, "a");
  EXPECT_EQ(Get(third).state(), v1::JOB_STATE_SCHEDULED) << Get(third).state_reason();
}

TEST_F(JobQueuesTest, ABorrowerIsPreemptedWhenTheLenderNeedsItsQuotaAndResumesLater) {
  TwoQueuesInACohort();
  std::vector<FakeChannel*> ch = {AddWorker("w1", 2), AddWorker("w2", 2)};
  // b's job borrows a's idle quota: 4 slots on a nominal of 2.
  const std::string borrower = Submit(4, "b");
  ASSERT_EQ(Get(borrower).state(), v1::JOB_STATE_SCHEDULED) << Get(borrower).state_reason();
  AllRanks(borrower, 1, v1::RANK_STATE_RUNNING);
  EXPECT_EQ(owners_->Gauges().preemptions, 0);
  const int64_t passes = owners_->placer.pass_latency().count();
  EXPECT_GE(passes, 1) << "the pass that placed the borrower was timed";

  // a submits within its quota: b's job is preempted, a's waits for its slots.
  const std::string owner = Submit(2, "a");
  EXPECT_EQ(owners_->Gauges().preemptions, 1) << "/metrics' trainctl_preemptions_total";
  EXPECT_GT(owners_->placer.pass_latency().count(), passes);
  v1::Job victim = Get(borrower);
  EXPECT_EQ(victim.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_THAT(victim.state_reason(), HasSubstr("preempted for job " + owner));
  ASSERT_EQ(victim.attempts_size(), 1);
  EXPECT_EQ(victim.attempts(0).state(), v1::ATTEMPT_STATE_CANCELLED);
  EXPECT_EQ(victim.attempts(0).preempted_for(), owner);
  EXPECT_EQ(victim.restarts(), 0) << "a preemption is not a restart";
  int stops = 0;
  for (FakeChannel* c : ch) {
    for (const v1::StopRanks& s : c->Stops()) {
      EXPECT_EQ(s.job_id(), borrower);
      EXPECT_EQ(s.grace_period_ms(), 60000) << "the preemption grace, not --stop-grace-s";
      EXPECT_TRUE(s.checkpoint_first());
      stops += s.ranks_size();
    }
  }
  EXPECT_EQ(stops, 4);
  EXPECT_EQ(Get(owner).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(owner).state_reason(), HasSubstr(borrower));

  // The victim's ranks stop: a's job starts; b's waits (a's quota is back
  // in use, so b may use only its own 2 slots and needs 4).
  AllRanks(borrower, 1, v1::RANK_STATE_STOPPED);
  ASSERT_EQ(Get(owner).state(), v1::JOB_STATE_SCHEDULED) << Get(owner).state_reason();
  victim = Get(borrower);
  EXPECT_EQ(victim.attempts_size(), 1);
  EXPECT_THAT(victim.state_reason(), HasSubstr("quota"));
  auto events = store_->jobs().ListEvents(borrower, 0, 1000);
  ASSERT_TRUE(events.ok()) << events.status();
  bool preempted_event = false;
  for (const auto& ev : *events) {
    if (ev.type() == "preempted") {
      preempted_event = true;
      EXPECT_THAT(ev.message(), HasSubstr("preempted for job " + owner + " (queue a, priority 0)"));
    }
  }
  EXPECT_TRUE(preempted_event);

  // a's job ends: b's resumes, as attempt 2, still without a restart counted.
  AllRanks(owner, 1, v1::RANK_STATE_RUNNING);
  ASSERT_TRUE(jobs_->Cancel(owner, "done").ok());
  AllRanks(owner, 1, v1::RANK_STATE_STOPPED);
  victim = Get(borrower);
  ASSERT_EQ(victim.state(), v1::JOB_STATE_SCHEDULED) << victim.state_reason();
  EXPECT_EQ(victim.attempts_size(), 2);
  EXPECT_EQ(victim.restarts(), 0);
}

// Issue #48: a running job's memory counts against its queue's memory
// quota (the placer hands the scheduler each running job's resources): b
// borrows a's idle memory quota with free slots to spare, and a's job within
// its own quota preempts it, then starts once its ranks have stopped.
TEST_F(JobQueuesTest, ARunningJobsMemoryCountsAndIsReclaimedByPreemption) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  queues_ = {Queue("a", -1, "c"), Queue("b", -1, "c")};
  queues_[0].nominal_memory_bytes = 16 * kGiB;
  queues_[1].nominal_memory_bytes = 16 * kGiB;
  owners_->placer.SetQueueSource([this] { return queues_; });
  v1::Register reg = CpuWorker("w1", 8);
  reg.mutable_allocatable()->set_cpus(8);
  reg.mutable_allocatable()->set_memory_bytes(64 * kGiB);
  reg.mutable_allocatable()->set_enforces_limits(true);
  RegisterWorker(reg);
  auto submit = [&](const std::string& queue, int64_t memory) {
    v1::JobSpec spec = Spec(1);
    spec.set_queue(queue);
    spec.mutable_resources()->set_memory(memory);
    auto job = jobs_->Submit(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  };
  // b borrows 8 GiB of a's idle quota.
  const std::string borrower = submit("b", 24 * kGiB);
  ASSERT_EQ(Get(borrower).state(), v1::JOB_STATE_SCHEDULED) << Get(borrower).state_reason();
  AllRanks(borrower, 1, v1::RANK_STATE_RUNNING);
  // a's 16 GiB is its own: 7 slots and 40 GiB are free, but the cohort lent
  // 8 of it out, so b's job is preempted.
  const std::string owner = submit("a", 16 * kGiB);
  EXPECT_EQ(Get(owner).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(owner).state_reason(), HasSubstr("memory"));
  EXPECT_EQ(Get(borrower).attempts(0).preempted_for(), owner);
  AllRanks(borrower, 1, v1::RANK_STATE_STOPPED);
  EXPECT_EQ(Get(owner).state(), v1::JOB_STATE_SCHEDULED) << Get(owner).state_reason();
  // b may now hold only its own 16 GiB: its 24 GiB job waits, saying so.
  EXPECT_NE(Get(borrower).state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_THAT(Get(borrower).state_reason(), HasSubstr("GiB memory used"));
}

// An elastic job started at the size its queue's memory quota admits does
// not stop to grow while the quota has no room for another rank (it would
// only wait, stopped, for quota), and grows once the quota is raised.
TEST_F(JobQueuesTest, AnElasticJobGrowsOnlyWithinItsQueuesMemoryQuota) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  queues_ = {Queue("a", -1)};
  queues_[0].nominal_memory_bytes = 8 * kGiB;
  owners_->placer.SetQueueSource([this] { return queues_; });
  v1::Register reg = CpuWorker("w1", 4);
  reg.mutable_allocatable()->set_cpus(8);
  reg.mutable_allocatable()->set_memory_bytes(64 * kGiB);
  reg.mutable_allocatable()->set_enforces_limits(true);
  RegisterWorker(reg);
  v1::JobSpec spec = Spec(2);
  spec.set_queue("a");
  spec.mutable_resources()->set_memory(8 * kGiB);
  spec.mutable_training()->set_epochs(3);
  spec.mutable_elastic()->set_min_ranks(1);
  auto job = jobs_->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->id();
  ASSERT_EQ(Get(id).state(), v1::JOB_STATE_SCHEDULED) << Get(id).state_reason();
  ASSERT_EQ(Get(id).attempts(0).ranks_size(), 1) << "the quota admits one rank of 8 GiB";
  ASSERT_TRUE(Rendezvous("w1", id, 1).ok());
  ASSERT_TRUE(Status("w1", id, 1, 0, v1::RANK_STATE_RUNNING).ok());
  // 3 slots and 56 GiB are free, but the quota is full: no growth.
  ASSERT_TRUE(Checkpoint(*jobs_, "w1", id, 1, 0, 0, 5, "/w/ck-5").ok());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(id).attempts(0).grow_to(), 0);
  // Raised: the next checkpoint grows it.
  queues_[0].nominal_memory_bytes = 16 * kGiB;
  ASSERT_TRUE(Checkpoint(*jobs_, "w1", id, 1, 0, 0, 6, "/w/ck-6").ok());
  EXPECT_EQ(Get(id).attempts(0).grow_to(), 2) << Get(id).state_reason();
}

TEST_F(JobQueuesTest, AHigherPriorityJobPreemptsALowerOneOfItsOwnQueue) {
  queues_ = {Queue("a", 2)};
  owners_->placer.SetQueueSource([this] { return queues_; });
  AddWorker("w1", 2);
  const std::string low = Submit(2, "a", /*priority=*/0);
  AllRanks(low, 1, v1::RANK_STATE_RUNNING);
  const std::string high = Submit(2, "a", /*priority=*/5);
  EXPECT_EQ(Get(low).attempts(0).preempted_for(), high);
  AllRanks(low, 1, v1::RANK_STATE_STOPPED);
  EXPECT_EQ(Get(high).state(), v1::JOB_STATE_SCHEDULED) << Get(high).state_reason();
  // An equal priority never preempts.
  const std::string same = Submit(2, "a", /*priority=*/5);
  EXPECT_EQ(Get(high).state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(Get(same).state(), v1::JOB_STATE_PENDING);
}

TEST_F(JobQueuesTest, UsageDecaysWithItsHalfLife) {
  queues_ = {Queue("a", 4), Queue("b", 4)};
  owners_->placer.SetQueueSource([this] { return queues_; });
  AddWorker("w1", 4);
  const std::string job = Submit(2, "a");
  AllRanks(job, 1, v1::RANK_STATE_RUNNING);
  jobs_->Tick();
  clock_.Advance(absl::Seconds(10));
  jobs_->Tick();
  // 2 slots for 10 s with a one-hour half-life: ~20 slot-seconds.
  const auto& usage = owners_->placer.usage();
  ASSERT_TRUE(usage.contains("a"));
  const double after = usage.at("a")[1];
  EXPECT_NEAR(after, 20.0, 0.1);
  EXPECT_EQ(usage.at("a")[0], 0.0);
  EXPECT_FALSE(usage.contains("b") && usage.at("b")[1] > 0);
  // The job ends; an hour later half of it is left.
  ASSERT_TRUE(jobs_->Cancel(job, "done").ok());
  AllRanks(job, 1, v1::RANK_STATE_STOPPED);
  jobs_->Tick();
  const double at_end = owners_->placer.usage().at("a")[1];
  clock_.Advance(absl::Hours(1));
  jobs_->Tick();
  EXPECT_NEAR(owners_->placer.usage().at("a")[1], at_end / 2, 1e-6);
}

// Issue #48: the usage is written to the store on the tick and read back by
// the next coordinator (a restart, or a standby taking over), decayed over
// the time no coordinator ran; it still orders the queues.
TEST_F(JobQueuesTest, ARestartReloadsTheUsageFromTheStore) {
  queues_ = {Queue("a", -1), Queue("b", -1)};
  owners_->placer.SetQueueSource([this] { return queues_; });
  AddWorker("w1", 4);
  const std::string job = Submit(2, "a");
  AllRanks(job, 1, v1::RANK_STATE_RUNNING);
  jobs_->Tick();
  clock_.Advance(absl::Seconds(30));
  jobs_->Tick();  // more than the save interval (10 s) since the first write
  const double before = owners_->placer.usage().at("a")[1];
  EXPECT_NEAR(before, 60, 0.5) << "2 slots for 30 s";
  auto stored = store_->queues().LoadFairShare();
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->queues_size(), 1);
  EXPECT_EQ(stored->queues(0).queue(), "a");
  EXPECT_NEAR(stored->queues(0).owners().at("").cpu_slot_seconds(), before, 1e-9)
      << "the job's owner";
  ASSERT_TRUE(jobs_->Cancel(job, "done").ok());
  AllRanks(job, 1, v1::RANK_STATE_STOPPED);

  // The coordinator restarts an hour (one half-life) later.
  clock_.Advance(absl::Hours(1));
  Open();
  owners_->placer.SetQueueSource([this] { return queues_; });
  ASSERT_TRUE(owners_->placer.usage().contains("a"));
  EXPECT_NEAR(owners_->placer.usage().at("a")[1], before / 2, 0.5);

  // a's reloaded usage puts b first: a's job, older, waits. (A job of a
  // third queue fills w1 first: both jobs wait for w2, and one pass places
  // one of them.)
  queues_.push_back(Queue("c", -1));
  ASSERT_EQ(Get(Submit(4, "c")).state(), v1::JOB_STATE_SCHEDULED);
  const std::string a_job = Submit(1, "a");
  const std::string b_job = Submit(1, "b");
  AddWorker("w2", 1);
  EXPECT_EQ(Get(b_job).state(), v1::JOB_STATE_SCHEDULED) << Get(b_job).state_reason();
  EXPECT_EQ(Get(a_job).state(), v1::JOB_STATE_PENDING);
}

TEST_F(JobQueuesTest, UsageSumsSlotSecondsUpToNowAndRefusesASinceAfterIt) {
  queues_ = {Queue("a", 4), Queue("b", 4)};
  owners_->placer.SetQueueSource([this] { return queues_; });
  AddWorker("w1", 4);
  const std::string a = Submit(2, "a");
  const std::string b = Submit(1, "b");
  const std::string waiting = Submit(4, "b");
  AllRanks(a, 1, v1::RANK_STATE_RUNNING);
  AllRanks(b, 1, v1::RANK_STATE_RUNNING);
  ASSERT_EQ(Get(waiting).state(), v1::JOB_STATE_PENDING);
  clock_.Advance(absl::Seconds(10));

  absl::StatusOr<UsageReport> r = owners_->queries.Usage(UsageFilter{});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->until, clock_.Now());
  ASSERT_EQ(r->rows.size(), 2u);
  EXPECT_EQ(r->rows[0].queue, "a");
  EXPECT_EQ(r->rows[0].kind, "cpu");
  EXPECT_NEAR(r->rows[0].slot_seconds, 20, 1e-6) << "2 running slots for 10 s, counted up to now";
  EXPECT_EQ(r->rows[1].queue, "b");
  EXPECT_NEAR(r->rows[1].slot_seconds, 10, 1e-6) << "the pending job holds nothing";
  EXPECT_EQ(r->rows[1].jobs, 1);

  UsageFilter f;
  f.queue = "b";
  f.since = clock_.Now() - absl::Seconds(4);
  r = owners_->queries.Usage(f);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->rows.size(), 1u);
  EXPECT_NEAR(r->rows[0].slot_seconds, 4, 1e-6);

  f.since = clock_.Now() + absl::Seconds(1);
  r = owners_->queries.Usage(f);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("since: "));
}

// Accounting charges the grace: a preempted attempt's record ends when its
// last rank exited, not when the coordinator decided to preempt it; each
// rank's cgroup figures are summed (CPU) and maxed (memory).
TEST_F(JobQueuesTest, APreemptedAttemptsUsageEndsWhenItsLastRankExited) {
  TwoQueuesInACohort();
  AddWorker("w1", 2);
  AddWorker("w2", 2);
  const std::string borrower = Submit(4, "b");  // borrows a's idle quota
  AllRanks(borrower, 1, v1::RANK_STATE_RUNNING);
  const absl::Time placed = FromTimestamp(Get(borrower).attempts(0).start_time());
  clock_.Advance(absl::Seconds(10));
  const std::string owner = Submit(2, "a");  // preempts the borrower now
  const v1::Job victim = Get(borrower);
  ASSERT_EQ(victim.attempts(0).preempted_for(), owner);
  const absl::Time decided = FromTimestamp(victim.attempts(0).end_time());
  EXPECT_EQ(decided, placed + absl::Seconds(10));
  ASSERT_TRUE(
      store_->usage().LoadAttemptUsage(absl::InfinitePast(), absl::InfiniteFuture())->empty())
      << "no record while its ranks still run";
  // While the ranks stop, the attempt counts up to now ("stopping").
  clock_.Advance(absl::Seconds(3));
  UsageFilter by_attempt;
  by_attempt.by = v1::USAGE_GROUPING_ATTEMPT;
  absl::StatusOr<UsageReport> r = owners_->queries.Usage(by_attempt);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->attempts.size(), 1u);
  EXPECT_EQ(r->attempts[0].state(), "preempted");
  EXPECT_FALSE(r->attempts[0].has_end_time());
  EXPECT_NEAR(r->attempts[0].wall_seconds(), 13, 1e-6);

  // Ranks 1-3 exit 3 s after the decision, rank 0 5 s after, with figures
  // (rank 3 without: its worker had no cgroups).
  auto stopped = [&](int rank, double cpu, int64_t peak) {
    v1::RankStatus st;
    st.set_job_id(borrower);
    st.set_attempt(1);
    st.set_rank(rank);
    st.set_state(v1::RANK_STATE_STOPPED);
    st.set_cpu_seconds(cpu);
    st.set_peak_memory_bytes(peak);
    return jobs_->OnRankStatus(victim.attempts(0).ranks(rank).worker_id(), st);
  };
  ASSERT_TRUE(stopped(1, 4.5, 100 << 20).ok());
  ASSERT_TRUE(stopped(2, 1.0, 200 << 20).ok());
  ASSERT_TRUE(stopped(3, 0, 0).ok());
  ASSERT_TRUE(
      store_->usage().LoadAttemptUsage(absl::InfinitePast(), absl::InfiniteFuture())->empty())
      << "rank 0 still runs";
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(stopped(0, 6.0, 300 << 20).ok());
  auto stored = store_->usage().LoadAttemptUsage(absl::InfinitePast(), absl::InfiniteFuture());
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->size(), 1u);
  const v1::AttemptUsage& u = (*stored)[0];
  EXPECT_EQ(u.job_id(), borrower);
  EXPECT_EQ(u.attempt(), 1);
  EXPECT_EQ(u.queue(), "b");
  EXPECT_EQ(u.kind(), "cpu");
  EXPECT_EQ(u.slots(), 4);
  EXPECT_EQ(FromTimestamp(u.end_time()), decided + absl::Seconds(5)) << "the 5 s grace is charged";
  EXPECT_NEAR(u.wall_seconds(), 15, 1e-6);
  EXPECT_NEAR(u.slot_seconds(), 60, 1e-6);
  EXPECT_EQ(u.gpu_seconds(), 0) << "CPU slots";
  EXPECT_NEAR(u.cpu_seconds(), 11.5, 1e-9);
  EXPECT_EQ(u.peak_memory_bytes(), 300 << 20);
  EXPECT_EQ(u.ranks_measured(), 3);
  EXPECT_EQ(u.state(), "preempted");

  // The sums use the record: 60 slot-seconds for b, not 40.
  clock_.Advance(absl::Seconds(1));
  UsageFilter by_queue;
  by_queue.by = v1::USAGE_GROUPING_QUEUE;
  by_queue.queue = "b";
  r = owners_->queries.Usage(by_queue);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->rows.size(), 1u);
  EXPECT_NEAR(r->rows[0].slot_seconds, 60, 1e-6);
  EXPECT_NEAR(r->rows[0].cpu_seconds, 11.5, 1e-9);
  EXPECT_EQ(r->rows[0].owner, "") << "by queue: owners together";

  // A window before the record's end clips it; until must be after since.
  UsageFilter early = by_queue;
  early.until = placed + absl::Seconds(12);
  r = owners_->queries.Usage(early);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->rows.size(), 1u);
  EXPECT_NEAR(r->rows[0].slot_seconds, 48, 1e-6);
  early.since = early.until;
  EXPECT_THAT(std::string(owners_->queries.Usage(early).status().message()), HasSubstr("until: "));
}

// A cancelled attempt too: its record ends when its last rank stopped, and
// a rank report with a negative CPU time is refused naming the field.
TEST_F(JobQueuesTest, ACancelledAttemptsUsageEndsWhenItsLastRankStopped) {
  AddWorker("w1", 2);
  const std::string job = Submit(2, "");
  AllRanks(job, 1, v1::RANK_STATE_RUNNING);
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(jobs_->Cancel(job, "done").ok());
  const absl::Time decided = FromTimestamp(Get(job).attempts(0).end_time());
  v1::RankStatus bad;
  bad.set_job_id(job);
  bad.set_attempt(1);
  bad.set_rank(0);
  bad.set_state(v1::RANK_STATE_STOPPED);
  bad.set_cpu_seconds(-1);
  EXPECT_THAT(
      std::string(jobs_->OnRankStatus(Get(job).attempts(0).ranks(0).worker_id(), bad).message()),
      HasSubstr("rank_status.cpu_seconds"));
  clock_.Advance(absl::Seconds(7));
  AllRanks(job, 1, v1::RANK_STATE_STOPPED);
  auto stored = store_->usage().LoadAttemptUsage(absl::InfinitePast(), absl::InfiniteFuture());
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ(FromTimestamp((*stored)[0].end_time()), decided + absl::Seconds(7));
  EXPECT_EQ((*stored)[0].state(), "cancelled");
  EXPECT_EQ((*stored)[0].queue(), "default");
  EXPECT_EQ((*stored)[0].cpu_seconds(), 0) << "no rank reported figures: unknown";
  EXPECT_EQ((*stored)[0].ranks_measured(), 0);
  UsageFilter by_job;
  by_job.by = v1::USAGE_GROUPING_JOB;
  absl::StatusOr<UsageReport> r = owners_->queries.Usage(by_job);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->rows.size(), 1u);
  EXPECT_EQ(r->rows[0].job_id, job);
  EXPECT_NEAR(r->rows[0].wall_seconds, 11, 1e-6);
  EXPECT_NEAR(r->rows[0].slot_seconds, 22, 1e-6);
}

// Per-owner limits (Slurm's MaxJobsPerUser, a per-user GrpTRES): an owner
// at the limit waits, saying so, while another owner's job runs; counted
// within one pass too (all four jobs meet the first worker together).
TEST_F(JobQueuesTest, APerOwnerLimitHoldsAnOwnersThirdJobWhileAnotherOwnersRuns) {
  scheduler::QueueSpec q = Queue("a", -1);
  q.max_running_jobs_per_owner = 2;
  queues_ = {q};
  owners_->placer.SetQueueSource([this] { return queues_; });
  auto submit = [&](const std::string& owner, int size) {
    v1::JobSpec spec = Spec(size);
    spec.set_queue("a");
    auto job = jobs_->Submit(spec, owner);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  };
  const std::string a1 = submit("alice", 1), a2 = submit("alice", 1), a3 = submit("alice", 1);
  const std::string b1 = submit("bob", 1);
  AddWorker("w1", 8);
  for (const std::string& id : {a1, a2, b1})
    EXPECT_EQ(Get(id).state(), v1::JOB_STATE_SCHEDULED) << id;
  ASSERT_EQ(Get(a3).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(a3).state_reason(), HasSubstr("owner 'alice' has 2 running jobs in queue 'a'"));
  EXPECT_THAT(Get(a3).state_reason(), HasSubstr("max_running_jobs_per_owner"));

  // One of alice's jobs ends: her third starts.
  AllRanks(a1, 1, v1::RANK_STATE_RUNNING);
  ASSERT_TRUE(jobs_->Cancel(a1, "done").ok());
  AllRanks(a1, 1, v1::RANK_STATE_STOPPED);
  EXPECT_EQ(Get(a3).state(), v1::JOB_STATE_SCHEDULED) << Get(a3).state_reason();

  // Slots: at most 3 per owner; alice holds 2, so a 2-rank job waits while
  // bob's 2-rank job runs.
  queues_[0].max_running_jobs_per_owner = 0;
  queues_[0].max_slots_per_owner = 3;
  const std::string a4 = submit("alice", 2);
  const std::string b2 = submit("bob", 2);
  EXPECT_EQ(Get(a4).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(a4).state_reason(), HasSubstr("2 more would pass its max_slots_per_owner of 3"));
  EXPECT_EQ(Get(b2).state(), v1::JOB_STATE_SCHEDULED)
      << "bob holds 1; 2 more make 3: allowed. " << Get(b2).state_reason();
}

}  // namespace
}  // namespace trainctl::coordinator
