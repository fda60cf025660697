// QueueRegistry: validation, create/update/delete through the store, the
// scheduler's specs, and the submit-time rule (ResolveQueue); a queue's
// status (queue_status.h: used and borrowed slots).
#include "coordinator/queues/queue_registry.h"

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/queues/queue_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::Queue MakeQueue(const std::string& name) {
  v1::Queue q;
  q.set_name(name);
  return q;
}

v1::JobSpec MakeSpec(int world_size = 2) {
  v1::JobSpec spec;
  spec.set_name("j");
  spec.set_world_size(world_size);
  return spec;
}

class QueueRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = StateStore::Open(":memory:");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    registry_ = std::make_unique<QueueRegistry>(store_.get(), &clock_);
  }
  // Defines queues a and b (a: default priority 7, max job size 4).
  void DefineAB() {
    v1::Queue a = MakeQueue("a");
    a.set_default_priority(7);
    a.set_max_job_size(4);
    a.set_nominal_gpu(8);
    ASSERT_TRUE(registry_->Create(a, false).ok());
    ASSERT_TRUE(registry_->Create(MakeQueue("b"), false).ok());
  }

  FakeClock clock_{absl::FromUnixSeconds(1700000000)};
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<QueueRegistry> registry_;
};

TEST(QueueValidationTest, NamesTheFieldAndTheReason) {
  EXPECT_TRUE(ValidateQueue(MakeQueue("gpu-team-1")).ok());
  auto message = [](const v1::Queue& q) { return std::string(ValidateQueue(q).message()); };
  EXPECT_EQ(message(MakeQueue("")), "queue.name: required");
  EXPECT_THAT(message(MakeQueue("Team")), HasSubstr("queue.name: must be lower-case"));
  EXPECT_THAT(message(MakeQueue("-a")), HasSubstr("queue.name:"));
  EXPECT_EQ(message(MakeQueue(std::string(64, 'a'))), "queue.name: at most 63 characters, got 64");
  EXPECT_TRUE(ValidateQueue(MakeQueue(std::string(63, 'a'))).ok());
  v1::Queue q = MakeQueue("a");
  q.set_nominal_gpu(-3);
  EXPECT_EQ(message(q), "queue.nominal_gpu: must be -1 (unlimited) or >= 0, got -3");
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateQueue(q)));
  q = MakeQueue("a");
  q.set_nominal_cpu(-2);
  EXPECT_EQ(message(q), "queue.nominal_cpu: must be -1 (unlimited) or >= 0, got -2");
  q = MakeQueue("a");
  q.set_nominal_gpu(-1);
  q.set_nominal_cpu(0);
  EXPECT_TRUE(ValidateQueue(q).ok()) << "-1 is unlimited, 0 is none of its own";
  q = MakeQueue("a");
  q.set_cohort("Bad_Cohort");
  EXPECT_THAT(message(q), HasSubstr("queue.cohort: must be lower-case"));
  q = MakeQueue("a");
  q.set_max_job_size(-1);
  EXPECT_EQ(message(q), "queue.max_job_size: must be 0 (no limit) or > 0, got -1");
}

TEST(QueueValidationTest, SpecMapsUnsetNominalsToUnlimited) {
  v1::Queue q = MakeQueue("a");
  q.set_nominal_cpu(0);
  q.set_cohort("c");
  q.set_max_job_size(3);
  scheduler::QueueSpec spec = ToQueueSpec(q);
  EXPECT_EQ(spec.name, "a");
  EXPECT_EQ(spec.nominal_gpu, -1);
  EXPECT_EQ(spec.nominal_cpu, 0);
  EXPECT_EQ(spec.cohort, "c");
  EXPECT_EQ(spec.max_job_size, 3);
  EXPECT_EQ(spec.usage_gpu, 0);
}

TEST(QueueValidationTest, WeightsArePositiveAndUnsetWeighsOne) {
  auto message = [](const v1::Queue& q) { return std::string(ValidateQueue(q).message()); };
  v1::Queue q = MakeQueue("a");
  EXPECT_TRUE(ValidateQueue(q).ok()) << "unset (0) weighs 1";
  EXPECT_EQ(ToQueueSpec(q).weight, 1);
  q.set_weight(-2);
  EXPECT_THAT(message(q), HasSubstr("queue.weight: must be > 0 (0 or unset = 1), got -2"));
  q.set_weight(std::nan(""));
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateQueue(q)));
  q.set_weight(3);
  (*q.mutable_owner_weights())["alice"] = 2;
  (*q.mutable_owner_weights())["bob"] = 0;
  EXPECT_THAT(message(q), HasSubstr("queue.owner_weights[\"bob\"]: must be > 0, got 0"));
  (*q.mutable_owner_weights())["bob"] = 0.5;
  ASSERT_TRUE(ValidateQueue(q).ok());
  const scheduler::QueueSpec spec = ToQueueSpec(q);
  EXPECT_EQ(spec.weight, 3);
  ASSERT_EQ(spec.owners.size(), 2u);
  EXPECT_EQ(spec.owners[0].name, "alice");
  EXPECT_EQ(spec.owners[0].weight, 2);
  EXPECT_EQ(spec.owners[1].name, "bob");
  EXPECT_EQ(spec.owners[1].weight, 0.5);
}

