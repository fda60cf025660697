// GPU flavors through the JobManager (scheduler.h, "Flavors";
// docs/queues.md): with the real JobManager, WorkerRegistry and SQLite
// store, the placer gives the scheduler each worker's flavor (from the
// slots it registered) and each job's resources.gpu_flavor: a job asking
// for h100 runs on the h100 worker only, its ranks' slots say so, a flavor
// no worker has is refused at submit naming it (or waits with
// wait_for_capacity, saying so), and a registration with a bad flavor is
// refused naming the field.
#include "coordinator/jobs/job_manager_fixture.h"

namespace trainctl::coordinator {
namespace {

class JobFlavorsTest : public JobManagerTest {
 protected:
  // What a daemon with `slots` GPUs named `name` of flavor `flavor` sends.
  static v1::Register GpuWorker(const std::string& id, int slots, const std::string& name,
                                const std::string& flavor) {
    v1::Register reg = CpuWorker(id, slots);
    for (v1::Slot& s : *reg.mutable_slots()) {
      s.set_kind(v1::Slot::KIND_GPU);
      s.set_name(name);
      s.set_flavor(flavor);
    }
    return reg;
  }
  static v1::JobSpec GpuSpec(int world_size, const std::string& flavor) {
    v1::JobSpec spec = Spec(world_size);
    spec.set_device(v1::DEVICE_CUDA);
    spec.mutable_resources()->set_gpu_flavor(flavor);
    return spec;
  }
};

TEST_F(JobFlavorsTest, AJobRunsOnlyOnWorkersOfItsFlavor) {
  // By slots alone the job would go to "a" (the tightest, then by id).
  RegisterWorker(GpuWorker("a", 2, "NVIDIA A100-SXM4-80GB", "a100"));
  RegisterWorker(GpuWorker("h", 4, "NVIDIA H100 80GB HBM3", "h100"));
  auto job = jobs_->Submit(GpuSpec(2, "h100"));
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job j = Get(job->id());
  ASSERT_EQ(j.state(), v1::JOB_STATE_SCHEDULED) << j.state_reason();
  ASSERT_EQ(j.attempts(0).ranks_size(), 2);
  for (const v1::RankAssignment& r : j.attempts(0).ranks()) {
    EXPECT_EQ(r.worker_id(), "h");
    EXPECT_EQ(r.slot().flavor(), "h100");
  }
  // A second h100 job takes the two h100 slots left; a third waits,
  // naming its flavor, while the a100s stay free.
  auto second = jobs_->Submit(GpuSpec(2, "h100"));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(Get(second->id()).state(), v1::JOB_STATE_SCHEDULED);
  auto third = jobs_->Submit(GpuSpec(1, "h100"));
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(Get(third->id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(third->id()).state_reason(),
              HasSubstr("needs 1 cuda (h100) slots, 0 of 4 free on 1 worker"));
  // A job without a flavor takes the a100s.
  auto any = jobs_->Submit(GpuSpec(2, ""));
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(Get(any->id()).attempts(0).ranks(0).worker_id(), "a");
}

TEST_F(JobFlavorsTest, AFlavorNoWorkerHasIsRefusedAtSubmitOrWaitsNamingIt) {
  refuse_unschedulable_ = true;
  Open();
  RegisterWorker(GpuWorker("a", 2, "NVIDIA A100-SXM4-80GB", "a100"));
  v1::JobSpec spec = GpuSpec(1, "h100");
  auto refused = jobs_->Submit(spec);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("no schedulable worker has cuda (h100) slots (GPU flavors here: a100)"));
  spec.mutable_scheduling()->set_wait_for_capacity(true);
  auto waits = jobs_->Submit(spec);
  ASSERT_TRUE(waits.ok()) << waits.status();
  EXPECT_EQ(Get(waits->id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(waits->id()).state_reason(),
              HasSubstr("no schedulable worker has cuda (h100) slots"));
  // An h100 worker joins: the job is placed there.
  RegisterWorker(GpuWorker("h", 1, "NVIDIA H100 80GB HBM3", "h100"));
  EXPECT_EQ(Get(waits->id()).state(), v1::JOB_STATE_SCHEDULED) << Get(waits->id()).state_reason();
  EXPECT_EQ(Get(waits->id()).attempts(0).ranks(0).worker_id(), "h");
}

// The placer counts a queue's live ranks on each flavor from their slots
// (RankAssignment.slot.flavor) against the queue's flavor quota.
TEST_F(JobFlavorsTest, AQueuesFlavorQuotaCountsItsRunningJobsOnTheFlavor) {
  scheduler::QueueSpec team;
  team.name = "team";
  team.nominal_gpu_flavors["h100"] = 3;
  std::vector<scheduler::QueueSpec> queues = {team};
  owners_->placer.SetQueueSource([&queues] { return queues; });
  RegisterWorker(GpuWorker("h", 8, "NVIDIA H100 80GB HBM3", "h100"));
  v1::JobSpec spec = GpuSpec(2, "h100");
  spec.set_queue("team");
  auto first = jobs_->Submit(spec);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(Get(first->id()).state(), v1::JOB_STATE_SCHEDULED) << Get(first->id()).state_reason();
  auto second = jobs_->Submit(spec);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(Get(second->id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(
      Get(second->id()).state_reason(),
      HasSubstr("more than its queue's quota admits now (queue team: 2 of 3 cuda (h100) used)"));
  // A job of the queue without a flavor is not held back by it.
  auto plain = jobs_->Submit([&] {
    v1::JobSpec s = GpuSpec(2, "");
    s.set_queue("team");
    return s;
  }());
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(Get(plain->id()).state(), v1::JOB_STATE_SCHEDULED) << Get(plain->id()).state_reason();
}

// Issue #48 item 2: flavor quotas lend and reclaim in the cohort as slot
// quotas do. b's h100 job borrows a's idle h100 quota; a's h100 job within
// its own quota preempts it (the attempt CANCELLED with preempted_for)
// and starts once its ranks have stopped; b's job then waits on its
// flavor quota.
TEST_F(JobFlavorsTest, ACohortLendsAFlavorsIdleQuotaAndReclaimsItByPreemption) {
  std::vector<scheduler::QueueSpec> queues(2);
  for (int i = 0; i < 2; ++i) {
    queues[i].name = i == 0 ? "a" : "b";
    queues[i].cohort = "c";
    queues[i].nominal_gpu_flavors["h100"] = 2;
  }
  owners_->placer.SetQueueSource([&queues] { return queues; });
  RegisterWorker(GpuWorker("h", 4, "NVIDIA H100 80GB HBM3", "h100"));
  auto submit = [&](int world_size, const std::string& queue) {
    v1::JobSpec spec = GpuSpec(world_size, "h100");
    spec.set_queue(queue);
    auto job = jobs_->Submit(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  };
  auto all_ranks = [&](const std::string& id, v1::RankState state) {
    const v1::Job job = Get(id);
    for (const v1::RankAssignment& r : job.attempts(0).ranks())
      ASSERT_TRUE(Status(r.worker_id(), id, 1, r.rank(), state).ok()) << id << " " << r.rank();
  };
  const std::string borrower = submit(4, "b");
  ASSERT_EQ(Get(borrower).state(), v1::JOB_STATE_SCHEDULED) << Get(borrower).state_reason();
  all_ranks(borrower, v1::RANK_STATE_RUNNING);

  const std::string owner = submit(2, "a");
  EXPECT_EQ(Get(owner).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(owner).state_reason(),
              HasSubstr("within its queue's nominal quota (queue a: 0 of 2 cuda (h100) used, "
                        "cohort c: 4 of 4)"));
  const v1::Job victim = Get(borrower);
  EXPECT_EQ(victim.state(), v1::JOB_STATE_RESTARTING);
  ASSERT_EQ(victim.attempts_size(), 1);
  EXPECT_EQ(victim.attempts(0).preempted_for(), owner);

  all_ranks(borrower, v1::RANK_STATE_STOPPED);
  EXPECT_EQ(Get(owner).state(), v1::JOB_STATE_SCHEDULED) << Get(owner).state_reason();
  EXPECT_NE(Get(borrower).state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_THAT(Get(borrower).state_reason(), HasSubstr("cuda (h100) used"));
}

TEST_F(JobFlavorsTest, ARegistrationWithABadFlavorIsRefusedNamingTheSlot) {
  FakeChannel channel;
  v1::Register cpu = CpuWorker("c", 2);
  cpu.mutable_slots(1)->set_flavor("h100");
  auto refused = registry_->Register(cpu, &channel);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), "register.slots[1].flavor: CPU slots have no flavor");
  v1::Register gpu = GpuWorker("g", 1, "NVIDIA H100", "H 100");
  refused = registry_->Register(gpu, &channel);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "register.slots[0].flavor: must start with a lowercase letter or a digit");
}

}  // namespace
}  // namespace trainctl::coordinator
