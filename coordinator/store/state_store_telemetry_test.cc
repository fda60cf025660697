// StateStore telemetry: events, metrics and logs listed in order and paged,
// and their retention (per job, downsampled, across reopen).
#include "coordinator/store/state_store_test_support.h"

namespace trainctl::coordinator {
namespace {

using namespace store_testing;  // NOLINT: the tests' shared helpers

TEST_P(StoreBackendTest, ListEventsAfterSeqAscendingWithLimit) {
  auto store = Fresh();
  ASSERT_NE(store, nullptr);
  v1::Event no_job_id = MakeEvent("", 3);  // filled in from the job
  ASSERT_TRUE(
      store->PutJob(MakeJob("a"), 1, {MakeEvent("a", 2), MakeEvent("a", 1), no_job_id}).ok());
  ASSERT_TRUE(store->PutJob(MakeJob("b"), 2, {MakeEvent("b", 1)}).ok());
  ASSERT_TRUE(store->PutJob(MakeJob("a"), 1, {MakeEvent("a", 4), MakeEvent("a", 5)}).ok());

  auto all = store->ListEvents("a", 0, 100);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(Seqs(*all), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_EQ((*all)[2].job_id(), "a");
  EXPECT_EQ((*all)[0].SerializeAsString(), MakeEvent("a", 1).SerializeAsString());

  auto page = store->ListEvents("a", 2, 2);
  ASSERT_TRUE(page.ok());
  EXPECT_THAT(Seqs(*page), ElementsAre(3, 4));
  auto unlimited = store->ListEvents("a", 3, 0);
  ASSERT_TRUE(unlimited.ok());
  EXPECT_THAT(Seqs(*unlimited), ElementsAre(4, 5));
  auto none = store->ListEvents("missing", 0, 10);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST_P(StoreBackendTest, MetricsNewestFirstLimitOldestFirstOrder) {
  auto store = Fresh();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->AppendMetrics(MakeMetrics("a", 1, 1, 3)).ok());
  ASSERT_TRUE(store->AppendMetrics(MakeMetrics("b", 1, 100, 2)).ok());
  ASSERT_TRUE(store->AppendMetrics(MakeMetrics("a", 2, 4, 3, /*rank=*/1)).ok());
  ASSERT_TRUE(store->AppendMetrics(MakeMetrics("a", 2, 7, 0)).ok());  // empty batch

  auto all = store->ListMetrics("a", 100);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(Steps(*all), ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_EQ((*all)[4].rank(), 1);
  EXPECT_DOUBLE_EQ((*all)[4].loss(), 1.0 / 5);
  auto newest = store->ListMetrics("a", 2);
  ASSERT_TRUE(newest.ok());
  EXPECT_THAT(Steps(*newest), ElementsAre(5, 6));
  auto unlimited = store->ListMetrics("b", 0);
  ASSERT_TRUE(unlimited.ok());
  EXPECT_THAT(Steps(*unlimited), ElementsAre(100, 101));
}

TEST_P(StoreBackendTest, LogsPerRankInOrderWithRankFilterAndTail) {
  auto store = Fresh();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->AppendLogs(MakeLogs("a", 1, 2, {"r2-1", "r2-2"})).ok());
  ASSERT_TRUE(store->AppendLogs(MakeLogs("a", 1, 0, {"r0-1"})).ok());
  ASSERT_TRUE(store->AppendLogs(MakeLogs("a", 1, 2, {"r2-3"})).ok());
  ASSERT_TRUE(store->AppendLogs(MakeLogs("a", 1, 0, {"r0-2", "r0-3"})).ok());
  ASSERT_TRUE(store->AppendLogs(MakeLogs("a", 2, 0, {"second-attempt"})).ok());
  ASSERT_TRUE(store->AppendLogs(MakeLogs("b", 1, 0, {"other-job"})).ok());
  // A line without its rank takes the chunk's.
  v1::LogChunk unranked = MakeLogs("a", 1, 1, {"r1-1"});
  unranked.mutable_lines(0)->clear_rank();
  ASSERT_TRUE(store->AppendLogs(unranked).ok());

  auto all = store->ListLogs("a", 1, std::nullopt, 0);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(Texts(*all),
              ElementsAre("0:r0-1", "0:r0-2", "0:r0-3", "1:r1-1", "2:r2-1", "2:r2-2", "2:r2-3"));
  auto tail = store->ListLogs("a", 1, std::nullopt, 2);
  ASSERT_TRUE(tail.ok());
  EXPECT_THAT(Texts(*tail), ElementsAre("0:r0-2", "0:r0-3", "1:r1-1", "2:r2-2", "2:r2-3"));
  auto rank2 = store->ListLogs("a", 1, 2, 0);
  ASSERT_TRUE(rank2.ok());
  EXPECT_THAT(Texts(*rank2), ElementsAre("2:r2-1", "2:r2-2", "2:r2-3"));
  auto rank2_tail = store->ListLogs("a", 1, 2, 1);
  ASSERT_TRUE(rank2_tail.ok());
  EXPECT_THAT(Texts(*rank2_tail), ElementsAre("2:r2-3"));
  auto attempt2 = store->ListLogs("a", 2, std::nullopt, 0);
  ASSERT_TRUE(attempt2.ok());
  EXPECT_THAT(Texts(*attempt2), ElementsAre("0:second-attempt"));
  auto missing = store->ListLogs("a", 1, 7, 0);
  ASSERT_TRUE(missing.ok());
  EXPECT_TRUE(missing->empty());
}

TEST_P(StoreBackendTest, MetricRetentionKeepsNewestPerJob) {
  StoreOptions options;
  options.max_metric_points_per_job = 10;
  auto store = Fresh(options);
  ASSERT_NE(store, nullptr);
  int64_t step = 1;
  for (int i = 0; i < 7; ++i, step += 3) {
    ASSERT_TRUE(store->AppendMetrics(MakeMetrics("a", 1, step, 3)).ok());
    auto points = store->ListMetrics("a", 0);
    ASSERT_TRUE(points.ok());
    EXPECT_LE(points->size(), 10u);
  }
  ASSERT_TRUE(store->AppendMetrics(MakeMetrics("b", 1, 1, 4)).ok());
  // One batch larger than the bound.
  ASSERT_TRUE(store->AppendMetrics(MakeMetrics("a", 2, step, 15)).ok());
  step += 15;
  auto points = store->ListMetrics("a", 0);
  ASSERT_TRUE(points.ok());
  std::vector<int64_t> expected;
  for (int64_t s = step - 10; s < step; ++s) expected.push_back(s);
  EXPECT_EQ(Steps(*points), expected);
  auto b = store->ListMetrics("b", 0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->size(), 4u);
}

// A long job keeps the shape of its whole curve: over the bound, the oldest
// half is downsampled to min/max/last per bucket (real points, in order),
// eval points are all kept, and nothing is trimmed while downsampling
// suffices.
TEST_P(StoreBackendTest, MetricRetentionDownsamplesOldPointsKeepingMinMaxLast) {
  StoreOptions options;
  options.max_metric_points_per_job = 64;
  auto store = Fresh(options);
  ASSERT_NE(store, nullptr);
  // Steps 1..64 of rank 0; loss spikes at step 3 and dips at step 6.
  v1::MetricBatch batch = MakeMetrics("a", 1, 1, 64);
  batch.mutable_points(2)->set_loss(100);
  batch.mutable_points(5)->set_loss(0.0001);
  v1::MetricPoint* eval = batch.mutable_points(4);
  eval->set_kind(v1::MetricPoint::KIND_EPOCH_END);
  eval->mutable_eval()->set_accuracy(0.5);
  ASSERT_TRUE(store->AppendMetrics(batch).ok());
  EXPECT_EQ(store->ListMetrics("a", 0)->size(), 64u);
  // One more: 65 > 64, so the oldest 32 rows (31 train points + the eval
  // point) are downsampled in buckets of 8 train points.
  ASSERT_TRUE(store->AppendMetrics(MakeMetrics("a", 1, 65, 1)).ok());
  auto points = store->ListMetrics("a", 0);
  ASSERT_TRUE(points.ok());
  std::vector<int64_t> steps = Steps(*points);
  // Bucket 1 (steps 1,2,3,4,6,7,8,9): max 3, min 6, last 9. Bucket 2
  // (10..17): losses fall, so max 10, min and last 17. Bucket 3 (18..25):
  // 18, 25. Steps 26..32 are not a full bucket and stay; the eval point too.
  std::vector<int64_t> expected = {3, 5, 6, 9, 10, 17, 18, 25};
  for (int64_t s = 26; s <= 65; ++s) expected.push_back(s);
  EXPECT_EQ(steps, expected);
  EXPECT_EQ((*points)[1].kind(), v1::MetricPoint::KIND_EPOCH_END);
  // The bound holds however long the job runs, and the first bucket's
  // extremes survive every later round.
  for (int64_t s = 66; s < 2000; s += 10) ASSERT_TRUE(store->AppendMetrics(MakeMetrics("a", 1, s, 10)).ok());
  points = store->ListMetrics("a", 0);
  ASSERT_TRUE(points.ok());
  EXPECT_LE(points->size(), 64u);
  EXPECT_EQ(points->back().step(), 2005);
  double max_loss = 0, min_loss = 1;
  for (const v1::MetricPoint& p : *points) {
    max_loss = std::max(max_loss, p.loss());
    min_loss = std::min(min_loss, p.loss());
  }
  EXPECT_EQ(max_loss, 100);
  EXPECT_EQ(min_loss, 0.0001);
}

TEST_P(StoreBackendTest, ListMetricPageFiltersAndPagesByBytes) {
  auto store = Fresh();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->AppendMetrics(MakeMetrics("a", 1, 1, 10, /*rank=*/0)).ok());
  ASSERT_TRUE(store->AppendMetrics(MakeMetrics("a", 2, 1, 10, /*rank=*/1)).ok());
  v1::MetricBatch eval = MakeMetrics("a", 2, 11, 1, /*rank=*/1);
  eval.mutable_points(0)->set_kind(v1::MetricPoint::KIND_EPOCH_END);
  ASSERT_TRUE(store->AppendMetrics(eval).ok());
  ASSERT_TRUE(store->AppendMetrics(MakeMetrics("b", 1, 1, 5)).ok());

  MetricPageQuery query;
  query.job_id = "a";
  query.rank = 1;
  query.max_bytes = 1;  // one point per page
  std::vector<int64_t> steps;
  for (int pages = 0;; ++pages) {
    ASSERT_LT(pages, 20);
    auto page = store->ListMetricPage(query);
    ASSERT_TRUE(page.ok()) << page.status();
    ASSERT_EQ(page->points.size(), 1u);
    EXPECT_EQ(page->points[0].attempt, 2);
    EXPECT_EQ(page->points[0].point.rank(), 1);
    steps.push_back(page->points[0].point.step());
    query.after_id = page->points[0].id;
    if (!page->more) break;
  }
  EXPECT_THAT(steps, ElementsAre(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));

  query = MetricPageQuery();
  query.job_id = "a";
  query.kind = v1::MetricPoint::KIND_EPOCH_END;
  auto evals = store->ListMetricPage(query);
  ASSERT_TRUE(evals.ok());
  ASSERT_EQ(evals->points.size(), 1u);
  EXPECT_EQ(evals->points[0].point.step(), 11);
  EXPECT_FALSE(evals->more);

  query = MetricPageQuery();
  query.job_id = "a";
  auto all = store->ListMetricPage(query);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->points.size(), 21u);
  EXPECT_FALSE(all->more);
  query.job_id = "none";
  EXPECT_TRUE(store->ListMetricPage(query)->points.empty());
}

TEST_P(StoreBackendTest, LogRetentionPerJobAttemptRank) {
  StoreOptions options;
  options.max_log_lines_per_rank = 3;
  auto store = Fresh(options);
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(store->AppendLogs(MakeLogs("a", 1, 0, {absl::StrCat("a", i)})).ok());
  }
  ASSERT_TRUE(store->AppendLogs(MakeLogs("a", 1, 1, {"x", "y"})).ok());
  ASSERT_TRUE(store->AppendLogs(MakeLogs("a", 2, 0, {"p", "q", "r", "s", "t"})).ok());
  auto attempt1 = store->ListLogs("a", 1, std::nullopt, 0);
  ASSERT_TRUE(attempt1.ok());
  EXPECT_THAT(Texts(*attempt1), ElementsAre("0:a2", "0:a3", "0:a4", "1:x", "1:y"));
  auto attempt2 = store->ListLogs("a", 2, 0, 0);
  ASSERT_TRUE(attempt2.ok());
  EXPECT_THAT(Texts(*attempt2), ElementsAre("0:r", "0:s", "0:t"));
}