TEST_F(QueueRegistryTest, CreateUpdateDeletePersistAndLoad) {
  EXPECT_TRUE(registry_->empty());
  EXPECT_TRUE(registry_->Specs().empty()) << "no queue defined: the scheduler's implicit queue";
  v1::Queue a = MakeQueue("a");
  a.set_nominal_gpu(4);
  a.set_nominal_cpu(-1);
  auto created = registry_->Create(a, false);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->create_time().seconds(), 1700000000);
  EXPECT_FALSE(created->has_nominal_cpu()) << "-1 is stored as unset";

  EXPECT_EQ(registry_->Create(a, false).status().code(), absl::StatusCode::kAlreadyExists);
  clock_.Advance(absl::Seconds(10));
  a.set_nominal_gpu(6);
  auto updated = registry_->Create(a, true);
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ(updated->nominal_gpu(), 6);
  EXPECT_EQ(updated->create_time().seconds(), 1700000000) << "an update keeps create_time";
  ASSERT_TRUE(registry_->Create(MakeQueue("b"), true).ok())
      << "update of an unknown name creates it";
  EXPECT_EQ(registry_->Create(MakeQueue("B"), false).status().code(),
            absl::StatusCode::kInvalidArgument);

  std::vector<scheduler::QueueSpec> specs = registry_->Specs();
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].name, "a");
  EXPECT_EQ(specs[0].nominal_gpu, 6);
  EXPECT_EQ(specs[0].nominal_cpu, -1);
  EXPECT_EQ(registry_->NameList(), "a, b");

  absl::Status busy = registry_->Delete("a", 2, 1);
  EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(busy.message(), HasSubstr("2 pending and 1 running"));
  EXPECT_EQ(registry_->Delete("zz", 0, 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_->Delete("default", 0, 0).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(registry_->Delete("b", 0, 0).ok());

  // A second registry over the same store sees what was stored.
  QueueRegistry reloaded(store_.get(), &clock_);
  ASSERT_TRUE(reloaded.Load().ok());
  ASSERT_NE(reloaded.Find("a"), nullptr);
  EXPECT_EQ(reloaded.Find("a")->nominal_gpu(), 6);
  EXPECT_EQ(reloaded.Find("b"), nullptr);
  EXPECT_EQ(reloaded.List().size(), 1u);
}

TEST_F(QueueRegistryTest, AFailedStoreWriteChangesNothing) {
  ASSERT_TRUE(registry_->Create(MakeQueue("a"), false).ok());
  store_->SetWriteFaultForTest([](int64_t, absl::string_view) { return true; });
  EXPECT_EQ(registry_->Create(MakeQueue("b"), false).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(registry_->Delete("a", 0, 0).code(), absl::StatusCode::kUnavailable);
  store_->SetWriteFaultForTest(nullptr);
  EXPECT_EQ(registry_->Find("b"), nullptr);
  EXPECT_NE(registry_->Find("a"), nullptr);
}

TEST_F(QueueRegistryTest, ResolveWithoutQueuesKeepsTodaysBehaviour) {
  v1::JobSpec spec = MakeSpec(64);
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  EXPECT_EQ(spec.queue(), "default");
  EXPECT_FALSE(spec.has_priority()) << "no queue: priority stays unset (0)";
  spec = MakeSpec();
  spec.set_queue("anything");
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  EXPECT_EQ(spec.queue(), "anything") << "kept as given";
  spec = MakeSpec();
  spec.set_queue("Not Valid");
  EXPECT_EQ(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(QueueRegistryTest, ResolveGoesToTheTokensFirstQueueElseDefault) {
  DefineAB();
  ASSERT_TRUE(registry_->Create(MakeQueue("default"), false).ok());
  const std::vector<std::string> token_queues = {"b", "a"};
  v1::JobSpec spec = MakeSpec();
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, token_queues, *registry_).ok());
  EXPECT_EQ(spec.queue(), "b");
  spec = MakeSpec();
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  EXPECT_EQ(spec.queue(), "default");
}

TEST_F(QueueRegistryTest, ResolveRefusesAQueueTheTokenIsNotBoundTo) {
  DefineAB();
  const std::vector<std::string> token_queues = {"a"};
  v1::JobSpec spec = MakeSpec();
  spec.set_queue("b");
  absl::Status s = ResolveQueue(spec, v1::ROLE_SUBMITTER, token_queues, *registry_);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), "queue: this token may not submit to queue 'b' (its queues: a)");
  spec.set_queue("b");
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_ADMIN, token_queues, *registry_).ok())
      << "admins submit anywhere";
}

TEST_F(QueueRegistryTest, ResolveRefusesAnUndefinedQueue) {
  DefineAB();
  v1::JobSpec spec = MakeSpec();
  spec.set_queue("x");
  absl::Status s = ResolveQueue(spec, v1::ROLE_ADMIN, {}, *registry_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "queue: no queue named 'x' (defined: a, b)");
  spec = MakeSpec();
  s = ResolveQueue(spec, v1::ROLE_ADMIN, {}, *registry_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "queue: this job names no queue and no queue is the default (defined: a, b); name one "
            "(queue: NAME in "
            "the job file, or --queue NAME) or mark one the default (trainctl queue create NAME "
            "--default, or "
            "--update --default for an existing one)")
      << "with queues defined and none the default or named 'default', the error says how to fix "
         "it";
}

TEST_F(QueueRegistryTest, AtMostOneQueueIsTheDefaultAndItSurvivesAReload) {
  DefineAB();
  EXPECT_EQ(registry_->DefaultQueue(), nullptr);
  v1::Queue c = MakeQueue("c");
  c.set_default_queue(true);
  ASSERT_TRUE(registry_->Create(c, false).ok());
  ASSERT_NE(registry_->DefaultQueue(), nullptr);
  EXPECT_EQ(registry_->DefaultQueue()->name(), "c");

  // Marking a (by update) un-marks c, in memory and in the store.
  v1::Queue a = *registry_->Find("a");
  a.set_default_queue(true);
  ASSERT_TRUE(registry_->Create(a, true).ok());
  EXPECT_EQ(registry_->DefaultQueue()->name(), "a");
  EXPECT_FALSE(registry_->Find("c")->default_queue());
  QueueRegistry reloaded(store_.get(), &clock_);
  ASSERT_TRUE(reloaded.Load().ok());
  ASSERT_NE(reloaded.DefaultQueue(), nullptr);
  EXPECT_EQ(reloaded.DefaultQueue()->name(), "a");
  EXPECT_FALSE(reloaded.Find("c")->default_queue()) << "the un-marking was stored";

  // Re-marking the default itself writes nothing else; an update without
  // the mark un-marks it (an update replaces the whole queue).
  ASSERT_TRUE(registry_->Create(a, true).ok());
  EXPECT_EQ(registry_->DefaultQueue()->name(), "a");
  a.set_default_queue(false);
  ASSERT_TRUE(registry_->Create(a, true).ok());
  EXPECT_EQ(registry_->DefaultQueue(), nullptr);

  // Deleting the default leaves none.
  ASSERT_TRUE(registry_->Create(c, true).ok());
  ASSERT_TRUE(registry_->Delete("c", 0, 0).ok());
  EXPECT_EQ(registry_->DefaultQueue(), nullptr);
  ASSERT_TRUE(reloaded.Load().ok());
  EXPECT_EQ(reloaded.DefaultQueue(), nullptr);
}

