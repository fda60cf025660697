// JobQueries over the owners wired as the coordinator wires them
// (job_manager_fixture.h, JobOwners): a job's stored events, log lines and
// metric points,
// read as the services and the dashboard read them, and the busy slots,
// usage and queue use they show.
#include "coordinator/jobs/job_manager_fixture.h"

namespace trainctl::coordinator {
namespace {

v1::LogChunk Lines(const std::string& job, int attempt, int rank, std::vector<std::string> texts,
                   v1::LogLine::Stream stream = v1::LogLine::STREAM_STDOUT) {
  v1::LogChunk c;
  c.set_job_id(job);
  c.set_attempt(attempt);
  c.set_rank(rank);
  for (std::string& t : texts) {
    v1::LogLine* l = c.add_lines();
    l->set_rank(rank);
    l->set_stream(stream);
    l->set_text(std::move(t));
  }
  return c;
}

std::vector<std::string> Texts(const std::vector<v1::LogLine>& lines) {
  std::vector<std::string> out;
  for (const v1::LogLine& l : lines) out.push_back(absl::StrCat(l.rank(), ":", l.text()));
  return out;
}

TEST_F(JobManagerTest, EventsAreTheStoredEventsAfterASeqAndUpToALimit) {
  const std::string id = RunningJob();
  ASSERT_TRUE(jobs_->Cancel(id, "done here").ok());
  absl::StatusOr<std::vector<v1::Event>> all = owners_->queries.Events(id, 0, 0);
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<std::string> read;
  for (const v1::Event& e : *all)
    read.push_back(absl::StrCat(e.type(), "@", e.attempt(), ": ", e.message()));
  EXPECT_EQ(read, StoredEvents(id));
  ASSERT_GE(all->size(), 3u);
  EXPECT_EQ(all->back().type(), "cancelled");
  for (size_t i = 1; i < all->size(); ++i) EXPECT_LT((*all)[i - 1].seq(), (*all)[i].seq());

  // After the first event's seq: every other one; a limit keeps the first.
  absl::StatusOr<std::vector<v1::Event>> after = owners_->queries.Events(id, (*all)[0].seq(), 0);
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(after->size(), all->size() - 1);
  EXPECT_EQ((*after)[0].seq(), (*all)[1].seq());
  absl::StatusOr<std::vector<v1::Event>> two = owners_->queries.Events(id, 0, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->size(), 2u);
  EXPECT_EQ((*two)[1].seq(), (*all)[1].seq());

  absl::StatusOr<std::vector<v1::Event>> none = owners_->queries.Events("no-such-job", 0, 0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

TEST_F(JobManagerTest, LogsAreTheLinesTheRanksSentByAttemptRankAndTail) {
  const std::string id = RunningJob();
  ASSERT_TRUE(owners_->ingest.OnLogs("a", Lines(id, 1, 0, {"r0 one", "r0 two", "r0 three"})).ok());
  ASSERT_TRUE(
      owners_->ingest.OnLogs("b", Lines(id, 1, 1, {"r1 one"}, v1::LogLine::STREAM_STDERR)).ok());

  absl::StatusOr<std::vector<v1::LogLine>> every = owners_->queries.Logs(id, 1, std::nullopt, 0);
  ASSERT_TRUE(every.ok()) << every.status();
  EXPECT_THAT(Texts(*every), ElementsAre("0:r0 one", "0:r0 two", "0:r0 three", "1:r1 one"));
  EXPECT_EQ(every->back().stream(), v1::LogLine::STREAM_STDERR);

  absl::StatusOr<std::vector<v1::LogLine>> rank0_tail = owners_->queries.Logs(id, 1, 0, 2);
  ASSERT_TRUE(rank0_tail.ok()) << rank0_tail.status();
  EXPECT_THAT(Texts(*rank0_tail), ElementsAre("0:r0 two", "0:r0 three"));

  // Attempt numbers are taken literally: no attempt 2 yet, and 0 is none.
  for (int32_t attempt : {0, 2}) {
    absl::StatusOr<std::vector<v1::LogLine>> other =
        owners_->queries.Logs(id, attempt, std::nullopt, 0);
    ASSERT_TRUE(other.ok()) << other.status();
    EXPECT_TRUE(other->empty()) << attempt;
  }
}

TEST_F(JobManagerTest, MetricsAreThePointsTheRanksSentInPagesByRankAndKind) {
  const std::string id = RunningJob();  // rank 0 on worker a, rank 1 on b
  for (const auto& [worker, rank] : {std::pair<std::string, int>{"a", 0}, {"b", 1}}) {
    v1::MetricBatch batch;
    batch.set_job_id(id);
    batch.set_attempt(1);
    for (int step = 1; step <= 3; ++step) {
      v1::MetricPoint* p = batch.add_points();
      p->set_kind(v1::MetricPoint::KIND_TRAIN);
      p->set_rank(rank);
      p->set_step(step);
      p->set_loss(1.0 / step);
    }
    if (rank == 0) {
      v1::MetricPoint* end = batch.add_points();
      end->set_kind(v1::MetricPoint::KIND_EPOCH_END);
      end->set_rank(0);
      end->set_step(3);
    }
    const absl::Status ingested = owners_->ingest.OnMetrics(worker, batch);
    ASSERT_TRUE(ingested.ok()) << ingested;
  }

  absl::StatusOr<std::vector<v1::MetricPoint>> all = owners_->queries.Metrics(id, 100);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 7u);
  EXPECT_EQ((*all)[3].kind(), v1::MetricPoint::KIND_EPOCH_END) << "arrival order";
  absl::StatusOr<std::vector<v1::MetricPoint>> two = owners_->queries.Metrics(id, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->size(), 2u);

  // Rank 1's train points, one page after another: every point once.
  MetricPageQuery q;
  q.job_id = id;
  q.rank = 1;
  q.kind = v1::MetricPoint::KIND_TRAIN;
  absl::StatusOr<MetricPage> page = owners_->queries.MetricsPage(q);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->points.size(), 3u);
  EXPECT_FALSE(page->more);
  for (const StoredMetricPoint& p : page->points) {
    EXPECT_EQ(p.point.rank(), 1);
    EXPECT_EQ(p.point.kind(), v1::MetricPoint::KIND_TRAIN);
    EXPECT_EQ(p.attempt, 1);
  }
  q.after_id = page->points.back().id;
  page = owners_->queries.MetricsPage(q);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_TRUE(page->points.empty());

  absl::StatusOr<std::vector<v1::MetricPoint>> none = owners_->queries.Metrics("no-such-job", 100);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

TEST_F(JobManagerTest, BusySlotsAreTheSlotsOfRanksNotEnded) {
  const std::string id = RunningJob();
  EXPECT_THAT(owners_->queries.BusySlots("a"), ElementsAre(0));
  EXPECT_THAT(owners_->queries.BusySlots("b"), ElementsAre(0));
  EXPECT_TRUE(owners_->queries.BusySlots("nobody").empty());
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_SUCCEEDED).ok());
  EXPECT_TRUE(owners_->queries.BusySlots("a").empty());
  EXPECT_THAT(owners_->queries.BusySlots("b"), ElementsAre(0));
}

TEST_F(JobManagerTest, UsageReadsTheStoredAttemptsOfTheWindow) {
  const std::string id = RunningJob();
  clock_.Advance(absl::Seconds(10));
  ASSERT_TRUE(jobs_->Cancel(id, "").ok());
  clock_.Advance(absl::Seconds(5));
  UsageFilter filter;
  filter.by = v1::USAGE_GROUPING_ATTEMPT;
  absl::StatusOr<UsageReport> report = owners_->queries.Usage(filter);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->attempts.size(), 1u);
  EXPECT_EQ(report->attempts[0].job_id(), id);
  // A window that ends in the future is refused, naming `until`.
  filter.until = clock_.Now() + absl::Hours(1);
  absl::StatusOr<UsageReport> future = owners_->queries.Usage(filter);
  EXPECT_EQ(future.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(future.status().message()), HasSubstr("until"));
}