TEST_P(StoreBackendTest, EventRetentionKeepsLastSeq) {
  StoreOptions options;
  options.max_events_per_job = 4;
  auto store = Fresh(options);
  ASSERT_NE(store, nullptr);
  int64_t seq = 1;
  for (int i = 0; i < 4; ++i) {
    std::vector<v1::Event> events;
    for (int j = 0; j < 3; ++j) events.push_back(MakeEvent("a", seq++));
    ASSERT_TRUE(store->PutJob(MakeJob("a"), 1, events).ok());
  }
  ASSERT_TRUE(store->PutJob(MakeJob("b"), 2, {MakeEvent("b", 1)}).ok());
  auto events = store->ListEvents("a", 0, 0);
  ASSERT_TRUE(events.ok());
  EXPECT_THAT(Seqs(*events), ElementsAre(9, 10, 11, 12));
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_THAT(snapshot->last_event_seqs, ElementsAre(12, 1));
}

TEST_P(StoreBackendTest, RetentionHoldsAcrossReopen) {
  StoreOptions options;
  options.max_metric_points_per_job = 5;
  options.max_log_lines_per_rank = 5;
  options.max_events_per_job = 5;
  {
    auto store = Reopen(options);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->AppendMetrics(MakeMetrics("a", 1, 1, 4)).ok());
    ASSERT_TRUE(store->AppendLogs(MakeLogs("a", 1, 0, {"1", "2", "3", "4"})).ok());
    ASSERT_TRUE(store->PutJob(MakeJob("a"), 1,
                              {MakeEvent("a", 1), MakeEvent("a", 2), MakeEvent("a", 3),
                               MakeEvent("a", 4)})
                    .ok());
  }
  // A new process starts with no cached counts: they come from the file.
  auto store = Reopen(options);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->AppendMetrics(MakeMetrics("a", 1, 5, 3)).ok());
  ASSERT_TRUE(store->AppendLogs(MakeLogs("a", 1, 0, {"5", "6", "7"})).ok());
  ASSERT_TRUE(store->PutJob(MakeJob("a"), 1, {MakeEvent("a", 5), MakeEvent("a", 6)}).ok());
  auto metrics = store->ListMetrics("a", 0);
  ASSERT_TRUE(metrics.ok());
  EXPECT_THAT(Steps(*metrics), ElementsAre(3, 4, 5, 6, 7));
  auto logs = store->ListLogs("a", 1, 0, 0);
  ASSERT_TRUE(logs.ok());
  EXPECT_THAT(Texts(*logs), ElementsAre("0:3", "0:4", "0:5", "0:6", "0:7"));
  auto events = store->ListEvents("a", 0, 0);
  ASSERT_TRUE(events.ok());
  EXPECT_THAT(Seqs(*events), ElementsAre(2, 3, 4, 5, 6));
}

TRAINCTL_STORE_BACKENDS(StoreBackendTest);

}  // namespace
}  // namespace trainctl::coordinator