TEST_F(QueueRegistryTest, AFailedWriteOfTheNewDefaultLeavesNoneNotTwo) {
  v1::Queue a = MakeQueue("a");
  a.set_default_queue(true);
  ASSERT_TRUE(registry_->Create(a, false).ok());
  v1::Queue b = MakeQueue("b");
  b.set_default_queue(true);
  // The un-marking of a is stored, the write of b fails.
  store_->SetWriteFaultForTest([](int64_t, absl::string_view op) { return op == "PutQueue('b')"; });
  absl::StatusOr<v1::Queue> failed = registry_->Create(b, false);
  store_->SetWriteFaultForTest(nullptr);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(failed.status().message(),
              HasSubstr("(queue 'a' was already un-marked: no queue is the default now)"));
  EXPECT_EQ(registry_->Find("b"), nullptr);
  EXPECT_EQ(registry_->DefaultQueue(), nullptr) << "memory follows the store";
  QueueRegistry reloaded(store_.get(), &clock_);
  ASSERT_TRUE(reloaded.Load().ok());
  EXPECT_EQ(reloaded.DefaultQueue(), nullptr);
  EXPECT_EQ(reloaded.Find("b"), nullptr);

  // A failed un-marking changes nothing: a stays the default.
  ASSERT_TRUE(registry_->Create(a, true).ok());
  store_->SetWriteFaultForTest([](int64_t, absl::string_view op) { return op == "PutQueue('a')"; });
  failed = registry_->Create(b, false);
  store_->SetWriteFaultForTest(nullptr);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(registry_->DefaultQueue()->name(), "a");
  EXPECT_EQ(registry_->Find("b"), nullptr);
}

TEST_F(QueueRegistryTest, ResolvePutsAJobNamingNoQueueInTheDefault) {
  DefineAB();
  ASSERT_TRUE(registry_->Create(MakeQueue("default"), false).ok());
  v1::Queue b = *registry_->Find("b");
  b.set_default_queue(true);
  ASSERT_TRUE(registry_->Create(b, true).ok());
  v1::JobSpec spec = MakeSpec();
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_ADMIN, {}, *registry_).ok());
  EXPECT_EQ(spec.queue(), "b") << "the marked queue wins over the one named 'default'";
  spec = MakeSpec();
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {"a"}, *registry_).ok());
  EXPECT_EQ(spec.queue(), "a") << "a token's queues come first";
  EXPECT_EQ(spec.priority(), 7);
  spec = MakeSpec();
  spec.set_queue("a");
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_ADMIN, {}, *registry_).ok());
  EXPECT_EQ(spec.queue(), "a") << "a job naming a queue keeps it";
}

TEST_F(QueueRegistryTest, ResolveFillsTheQueuesDefaultPriority) {
  DefineAB();
  v1::JobSpec spec = MakeSpec();
  spec.set_queue("a");
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  ASSERT_TRUE(spec.has_priority());
  EXPECT_EQ(spec.priority(), 7);
  spec = MakeSpec();
  spec.set_queue("a");
  spec.set_priority(0);
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  EXPECT_EQ(spec.priority(), 0) << "an explicit 0 is kept";
  spec = MakeSpec();
  spec.set_queue("b");
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  EXPECT_EQ(spec.priority(), 0);
}

TEST_F(QueueRegistryTest, ResolveRefusesAJobOverTheQueuesMaxJobSize) {
  DefineAB();
  v1::JobSpec spec = MakeSpec(5);
  spec.set_queue("a");
  absl::Status s = ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "world_size: 5 ranks exceed queue 'a''s max_job_size of 4");
  // An elastic job counts its least size.
  spec = MakeSpec(8);
  spec.set_queue("a");
  spec.mutable_elastic()->set_min_ranks(4);
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  spec.mutable_elastic()->set_min_ranks(5);
  s = ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_);
  EXPECT_EQ(s.message(), "elastic.min_ranks: 5 ranks exceed queue 'a''s max_job_size of 4");
  spec = MakeSpec(64);
  spec.set_queue("b");
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok()) << "0 = no limit";
}

TEST(QueueValidationTest, BorrowingAndLendingLimitsNeedAFiniteNominalAndLendOnlyIt) {
  auto message = [](const v1::Queue& q) { return std::string(ValidateQueue(q).message()); };
  v1::Queue q = MakeQueue("a");
  q.set_nominal_gpu(4);
  q.set_borrowing_limit_gpu(2);
  q.set_lending_limit_gpu(4);
  EXPECT_TRUE(ValidateQueue(q).ok()) << message(q);
  q.set_lending_limit_gpu(5);
  EXPECT_EQ(message(q),
            "queue.lending_limit_gpu: 5 is more than the queue's nominal_gpu of 4 (it lends only "
            "its own quota)");
  q.set_lending_limit_gpu(-2);
  EXPECT_EQ(message(q), "queue.lending_limit_gpu: must be -1 (no limit) or >= 0, got -2");
  q = MakeQueue("a");
  q.set_borrowing_limit_cpu(1);
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateQueue(q)));
  EXPECT_THAT(message(q), HasSubstr("queue.borrowing_limit_cpu: needs a nominal_cpu quota"));
  q.set_borrowing_limit_cpu(-1);
  EXPECT_TRUE(ValidateQueue(q).ok()) << "-1 is no limit, on any queue";
  // Unset stays no limit for the scheduler; 0 is a limit.
  q = MakeQueue("a");
  q.set_nominal_cpu(2);
  q.set_borrowing_limit_cpu(0);
  const scheduler::QueueSpec spec = ToQueueSpec(q);
  EXPECT_EQ(spec.borrowing_limit_cpu, 0);
  EXPECT_EQ(spec.lending_limit_cpu, -1);
  EXPECT_EQ(spec.borrowing_limit_gpu, -1);
  EXPECT_EQ(spec.lending_limit_gpu, -1);
}

