// Per-rank resources through the JobManager (scheduler.h, "Resources";
// docs/queues.md): with the real JobManager, WorkerRegistry and SQLite store
// on a fake clock, the placer gives the scheduler each worker's allocatable
// (from its registration) and what its live ranks reserve (from their jobs'
// specs): jobs whose memory does not fit together on one worker go to two,
// or the second waits with a reason naming memory and starts once the first
// has ended; a job with resources skips a worker that cannot enforce limits;
// a job that can never fit is refused at submit naming the resource.
#include "coordinator/jobs/job_manager_fixture.h"

namespace trainctl::coordinator {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

class JobResourcesTest : public JobManagerTest {
 protected:
  // Registers worker `id` with `slots` CPU slots and what it reports it can
  // allocate (as a daemon does at registration).
  void AddSizedWorker(const std::string& id, int slots, double cpus, int64_t memory,
                      bool enforces) {
    v1::Register reg = CpuWorker(id, slots);
    reg.mutable_allocatable()->set_cpus(cpus);
    reg.mutable_allocatable()->set_memory_bytes(memory);
    reg.mutable_allocatable()->set_enforces_limits(enforces);
    RegisterWorker(reg);
  }
  std::string Submit(int world_size, double cpus, int64_t memory) {
    v1::JobSpec spec = Spec(world_size);
    spec.mutable_resources()->set_cpus(cpus);
    spec.mutable_resources()->set_memory(memory);
    auto job = jobs_->Submit(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }
  // The workers of the job's current attempt, in rank order.
  std::vector<std::string> WorkersOf(const std::string& id) {
    std::vector<std::string> out;
    const v1::Job j = Get(id);
    if (j.attempts_size() == 0) return out;
    for (const v1::RankAssignment& r : j.attempts(j.attempts_size() - 1).ranks())
      out.push_back(r.worker_id());
    return out;
  }
};

TEST_F(JobResourcesTest, JobsWhoseMemoryDoesNotFitTogetherGoToDifferentWorkers) {
  // By slots alone the second job would share w1 (the tightest, then by id).
  AddSizedWorker("w1", 4, 8, 16 * kGiB, true);
  AddSizedWorker("w2", 4, 8, 16 * kGiB, true);
  const std::string first = Submit(1, 1, 12 * kGiB);
  const std::string second = Submit(1, 1, 12 * kGiB);
  EXPECT_EQ(Get(first).state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(Get(second).state(), v1::JOB_STATE_SCHEDULED) << Get(second).state_reason();
  EXPECT_EQ(WorkersOf(first), (std::vector<std::string>{"w1"}));
  EXPECT_EQ(WorkersOf(second), (std::vector<std::string>{"w2"}));
  // A job without resources is placed by slots alone, as before: on w1
  // (3 free slots of 4, tied with w2, by id) beside the first job's 12 GiB.
  const std::string plain = Submit(3, 0, 0);
  EXPECT_EQ(WorkersOf(plain), (std::vector<std::string>{"w1", "w1", "w1"}));
}

TEST_F(JobResourcesTest, TheSecondJobWaitsForMemoryWithTheReasonAndStartsWhenTheFirstEnds) {
  AddSizedWorker("w1", 4, 8, 16 * kGiB, true);
  const std::string first = Submit(1, 1, 12 * kGiB);
  const std::string second = Submit(1, 1, 12 * kGiB);
  ASSERT_EQ(Get(first).state(), v1::JOB_STATE_SCHEDULED);
  const v1::Job waiting = Get(second);
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(waiting.state_reason(),
              HasSubstr("needs 1 cpu slots of 1 cpu and 12 GiB memory per rank"));
  EXPECT_THAT(waiting.state_reason(), HasSubstr("4 GiB of 16 GiB memory free"));
  // The same reason in the job list (trainctl list / status read it there).
  v1::ListJobsRequest req;
  auto list = owners_->queries.List(req);
  ASSERT_TRUE(list.ok()) << list.status();
  bool listed = false;
  for (const v1::Job& j : list->jobs()) {
    if (j.id() != second) continue;
    listed = true;
    EXPECT_THAT(j.state_reason(), HasSubstr("12 GiB memory per rank"));
  }
  EXPECT_TRUE(listed);

  // The first job's rank ends: its 12 GiB are free again, the second starts.
  ASSERT_TRUE(Status("w1", first, 1, 0, v1::RANK_STATE_RUNNING).ok());
  ASSERT_TRUE(jobs_->Cancel(first, "done").ok());
  EXPECT_EQ(Get(second).state(), v1::JOB_STATE_PENDING)
      << "the rank still holds its memory until it stops";
  ASSERT_TRUE(Status("w1", first, 1, 0, v1::RANK_STATE_STOPPED).ok());
  EXPECT_EQ(Get(second).state(), v1::JOB_STATE_SCHEDULED) << Get(second).state_reason();
  EXPECT_EQ(WorkersOf(second), (std::vector<std::string>{"w1"}));
}

TEST_F(JobResourcesTest, AJobWithResourcesSkipsAWorkerThatDoesNotEnforceLimits) {
  // plain is the tighter fit but has no writable cgroups: the daemon would
  // fail the launch as CONFIG, so the scheduler never sends it there.
  AddSizedWorker("plain", 2, 64, 256 * kGiB, false);
  AddSizedWorker("limits", 5, 8, 16 * kGiB, true);
  const std::string limited = Submit(2, 1, kGiB);
  EXPECT_EQ(WorkersOf(limited), (std::vector<std::string>{"limits", "limits"}));
  // Without resources: best fit by slots, as before (plain has 2 free,
  // limits 3).
  const std::string unlimited = Submit(2, 0, 0);
  EXPECT_EQ(WorkersOf(unlimited), (std::vector<std::string>{"plain", "plain"}));
  // A pids limit alone also needs cgroups.
  v1::JobSpec spec = Spec(1);
  spec.mutable_resources()->set_pids(64);
  auto pids = jobs_->Submit(spec);
  ASSERT_TRUE(pids.ok()) << pids.status();
  EXPECT_EQ(WorkersOf(pids->id()), (std::vector<std::string>{"limits"}));
}

TEST_F(JobResourcesTest, AJobThatCanNeverFitIsRefusedAtSubmitNamingTheResource) {
  refuse_unschedulable_ = true;
  Open();
  AddSizedWorker("plain", 4, 64, 256 * kGiB, false);
  AddSizedWorker("small", 4, 4, 8 * kGiB, true);
  v1::JobSpec spec = Spec(1);
  spec.mutable_resources()->set_cpus(8);
  auto refused = jobs_->Submit(spec);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      std::string(refused.status().message()),
      HasSubstr(
          "needs 8 cpus per rank; the largest cpu worker that enforces limits has 4 allocatable"));
  // With wait_for_capacity it waits, with the same reason.
  spec.mutable_scheduling()->set_wait_for_capacity(true);
  auto waits = jobs_->Submit(spec);
  ASSERT_TRUE(waits.ok()) << waits.status();
  EXPECT_EQ(Get(waits->id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(waits->id()).state_reason(), HasSubstr("needs 8 cpus per rank"));
}

}  // namespace
}  // namespace trainctl::coordinator