// Issue #48: what a queue's live ranks hold in every quota dimension, as
// the scheduler counts it (CPUs rounded up per rank to a thousandth, memory
// in bytes, GPU slots by their flavor); an ended rank holds nothing.
TEST_F(JobManagerTest, QueueUsagesCountCpusMemoryAndFlavorsOfLiveRanks) {
  v1::Register reg = CpuWorker("h", 2);
  for (v1::Slot& s : *reg.mutable_slots()) {
    s.set_kind(v1::Slot::KIND_GPU);
    s.set_name("NVIDIA H100 80GB HBM3");
    s.set_flavor("h100");
  }
  reg.mutable_allocatable()->set_cpus(8);
  reg.mutable_allocatable()->set_memory_bytes(int64_t{64} << 30);
  reg.mutable_allocatable()->set_enforces_limits(true);
  RegisterWorker(reg);
  v1::JobSpec spec = Spec(2);
  spec.set_device(v1::DEVICE_CUDA);
  spec.mutable_resources()->set_cpus(1.0004);  // 1.001 per rank to the scheduler
  spec.mutable_resources()->set_memory(int64_t{3} << 30);
  auto job = jobs_->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->id();
  ASSERT_EQ(Get(id).state(), v1::JOB_STATE_SCHEDULED) << Get(id).state_reason();

  std::map<std::string, QueueUsage> usages = owners_->queries.QueueUsages();
  ASSERT_EQ(usages.count("default"), 1u);
  EXPECT_EQ(usages["default"].running_jobs, 1);
  EXPECT_EQ(usages["default"].used_gpu, 2);
  EXPECT_EQ(usages["default"].used_cpu, 0);
  EXPECT_EQ(usages["default"].used_milli_cpus, 2002);
  EXPECT_EQ(usages["default"].used_memory_bytes, int64_t{6} << 30);
  EXPECT_THAT(usages["default"].used_gpu_flavors, ElementsAre(::testing::Pair("h100", 2)));

  ASSERT_TRUE(Rendezvous("h", id, 1).ok());
  ASSERT_TRUE(Status("h", id, 1, 0, v1::RANK_STATE_RUNNING).ok());
  ASSERT_TRUE(Status("h", id, 1, 1, v1::RANK_STATE_RUNNING).ok());
  ASSERT_TRUE(Status("h", id, 1, 1, v1::RANK_STATE_SUCCEEDED).ok());
  usages = owners_->queries.QueueUsages();
  EXPECT_EQ(usages["default"].used_gpu, 1);
  EXPECT_EQ(usages["default"].used_milli_cpus, 1001);
  EXPECT_EQ(usages["default"].used_memory_bytes, int64_t{3} << 30);
  EXPECT_THAT(usages["default"].used_gpu_flavors, ElementsAre(::testing::Pair("h100", 1)));
  ASSERT_TRUE(Status("h", id, 1, 0, v1::RANK_STATE_SUCCEEDED).ok());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(owners_->queries.QueueUsages().count("default"), 0u) << "an ended job holds nothing";
}

}  // namespace
}  // namespace trainctl::coordinator