// Issue #48: a job its queue and cohort can never run is refused at submit,
// saying why, unless it asks to wait (scheduling.wait_for_capacity).
TEST_F(QueueRegistryTest, ResolveRefusesAJobItsQueueAndCohortCanNeverRun) {
  // a: 2 GPUs, may borrow 3; b: 4 GPUs, lends at most 1; c: 8 CPU slots,
  // an owner may hold 4.
  v1::Queue a = MakeQueue("a");
  a.set_nominal_gpu(2);
  a.set_borrowing_limit_gpu(3);
  a.set_cohort("lab");
  v1::Queue b = MakeQueue("b");
  b.set_nominal_gpu(4);
  b.set_lending_limit_gpu(1);
  b.set_cohort("lab");
  v1::Queue c = MakeQueue("c");
  c.set_nominal_cpu(8);
  c.set_max_slots_per_owner(4);
  for (const v1::Queue& q : {a, b, c}) ASSERT_TRUE(registry_->Create(q, false).ok());

  // a can ever hold 2 + the 1 b lends = 3 GPUs (its borrowing limit of 3
  // does not bind).
  v1::JobSpec spec = MakeSpec(3);
  spec.set_queue("a");
  spec.set_device(v1::DEVICE_CUDA);
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  spec.set_world_size(4);
  absl::Status s = ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      s.message(),
      HasSubstr("world_size: 4 ranks are more than queue 'a' can ever run (3 cuda slots: its "
                "nominal quota plus what its cohort could lend, within the borrowing and "
                "lending limits)"));
  EXPECT_THAT(s.message(), HasSubstr("--wait-for-capacity"));
  // Asking to wait takes it (it stays pending, saying why).
  spec.mutable_scheduling()->set_wait_for_capacity(true);
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  // An auto job may run on CPU slots, where a is unlimited: taken.
  spec = MakeSpec(4);
  spec.set_queue("a");
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  // An elastic job counts its least size.
  spec = MakeSpec(6);
  spec.set_queue("a");
  spec.set_device(v1::DEVICE_CUDA);
  spec.mutable_elastic()->set_min_ranks(3);
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  spec.mutable_elastic()->set_min_ranks(4);
  EXPECT_THAT(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).message(),
              HasSubstr("elastic.min_ranks: 4 ranks are more than queue 'a' can ever run"));

  // b holds its own 4 plus the 2 a lends (a has no lending limit): 6.
  spec = MakeSpec(6);
  spec.set_queue("b");
  spec.set_device(v1::DEVICE_CUDA);
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  spec.set_world_size(7);
  EXPECT_THAT(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).message(),
              HasSubstr("(6 cuda slots: "));

  // Over the per-owner slots: one owner can never hold it.
  spec = MakeSpec(5);
  spec.set_queue("c");
  spec.set_device(v1::DEVICE_CPU);
  s = ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("world_size: 5 slots exceed queue 'c''s max_slots_per_owner of 4"));
  spec.mutable_scheduling()->set_wait_for_capacity(true);
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
}

// Issue #48: quotas in CPUs and memory (Queue fields 20-25) follow the slot
// kinds' rules, naming the field and the reason.
TEST(QueueValidationTest, CpuAndMemoryQuotasNameTheFieldAndTheReason) {
  auto message = [](const v1::Queue& q) { return std::string(ValidateQueue(q).message()); };
  v1::Queue q = MakeQueue("a");
  q.set_nominal_cpus(16.5);
  q.set_borrowing_limit_cpus(4);
  q.set_lending_limit_cpus(16.5);
  q.set_nominal_memory_bytes(int64_t{64} << 30);
  q.set_borrowing_limit_memory_bytes(0);
  q.set_lending_limit_memory_bytes(int64_t{16} << 30);
  EXPECT_TRUE(ValidateQueue(q).ok()) << message(q);
  q.set_nominal_cpus(std::nan(""));
  EXPECT_THAT(
      message(q),
      HasSubstr("queue.nominal_cpus: must be -1 (unlimited) or finite, >= 0 and < 1e15, got nan"));
  q.set_nominal_cpus(-0.5);
  EXPECT_THAT(message(q), HasSubstr("queue.nominal_cpus: must be -1 (unlimited) or finite"));
  q.set_nominal_cpus(std::numeric_limits<double>::infinity());
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateQueue(q)));
  q.set_nominal_cpus(16);
  q.set_lending_limit_cpus(17);
  EXPECT_EQ(message(q),
            "queue.lending_limit_cpus: 17 is more than the queue's nominal_cpus of 16 (it lends "
            "only its own quota)");
  q.set_lending_limit_cpus(-1);
  q.set_borrowing_limit_memory_bytes(-3);
  EXPECT_EQ(message(q),
            "queue.borrowing_limit_memory_bytes: must be -1 (no limit) or finite, >= 0 and < 1e15, "
            "got -3");
  q.set_borrowing_limit_memory_bytes(-1);
  EXPECT_TRUE(ValidateQueue(q).ok()) << message(q);
  // A limit needs a finite nominal of its resource.
  q = MakeQueue("a");
  q.set_nominal_cpu(4);  // slots do not count
  q.set_lending_limit_memory_bytes(1024);
  EXPECT_THAT(message(q),
              HasSubstr("queue.lending_limit_memory_bytes: needs a nominal_memory_bytes quota"));
  q.set_nominal_memory_bytes(-1);
  EXPECT_THAT(message(q), HasSubstr("needs a nominal_memory_bytes quota"));
  // The scheduler's spec: unset is -1 (unlimited / no limit).
  q = MakeQueue("a");
  q.set_nominal_cpus(8);
  q.set_borrowing_limit_cpus(0);
  q.set_nominal_memory_bytes(4096);
  const scheduler::QueueSpec spec = ToQueueSpec(q);
  EXPECT_EQ(spec.nominal_cpus, 8);
  EXPECT_EQ(spec.borrowing_limit_cpus, 0);
  EXPECT_EQ(spec.lending_limit_cpus, -1);
  EXPECT_EQ(spec.nominal_memory_bytes, 4096);
  EXPECT_EQ(spec.borrowing_limit_memory_bytes, -1);
  EXPECT_EQ(spec.lending_limit_memory_bytes, -1);
  EXPECT_EQ(ToQueueSpec(MakeQueue("b")).nominal_cpus, -1);
}

// A job its queue and cohort can never hold in CPUs or memory is refused at
// submit, naming the resource, what it asks and the most the queue holds.
TEST_F(QueueRegistryTest, ResolveRefusesAJobOverItsQueuesCpuOrMemoryCeiling) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  // a: 16 GiB of memory, may borrow 16 more; b: 64 GiB, lends at most 16;
  // c: 8 CPUs, -1 stored as unlimited memory.
  v1::Queue a = MakeQueue("a");
  a.set_nominal_memory_bytes(16 * kGiB);
  a.set_borrowing_limit_memory_bytes(16 * kGiB);
  a.set_cohort("lab");
  v1::Queue b = MakeQueue("b");
  b.set_nominal_memory_bytes(64 * kGiB);
  b.set_lending_limit_memory_bytes(16 * kGiB);
  b.set_cohort("lab");
  v1::Queue c = MakeQueue("c");
  c.set_nominal_cpus(8);
  c.set_nominal_memory_bytes(-1);
  for (const v1::Queue& q : {a, b, c}) ASSERT_TRUE(registry_->Create(q, false).ok());
  EXPECT_FALSE(registry_->Find("c")->has_nominal_memory_bytes()) << "-1 is stored as unset";

  v1::JobSpec spec = MakeSpec(2);
  spec.set_queue("a");
  spec.mutable_resources()->set_memory(16 * kGiB);
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  spec.set_world_size(4);
  absl::Status s = ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("resources.memory: the job asks 64 GiB (4 ranks of 16 GiB); queue 'a' with "
                        "its cohort can hold at most 32 GiB"));
  EXPECT_THAT(s.message(), HasSubstr("--wait-for-capacity"));
  spec.mutable_scheduling()->set_wait_for_capacity(true);
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  // b: its own 64 GiB plus all a lends (16: a has no lending limit).
  spec = MakeSpec(5);
  spec.set_queue("b");
  spec.mutable_resources()->set_memory(16 * kGiB);
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  spec.set_world_size(6);
  EXPECT_THAT(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).message(),
              HasSubstr("at most 80 GiB"));
  // CPUs: an elastic job counts its least size.
  spec = MakeSpec(4);
  spec.set_queue("c");
  spec.mutable_resources()->set_cpus(4);
  spec.mutable_elastic()->set_min_ranks(2);
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  spec.mutable_elastic()->set_min_ranks(3);
  EXPECT_THAT(
      ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).message(),
      HasSubstr(
          "resources.cpus: the job asks 12 cpus (3 ranks of 4 cpus); queue 'c' with its cohort can "
          "hold at most 8 cpus"));
  // A job asking for no CPUs holds none: never refused by a CPU quota.
  spec.mutable_resources()->set_cpus(0);
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
}

// Slurm's DefaultTime / MaxTime: a job giving no scheduling.max_runtime_s
// gets the queue's default (else its maximum); one asking more than the
// maximum is refused at submit, naming the field and the maximum.
TEST_F(QueueRegistryTest, ResolveAppliesTheQueuesRuntimeDefaultAndRefusesAboveItsMax) {
  v1::Queue a = MakeQueue("a");
  a.set_default_max_runtime_s(3600);
  a.set_max_runtime_s(7200);
  ASSERT_TRUE(registry_->Create(a, false).ok());
  v1::Queue b = MakeQueue("b");
  b.set_max_runtime_s(600);
  ASSERT_TRUE(registry_->Create(b, false).ok());
  ASSERT_TRUE(registry_->Create(MakeQueue("c"), false).ok());

  v1::JobSpec spec = MakeSpec();
  spec.set_queue("a");
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  EXPECT_EQ(spec.scheduling().max_runtime_s(), 3600) << "the queue's default";
  spec = MakeSpec();
  spec.set_queue("a");
  spec.mutable_scheduling()->set_max_runtime_s(7200);
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  EXPECT_EQ(spec.scheduling().max_runtime_s(), 7200) << "the job's own, up to the maximum";
  spec.mutable_scheduling()->set_max_runtime_s(7201);
  absl::Status s = ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "scheduling.max_runtime_s: 7201 s exceeds queue 'a''s max_runtime_s of 7200 s");

  spec = MakeSpec();
  spec.set_queue("b");
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  EXPECT_EQ(spec.scheduling().max_runtime_s(), 600) << "no default: the maximum";
  spec = MakeSpec();
  spec.set_queue("c");
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  EXPECT_EQ(spec.scheduling().max_runtime_s(), 0) << "neither: no limit";
  spec.mutable_scheduling()->set_max_runtime_s(1e9);
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
}

TEST(QueueValidationTest, RuntimeLimitsAreNonNegativeAndTheDefaultWithinTheMax) {
  auto message = [](const v1::Queue& q) { return std::string(ValidateQueue(q).message()); };
  v1::Queue q = MakeQueue("a");
  q.set_max_runtime_s(-1);
  EXPECT_EQ(message(q), "queue.max_runtime_s: must be 0 (no limit) or > 0 seconds, got -1");
  q = MakeQueue("a");
  q.set_default_max_runtime_s(std::nan(""));
  EXPECT_THAT(message(q),
              HasSubstr("queue.default_max_runtime_s: must be 0 (no limit) or > 0 seconds"));
  q = MakeQueue("a");
  q.set_default_max_runtime_s(100);
  q.set_max_runtime_s(50);
  EXPECT_EQ(message(q), "queue.default_max_runtime_s: 100 exceeds the queue's max_runtime_s of 50");
  q.set_max_runtime_s(0);
  EXPECT_TRUE(ValidateQueue(q).ok()) << "a default without a maximum";
}

TEST(QueueValidationTest, DefaultResourcesHaveTheJobsBoundsAndNameTheField) {
  auto message = [](const v1::Queue& q) { return std::string(ValidateQueue(q).message()); };
  v1::Queue q = MakeQueue("a");
  q.mutable_default_resources()->set_cpus(2);
  q.mutable_default_resources()->set_memory(int64_t{4} << 30);
  q.mutable_default_resources()->set_pids(512);
  EXPECT_TRUE(ValidateQueue(q).ok());
  q.mutable_default_resources()->set_memory(100);
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateQueue(q)));
  EXPECT_EQ(message(q),
            "queue.default_resources.memory: must be 0 (no limit) or at least 1Mi (1048576 bytes), "
            "got 100");
  q.mutable_default_resources()->set_memory(0);
  q.mutable_default_resources()->set_cpus(-1);
  EXPECT_EQ(message(q),
            "queue.default_resources.cpus: must be 0 (no limit) or in [0.01, 4096] CPUs, got -1");
  q.mutable_default_resources()->set_cpus(0);
  q.mutable_default_resources()->set_pids(2);
  EXPECT_EQ(message(q),
            "queue.default_resources.pids: must be 0 (no limit) or in [8, 4194304], got 2");
  q.mutable_default_resources()->set_pids(0);
  q.mutable_default_resources()->set_gpu_flavor("h100");
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateQueue(q)));
  EXPECT_EQ(message(q).rfind("queue.default_resources.gpu_flavor: a queue gives default limits", 0),
            0u)
      << message(q);
}

TEST(QueueValidationTest, GpuFlavorQuotasNameTheFlavorAndReachTheScheduler) {
  auto message = [](const v1::Queue& q) { return std::string(ValidateQueue(q).message()); };
  v1::Queue q = MakeQueue("a");
  (*q.mutable_nominal_gpu_flavors())["h100"] = 4;
  (*q.mutable_nominal_gpu_flavors())["a100"] = 0;
  EXPECT_TRUE(ValidateQueue(q).ok());
  const scheduler::QueueSpec spec = ToQueueSpec(q);
  EXPECT_EQ(spec.nominal_gpu_flavors, (std::map<std::string, int>{{"a100", 0}, {"h100", 4}}));
  (*q.mutable_nominal_gpu_flavors())["h100"] = -1;
  EXPECT_EQ(message(q), "queue.nominal_gpu_flavors[h100]: must be >= 0 GPU slots, got -1");
  q.mutable_nominal_gpu_flavors()->erase("h100");
  (*q.mutable_nominal_gpu_flavors())["H100"] = 1;
  EXPECT_EQ(
      message(q),
      "queue.nominal_gpu_flavors: flavor 'H100' must start with a lowercase letter or a digit");
}

// Issue #48 item 2: borrowing and lending limits per flavor, checked as the
// slot kinds' limits are, each error naming the field and the flavor.
TEST(QueueValidationTest, GpuFlavorLimitsNeedTheFlavorsNominalAndReachTheScheduler) {
  auto message = [](const v1::Queue& q) { return std::string(ValidateQueue(q).message()); };
  v1::Queue q = MakeQueue("a");
  (*q.mutable_nominal_gpu_flavors())["h100"] = 4;
  (*q.mutable_borrowing_limit_gpu_flavors())["h100"] = 2;
  (*q.mutable_lending_limit_gpu_flavors())["h100"] = 1;
  ASSERT_TRUE(ValidateQueue(q).ok()) << message(q);
  const scheduler::QueueSpec spec = ToQueueSpec(q);
  EXPECT_EQ(spec.borrowing_limit_gpu_flavors, (std::map<std::string, int>{{"h100", 2}}));
  EXPECT_EQ(spec.lending_limit_gpu_flavors, (std::map<std::string, int>{{"h100", 1}}));
  // 0 is a limit: borrows nothing / lends nothing.
  (*q.mutable_borrowing_limit_gpu_flavors())["h100"] = 0;
  (*q.mutable_lending_limit_gpu_flavors())["h100"] = 0;
  EXPECT_TRUE(ValidateQueue(q).ok()) << message(q);

  (*q.mutable_borrowing_limit_gpu_flavors())["h100"] = -1;
  EXPECT_EQ(message(q), "queue.borrowing_limit_gpu_flavors[h100]: must be >= 0 GPU slots, got -1");
  (*q.mutable_borrowing_limit_gpu_flavors())["h100"] = 2;
  (*q.mutable_lending_limit_gpu_flavors())["h100"] = 5;
  EXPECT_EQ(message(q),
            "queue.lending_limit_gpu_flavors[h100]: 5 is more than the queue's "
            "nominal_gpu_flavors[h100] of 4 (it lends only its own quota)");
  (*q.mutable_lending_limit_gpu_flavors())["h100"] = 1;
  (*q.mutable_lending_limit_gpu_flavors())["a100"] = 1;
  EXPECT_EQ(message(q),
            "queue.lending_limit_gpu_flavors[a100]: needs a nominal_gpu_flavors[a100] quota (a "
            "queue not limited by a flavor neither lends nor borrows it)");
  q.mutable_lending_limit_gpu_flavors()->erase("a100");
  (*q.mutable_borrowing_limit_gpu_flavors())["a100"] = 3;
  EXPECT_EQ(message(q),
            "queue.borrowing_limit_gpu_flavors[a100]: needs a nominal_gpu_flavors[a100] quota (a "
            "queue not limited by a flavor neither lends nor borrows it)");
  q.mutable_borrowing_limit_gpu_flavors()->erase("a100");
  (*q.mutable_borrowing_limit_gpu_flavors())["A100"] = 3;
  EXPECT_EQ(message(q),
            "queue.borrowing_limit_gpu_flavors: flavor 'A100' must start with a lowercase letter "
            "or a digit");
}

TEST_F(QueueRegistryTest, ResolveRefusesAJobOverItsQueuesFlavorQuota) {
  v1::Queue q = MakeQueue("gpus");
  (*q.mutable_nominal_gpu_flavors())["h100"] = 2;
  ASSERT_TRUE(registry_->Create(q, false).ok());
  v1::JobSpec spec = MakeSpec(2);
  spec.set_queue("gpus");
  spec.mutable_resources()->set_gpu_flavor("h100");
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  spec.set_world_size(3);
  absl::Status s = ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("resources.gpu_flavor: 3 h100 GPUs exceed the most queue "
                                   "'gpus' can ever hold of h100 (2: its nominal_gpu_flavors "
                                   "quota plus what its cohort could lend"));
  // A cohort that could lend it one more h100 takes it; its borrowing
  // limit bounds it again.
  q.set_cohort("c");
  ASSERT_TRUE(registry_->Create(q, true).ok());
  v1::Queue lender = MakeQueue("lender");
  lender.set_cohort("c");
  (*lender.mutable_nominal_gpu_flavors())["h100"] = 4;
  (*lender.mutable_lending_limit_gpu_flavors())["h100"] = 1;
  ASSERT_TRUE(registry_->Create(lender, false).ok());
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  spec.set_world_size(4);
  EXPECT_FALSE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok()) << "lends only 1";
  spec.set_world_size(3);
  (*q.mutable_borrowing_limit_gpu_flavors())["h100"] = 0;
  ASSERT_TRUE(registry_->Create(q, true).ok());
  s = ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("can ever hold of h100 (2:"));
  // Another flavor, or none, is not bound by it; wait_for_capacity takes it.
  spec.mutable_resources()->set_gpu_flavor("a100");
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  spec.mutable_resources()->set_gpu_flavor("h100");
  spec.mutable_scheduling()->set_wait_for_capacity(true);
  EXPECT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
}

TEST_F(QueueRegistryTest, ResolveGivesAJobWithoutResourcesTheQueuesDefaultResources) {
  v1::Queue batch = MakeQueue("batch");
  batch.mutable_default_resources()->set_cpus(2);
  batch.mutable_default_resources()->set_memory(int64_t{4} << 30);
  ASSERT_TRUE(registry_->Create(batch, false).ok());
  v1::Queue none = MakeQueue("none");
  none.mutable_default_resources();  // all 0: stored as unset
  auto made = registry_->Create(none, false);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_FALSE(made->has_default_resources());

  v1::JobSpec spec = MakeSpec();
  spec.set_queue("batch");
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  EXPECT_EQ(spec.resources().cpus(), 2);
  EXPECT_EQ(spec.resources().memory(), int64_t{4} << 30);
  EXPECT_EQ(spec.resources().pids(), 0);
  // A job that gives any of the three keeps exactly its own.
  spec = MakeSpec();
  spec.set_queue("batch");
  spec.mutable_resources()->set_pids(64);
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  EXPECT_EQ(spec.resources().cpus(), 0);
  EXPECT_EQ(spec.resources().memory(), 0);
  EXPECT_EQ(spec.resources().pids(), 64);
  // A job that names only a GPU flavor gets the defaults and keeps its flavor.
  spec = MakeSpec();
  spec.set_queue("batch");
  spec.mutable_resources()->set_gpu_flavor("h100");
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  EXPECT_EQ(spec.resources().cpus(), 2);
  EXPECT_EQ(spec.resources().gpu_flavor(), "h100");
  // A queue without defaults leaves the job without resources.
  spec = MakeSpec();
  spec.set_queue("none");
  ASSERT_TRUE(ResolveQueue(spec, v1::ROLE_SUBMITTER, {}, *registry_).ok());
  EXPECT_FALSE(spec.has_resources());
  // Kept across a reload from the store.
  QueueRegistry reloaded(store_.get(), &clock_);
  ASSERT_TRUE(reloaded.Load().ok());
  ASSERT_NE(reloaded.Find("batch"), nullptr);
  EXPECT_EQ(reloaded.Find("batch")->default_resources().memory(), int64_t{4} << 30);
}

TEST(QueueStatusTest, UsedSlotsAndBorrowingFollowTheNominalQuota) {
  v1::Queue q;
  q.set_name("a");
  q.set_nominal_cpu(2);
  std::map<std::string, QueueUsage> usages;
  auto usage = [](int32_t gpu, int32_t cpu, int32_t pending, int32_t running) {
    QueueUsage u;
    u.used_gpu = gpu;
    u.used_cpu = cpu;
    u.pending_jobs = pending;
    u.running_jobs = running;
    return u;
  };
  usages["a"] = usage(1, 5, 3, 2);
  usages["other"] = usage(7, 7, 7, 7);
  const v1::QueueStatus st = QueueStatusOf(q, usages);
  EXPECT_EQ(st.queue().name(), "a");
  EXPECT_EQ(st.used_gpu(), 1);
  EXPECT_EQ(st.used_cpu(), 5);
  EXPECT_EQ(st.pending_jobs(), 3);
  EXPECT_EQ(st.running_jobs(), 2);
  EXPECT_EQ(st.borrowed_cpu(), 3) << "5 used on a nominal of 2";
  EXPECT_EQ(st.borrowed_gpu(), 0) << "an unlimited nominal borrows nothing";
  EXPECT_EQ(BorrowedSlots(1, true, 2), 0);
  EXPECT_EQ(BorrowedSlots(1, true, 0), 1)
      << "a queue with no quota of its own borrows all it holds";
  v1::Queue idle;
  idle.set_name("idle");
  const std::vector<v1::QueueStatus> all = QueueStatusesOf({q, idle}, usages);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1].used_cpu(), 0) << "a queue without live jobs uses nothing";
  EXPECT_EQ(all[1].pending_jobs(), 0);
}

// Issue #48: the use of every quota dimension, as the scheduler counts it:
// CPUs from thousandths (a nominal rounded down to one), memory in bytes,
// GPU slots by flavor; borrowed = beyond the queue's own nominal.
TEST(QueueStatusTest, UsedAndBorrowedCpusMemoryAndFlavorsFollowTheirNominals) {
  v1::Queue q;
  q.set_name("a");
  q.set_nominal_cpus(2.5);
  q.set_nominal_memory_bytes(int64_t{8} << 30);
  (*q.mutable_nominal_gpu_flavors())["h100"] = 4;
  std::map<std::string, QueueUsage> usages;
  QueueUsage& u = usages["a"];
  u.used_gpu = 3;
  u.used_cpu = 2;
  u.used_milli_cpus = 3500;  // e.g. 2 CPU ranks of 1.5 and one GPU rank of 0.5
  u.used_memory_bytes = int64_t{12} << 30;
  u.used_gpu_flavors = {{"h100", 2}, {"a100", 1}};
  const v1::QueueStatus st = QueueStatusOf(q, usages);
  EXPECT_DOUBLE_EQ(st.used_cpus(), 3.5);
  EXPECT_DOUBLE_EQ(st.borrowed_cpus(), 1.0) << "3.5 CPUs used on a nominal of 2.5";
  EXPECT_EQ(st.used_memory_bytes(), int64_t{12} << 30);
  EXPECT_EQ(st.borrowed_memory_bytes(), int64_t{4} << 30) << "12 GiB used on a nominal of 8 GiB";
  ASSERT_EQ(st.used_gpu_flavors_size(), 2);
  EXPECT_EQ(st.used_gpu_flavors().at("h100"), 2);
  EXPECT_EQ(st.used_gpu_flavors().at("a100"), 1) << "shown with or without a quota of its own";
  EXPECT_EQ(st.borrowed_gpu_flavors_size(), 0) << "2 of 4 h100s; no a100 quota";
  v1::Queue small = q;
  small.set_name("small");
  (*small.mutable_nominal_gpu_flavors())["h100"] = 1;
  usages["small"] = u;
  const v1::QueueStatus over = QueueStatusOf(small, usages);
  ASSERT_EQ(over.borrowed_gpu_flavors_size(), 1);
  EXPECT_EQ(over.borrowed_gpu_flavors().at("h100"), 1) << "2 h100s held on a nominal of 1";
  EXPECT_EQ(st.borrowed_gpu(), 0) << "no GPU slot quota: nothing borrowed";

  // Within the nominals nothing is borrowed; an unlimited (unset or -1)
  // nominal never borrows; a nominal of 0 borrows all it holds.
  v1::Queue roomy = q;
  roomy.set_nominal_cpus(4);
  roomy.set_nominal_memory_bytes(int64_t{16} << 30);
  usages["roomy"] = u;
  v1::QueueStatus within = QueueStatusOf(roomy, usages);
  EXPECT_DOUBLE_EQ(within.used_cpus(), 3.5);
  EXPECT_DOUBLE_EQ(within.borrowed_cpus(), 0);
  EXPECT_EQ(within.borrowed_memory_bytes(), 0);
  v1::Queue unlimited = roomy;
  unlimited.set_name("unlimited");
  unlimited.clear_nominal_cpus();
  unlimited.set_nominal_memory_bytes(-1);
  usages["unlimited"] = u;
  v1::QueueStatus free_use = QueueStatusOf(unlimited, usages);
  EXPECT_DOUBLE_EQ(free_use.used_cpus(), 3.5);
  EXPECT_DOUBLE_EQ(free_use.borrowed_cpus(), 0);
  EXPECT_EQ(free_use.used_memory_bytes(), int64_t{12} << 30);
  EXPECT_EQ(free_use.borrowed_memory_bytes(), 0);
  v1::Queue none = roomy;
  none.set_name("none");
  none.set_nominal_cpus(0);
  none.set_nominal_memory_bytes(0);
  usages["none"] = u;
  v1::QueueStatus all_borrowed = QueueStatusOf(none, usages);
  EXPECT_DOUBLE_EQ(all_borrowed.borrowed_cpus(), 3.5);
  EXPECT_EQ(all_borrowed.borrowed_memory_bytes(), int64_t{12} << 30);
  // A nominal of 0.0015 CPUs is 1 thousandth to the scheduler.
  v1::Queue tiny = none;
  tiny.set_name("tiny");
  tiny.set_nominal_cpus(0.0015);
  usages["tiny"] = u;
  EXPECT_DOUBLE_EQ(QueueStatusOf(tiny, usages).borrowed_cpus(), 3.499);
  EXPECT_EQ(Borrowed(5, true, 3), 2);
  EXPECT_EQ(Borrowed(5, false, 3), 0);

  v1::Queue idle;
  idle.set_name("idle");
  idle.set_nominal_cpus(1);
  const v1::QueueStatus nothing = QueueStatusOf(idle, usages);
  EXPECT_DOUBLE_EQ(nothing.used_cpus(), 0);
  EXPECT_EQ(nothing.used_memory_bytes(), 0);
  EXPECT_EQ(nothing.used_gpu_flavors_size(), 0);
}

}  // namespace
}  // namespace trainctl::coordinator
