// StateStore telemetry: events, metrics and logs listed in order and paged,
// and their retention (per job, downsampled, across reopen).
#include "coordinator/store/state_store_test_support.h"

#include <algorithm>
#include <optional>
#include <thread>

#include "absl/strings/match.h"

namespace trainctl::coordinator {
namespace {

using namespace store_testing;  // NOLINT: the tests' shared helpers

TEST_P(StoreBackendTest, ListEventsAfterSeqAscendingWithLimit) {
  auto store = Fresh();
  ASSERT_NE(store, nullptr);
  v1::Event no_job_id = MakeEvent("", 3);  // filled in from the job
  ASSERT_TRUE(store->jobs()
                  .PutJob(MakeJob("a"), 1, {MakeEvent("a", 2), MakeEvent("a", 1), no_job_id})
                  .ok());
  ASSERT_TRUE(store->jobs().PutJob(MakeJob("b"), 2, {MakeEvent("b", 1)}).ok());
  ASSERT_TRUE(store->jobs().PutJob(MakeJob("a"), 1, {MakeEvent("a", 4), MakeEvent("a", 5)}).ok());

  auto all = store->jobs().ListEvents("a", 0, 100);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(Seqs(*all), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_EQ((*all)[2].job_id(), "a");
  EXPECT_EQ((*all)[0].SerializeAsString(), MakeEvent("a", 1).SerializeAsString());

  auto page = store->jobs().ListEvents("a", 2, 2);
  ASSERT_TRUE(page.ok());
  EXPECT_THAT(Seqs(*page), ElementsAre(3, 4));
  auto unlimited = store->jobs().ListEvents("a", 3, 0);
  ASSERT_TRUE(unlimited.ok());
  EXPECT_THAT(Seqs(*unlimited), ElementsAre(4, 5));
  auto none = store->jobs().ListEvents("missing", 0, 10);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST_P(StoreBackendTest, MetricsNewestFirstLimitOldestFirstOrder) {
  auto store = Fresh();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("a", 1, 1, 3)).ok());
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("b", 1, 100, 2)).ok());
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("a", 2, 4, 3, /*rank=*/1)).ok());
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("a", 2, 7, 0)).ok());  // empty batch

  auto all = store->telemetry().ListMetrics("a", 100);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(Steps(*all), ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_EQ((*all)[4].rank(), 1);
  EXPECT_DOUBLE_EQ((*all)[4].loss(), 1.0 / 5);
  auto newest = store->telemetry().ListMetrics("a", 2);
  ASSERT_TRUE(newest.ok());
  EXPECT_THAT(Steps(*newest), ElementsAre(5, 6));
  auto unlimited = store->telemetry().ListMetrics("b", 0);
  ASSERT_TRUE(unlimited.ok());
  EXPECT_THAT(Steps(*unlimited), ElementsAre(100, 101));
}

TEST_P(StoreBackendTest, LogsPerRankInOrderWithRankFilterAndTail) {
  auto store = Fresh();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("a", 1, 2, {"r2-1", "r2-2"})).ok());
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("a", 1, 0, {"r0-1"})).ok());
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("a", 1, 2, {"r2-3"})).ok());
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("a", 1, 0, {"r0-2", "r0-3"})).ok());
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("a", 2, 0, {"second-attempt"})).ok());
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("b", 1, 0, {"other-job"})).ok());
  // A line without its rank takes the chunk's.
  v1::LogChunk unranked = MakeLogs("a", 1, 1, {"r1-1"});
  unranked.mutable_lines(0)->clear_rank();
  ASSERT_TRUE(store->telemetry().AppendLogs(unranked).ok());

  auto all = store->telemetry().ListLogs("a", 1, std::nullopt, 0);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(Texts(*all),
              ElementsAre("0:r0-1", "0:r0-2", "0:r0-3", "1:r1-1", "2:r2-1", "2:r2-2", "2:r2-3"));
  auto tail = store->telemetry().ListLogs("a", 1, std::nullopt, 2);
  ASSERT_TRUE(tail.ok());
  EXPECT_THAT(Texts(*tail), ElementsAre("0:r0-2", "0:r0-3", "1:r1-1", "2:r2-2", "2:r2-3"));
  auto rank2 = store->telemetry().ListLogs("a", 1, 2, 0);
  ASSERT_TRUE(rank2.ok());
  EXPECT_THAT(Texts(*rank2), ElementsAre("2:r2-1", "2:r2-2", "2:r2-3"));
  auto rank2_tail = store->telemetry().ListLogs("a", 1, 2, 1);
  ASSERT_TRUE(rank2_tail.ok());
  EXPECT_THAT(Texts(*rank2_tail), ElementsAre("2:r2-3"));
  auto attempt2 = store->telemetry().ListLogs("a", 2, std::nullopt, 0);
  ASSERT_TRUE(attempt2.ok());
  EXPECT_THAT(Texts(*attempt2), ElementsAre("0:second-attempt"));
  auto missing = store->telemetry().ListLogs("a", 1, 7, 0);
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
    ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("a", 1, step, 3)).ok());
    auto points = store->telemetry().ListMetrics("a", 0);
    ASSERT_TRUE(points.ok());
    EXPECT_LE(points->size(), 10u);
  }
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("b", 1, 1, 4)).ok());
  // One batch larger than the bound.
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("a", 2, step, 15)).ok());
  step += 15;
  auto points = store->telemetry().ListMetrics("a", 0);
  ASSERT_TRUE(points.ok());
  std::vector<int64_t> expected;
  for (int64_t s = step - 10; s < step; ++s) expected.push_back(s);
  EXPECT_EQ(Steps(*points), expected);
  auto b = store->telemetry().ListMetrics("b", 0);
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
  ASSERT_TRUE(store->telemetry().AppendMetrics(batch).ok());
  EXPECT_EQ(store->telemetry().ListMetrics("a", 0)->size(), 64u);
  // One more: 65 > 64, so the oldest 32 rows (31 train points + the eval
  // point) are downsampled in buckets of 8 train points.
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("a", 1, 65, 1)).ok());
  auto points = store->telemetry().ListMetrics("a", 0);
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
  for (int64_t s = 66; s < 2000; s += 10)
    ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("a", 1, s, 10)).ok());
  points = store->telemetry().ListMetrics("a", 0);
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
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("a", 1, 1, 10, /*rank=*/0)).ok());
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("a", 2, 1, 10, /*rank=*/1)).ok());
  v1::MetricBatch eval = MakeMetrics("a", 2, 11, 1, /*rank=*/1);
  eval.mutable_points(0)->set_kind(v1::MetricPoint::KIND_EPOCH_END);
  ASSERT_TRUE(store->telemetry().AppendMetrics(eval).ok());
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("b", 1, 1, 5)).ok());

  MetricPageQuery query;
  query.job_id = "a";
  query.rank = 1;
  query.max_bytes = 1;  // one point per page
  std::vector<int64_t> steps;
  for (int pages = 0;; ++pages) {
    ASSERT_LT(pages, 20);
    auto page = store->telemetry().ListMetricPage(query);
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
  auto evals = store->telemetry().ListMetricPage(query);
  ASSERT_TRUE(evals.ok());
  ASSERT_EQ(evals->points.size(), 1u);
  EXPECT_EQ(evals->points[0].point.step(), 11);
  EXPECT_FALSE(evals->more);

  query = MetricPageQuery();
  query.job_id = "a";
  auto all = store->telemetry().ListMetricPage(query);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->points.size(), 21u);
  EXPECT_FALSE(all->more);
  query.job_id = "none";
  EXPECT_TRUE(store->telemetry().ListMetricPage(query)->points.empty());
}

TEST_P(StoreBackendTest, LogRetentionPerJobAttemptRank) {
  StoreOptions options;
  options.max_log_lines_per_rank = 3;
  auto store = Fresh(options);
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("a", 1, 0, {absl::StrCat("a", i)})).ok());
  }
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("a", 1, 1, {"x", "y"})).ok());
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("a", 2, 0, {"p", "q", "r", "s", "t"})).ok());
  auto attempt1 = store->telemetry().ListLogs("a", 1, std::nullopt, 0);
  ASSERT_TRUE(attempt1.ok());
  EXPECT_THAT(Texts(*attempt1), ElementsAre("0:a2", "0:a3", "0:a4", "1:x", "1:y"));
  auto attempt2 = store->telemetry().ListLogs("a", 2, 0, 0);
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
    ASSERT_TRUE(store->jobs().PutJob(MakeJob("a"), 1, events).ok());
  }
  ASSERT_TRUE(store->jobs().PutJob(MakeJob("b"), 2, {MakeEvent("b", 1)}).ok());
  auto events = store->jobs().ListEvents("a", 0, 0);
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
    ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("a", 1, 1, 4)).ok());
    ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("a", 1, 0, {"1", "2", "3", "4"})).ok());
    ASSERT_TRUE(
        store->jobs()
            .PutJob(MakeJob("a"), 1,
                    {MakeEvent("a", 1), MakeEvent("a", 2), MakeEvent("a", 3), MakeEvent("a", 4)})
            .ok());
  }
  // A new process starts with no cached counts: they come from the file.
  auto store = Reopen(options);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("a", 1, 5, 3)).ok());
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("a", 1, 0, {"5", "6", "7"})).ok());
  ASSERT_TRUE(store->jobs().PutJob(MakeJob("a"), 1, {MakeEvent("a", 5), MakeEvent("a", 6)}).ok());
  auto metrics = store->telemetry().ListMetrics("a", 0);
  ASSERT_TRUE(metrics.ok());
  EXPECT_THAT(Steps(*metrics), ElementsAre(3, 4, 5, 6, 7));
  auto logs = store->telemetry().ListLogs("a", 1, 0, 0);
  ASSERT_TRUE(logs.ok());
  EXPECT_THAT(Texts(*logs), ElementsAre("0:3", "0:4", "0:5", "0:6", "0:7"));
  auto events = store->jobs().ListEvents("a", 0, 0);
  ASSERT_TRUE(events.ok());
  EXPECT_THAT(Seqs(*events), ElementsAre(2, 3, 4, 5, 6));
}

// --- telemetry inside a group (queued, written in multi-row chunks) ---------

// What a group of telemetry messages sends: metric batches and log chunks
// over several jobs and ranks, of sizes that cross every chunk size.
struct TelemetryMessage {
  std::optional<v1::MetricBatch> metrics;
  std::optional<v1::LogChunk> logs;
};
std::vector<TelemetryMessage> ManyMessages(int count) {
  std::vector<TelemetryMessage> out;
  int64_t step = 1;
  for (int m = 0; m < count; ++m) {
    const std::string job = absl::StrCat("job-", m % 3);
    const int32_t rank = (m / 3) % 4;
    const int n = 1 + (m * 37) % 140;  // 1..140 rows: every chunk size, and more than one 64
    if (m % 2 == 0) {
      out.push_back({MakeMetrics(job, 1 + m % 2, step, n, rank), std::nullopt});
      step += n;
    } else {
      std::vector<std::string> texts;
      for (int i = 0; i < n; ++i) texts.push_back(absl::StrCat("m", m, "-", i));
      out.push_back({std::nullopt, MakeLogs(job, 1, rank, texts)});
    }
  }
  return out;
}
absl::Status Send(StateStore& store, const TelemetryMessage& msg) {
  return msg.metrics.has_value() ? store.telemetry().AppendMetrics(*msg.metrics)
                                 : store.telemetry().AppendLogs(*msg.logs);
}
// Every job's stored points (as "job/rank/step", in id order across jobs)
// and every attempt 1 log line per job: the whole telemetry state.
std::vector<std::string> Stored(StateStore& store) {
  std::vector<std::pair<int64_t, std::string>> points;
  std::vector<std::string> out;
  for (int j = 0; j < 3; ++j) {
    const std::string job = absl::StrCat("job-", j);
    MetricPageQuery query;
    query.job_id = job;
    auto page = store.telemetry().ListMetricPage(query);
    EXPECT_TRUE(page.ok()) << page.status();
    if (!page.ok()) return out;
    for (const StoredMetricPoint& p : page->points) {
      points.emplace_back(p.id, absl::StrCat(job, "/", p.point.rank(), "/", p.point.step()));
    }
    auto lines = store.telemetry().ListLogs(job, 1, std::nullopt, 0);
    EXPECT_TRUE(lines.ok()) << lines.status();
    if (!lines.ok()) return out;
    for (const std::string& text : Texts(*lines)) out.push_back(absl::StrCat(job, "/", text));
  }
  std::sort(points.begin(), points.end());
  for (auto& [id, text] : points) out.push_back(std::move(text));
  return out;
}

TEST_P(StoreBackendTest, GroupStoresEveryRowOnceInTheOrderSent) {
  const std::vector<TelemetryMessage> messages = ManyMessages(60);
  {
    auto store = Reopen();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->BeginGroup().ok());
    for (const TelemetryMessage& msg : messages) ASSERT_TRUE(Send(*store, msg).ok());
    ASSERT_TRUE(store->CommitGroup({{"w1", 4}, {"w2", 9}, {"w1", 6}}).ok());
  }
  // The same messages one transaction each, on SQLite: the reference.
  auto direct = OpenSpecOrDie("sqlite::memory:", {});
  ASSERT_NE(direct, nullptr);
  for (const TelemetryMessage& msg : messages) ASSERT_TRUE(Send(*direct, msg).ok());
  const std::vector<std::string> expected = Stored(*direct);

  auto store = Reopen();  // what was committed, not what a cache remembers
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> stored = Stored(*store);
  EXPECT_EQ(stored.size(), expected.size());
  EXPECT_TRUE(stored == expected) << "the group stored other rows, or in another order";
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_THAT(snapshot->telemetry_seqs, ElementsAre(std::pair<std::string, int64_t>("w1", 6),
                                                    std::pair<std::string, int64_t>("w2", 9)));
}

// A group keeps the bounds as the same appends one by one do: logs trimmed
// per (job, attempt, rank), metrics downsampled when the group crosses the
// job's bound, and the cached counts right for what follows the commit.
TEST_P(StoreBackendTest, RetentionHoldsWhenOneGroupCrossesTheBound) {
  StoreOptions options;
  options.max_metric_points_per_job = 40;
  options.max_log_lines_per_rank = 25;
  const std::vector<TelemetryMessage> messages = ManyMessages(30);
  auto store = Fresh(options);
  ASSERT_NE(store, nullptr);
  auto direct = OpenSpecOrDie("sqlite::memory:", options);
  ASSERT_NE(direct, nullptr);
  ASSERT_TRUE(store->BeginGroup().ok());
  for (const TelemetryMessage& msg : messages) {
    ASSERT_TRUE(Send(*store, msg).ok());
    ASSERT_TRUE(Send(*direct, msg).ok());
  }
  ASSERT_TRUE(store->CommitGroup("w", 1).ok());
  const std::vector<std::string> expected = Stored(*direct);
  EXPECT_TRUE(Stored(*store) == expected);
  for (int j = 0; j < 3; ++j) {
    EXPECT_LE(store->telemetry().ListMetrics(absl::StrCat("job-", j), 0)->size(), 40u);
    for (int r = 0; r < 4; ++r)
      EXPECT_LE(store->telemetry().ListLogs(absl::StrCat("job-", j), 1, r, 0)->size(), 25u);
  }
  // After the commit, appends outside a group count from the right place.
  for (const TelemetryMessage& msg : ManyMessages(7)) {
    ASSERT_TRUE(Send(*store, msg).ok());
    ASSERT_TRUE(Send(*direct, msg).ok());
  }
  EXPECT_TRUE(Stored(*store) == Stored(*direct));
}

// A write the fault fails inside a group undoes only itself (as its
// savepoint did); a group rolled back keeps nothing, not its seqs either.
TEST_P(StoreBackendTest, AFailedAppendInAGroupUndoesOnlyItselfAndARollbackEverything) {
  StoreOptions options;
  options.max_log_lines_per_rank = 4;
  auto store = Reopen(options);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("j", 1, 0, {"a", "b"})).ok());

  ASSERT_TRUE(store->BeginGroup().ok());
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("j", 1, 0, {"c"})).ok());
  store->SetWriteFaultForTest(
      [](int64_t, absl::string_view op) { return absl::StrContains(op, "AppendLogs"); });
  absl::Status failed = store->telemetry().AppendLogs(MakeLogs("j", 1, 0, {"x", "y", "z"}));
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("AppendLogs('j', attempt 1, rank 0)"));
  store->SetWriteFaultForTest(nullptr);
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("j", 1, 0, {"d", "e"})).ok());
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("j", 1, 1, 3)).ok());
  ASSERT_TRUE(store->CommitGroup("w", 2).ok());
  EXPECT_THAT(Texts(*store->telemetry().ListLogs("j", 1, 0, 0)),
              ElementsAre("0:b", "0:c", "0:d", "0:e"));

  ASSERT_TRUE(store->BeginGroup().ok());
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("j", 1, 0, {"f", "g", "h", "i", "k"})).ok());
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("j", 1, 4, 70)).ok());
  store->RollbackGroup();
  EXPECT_THAT(Texts(*store->telemetry().ListLogs("j", 1, 0, 0)),
              ElementsAre("0:b", "0:c", "0:d", "0:e"));
  EXPECT_THAT(Steps(*store->telemetry().ListMetrics("j", 0)), ElementsAre(1, 2, 3));
  // The bound still counts right after the rollback.
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("j", 1, 0, {"l"})).ok());
  EXPECT_THAT(Texts(*store->telemetry().ListLogs("j", 1, 0, 0)),
              ElementsAre("0:c", "0:d", "0:e", "0:l"));
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_THAT(snapshot->telemetry_seqs, ElementsAre(std::pair<std::string, int64_t>("w", 2)));
}

// --- a whole group in one call (AppendGroup: the batcher's writer thread) ---

std::vector<v1::WorkerMessage> AsWorkerMessages(const std::vector<TelemetryMessage>& messages) {
  std::vector<v1::WorkerMessage> out;
  for (const TelemetryMessage& msg : messages) {
    v1::WorkerMessage& m = out.emplace_back();
    m.set_seq(static_cast<int64_t>(out.size()));
    if (msg.metrics.has_value()) *m.mutable_metrics() = *msg.metrics;
    if (msg.logs.has_value()) *m.mutable_logs() = *msg.logs;
  }
  return out;
}
std::vector<const v1::WorkerMessage*> Pointers(const std::vector<v1::WorkerMessage>& msgs) {
  std::vector<const v1::WorkerMessage*> out;
  for (const v1::WorkerMessage& m : msgs) out.push_back(&m);
  return out;
}

TEST_P(StoreBackendTest, AppendGroupStoresWhatAGroupStores) {
  const std::vector<TelemetryMessage> messages = ManyMessages(60);
  const std::vector<v1::WorkerMessage> msgs = AsWorkerMessages(messages);
  {
    auto store = Reopen();
    ASSERT_NE(store, nullptr);
    absl::Status written =
        store->telemetry().AppendGroup(Pointers(msgs), {{"w1", 4}, {"w2", 9}, {"w1", 6}});
    ASSERT_TRUE(written.ok()) << written;
  }
  auto direct = OpenSpecOrDie("sqlite::memory:", {});
  ASSERT_NE(direct, nullptr);
  for (const TelemetryMessage& msg : messages) ASSERT_TRUE(Send(*direct, msg).ok());

  auto store = Reopen();  // what was committed
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(Stored(*store) == Stored(*direct)) << "other rows, or in another order";
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_THAT(snapshot->telemetry_seqs, ElementsAre(std::pair<std::string, int64_t>("w1", 6),
                                                    std::pair<std::string, int64_t>("w2", 9)));
}

// A group the loop opened (BeginGroup) spans calls: AppendGroup from
// another thread waits for its end instead of writing inside it, so what
// it writes survives that group's rollback.
TEST_P(StoreBackendTest, AppendGroupFromAnotherThreadWaitsForAnOpenGroup) {
  auto store = Fresh();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->BeginGroup().ok());
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("j", 1, 0, {"rolled back"})).ok());
  v1::WorkerMessage m;
  *m.mutable_logs() = MakeLogs("j", 1, 0, {"writer"});
  m.set_seq(3);
  absl::Status written = absl::UnknownError("not run");
  std::thread writer([&] { written = store->telemetry().AppendGroup({&m}, {{"w", 3}}); });
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("j", 1, 0, {"also rolled back"})).ok());
  store->RollbackGroup();
  writer.join();
  EXPECT_TRUE(written.ok()) << written;
  EXPECT_THAT(Texts(*store->telemetry().ListLogs("j", 1, 0, 0)), ElementsAre("0:writer"));
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_THAT(snapshot->telemetry_seqs, ElementsAre(std::pair<std::string, int64_t>("w", 3)));
}

// A store failure -- at the commit, or in an append -- keeps nothing of the
// group, rows or seqs; the next group stores.
TEST_P(StoreBackendTest, AFailedAppendGroupKeepsNothing) {
  auto store = Reopen();
  ASSERT_NE(store, nullptr);
  std::vector<v1::WorkerMessage> msgs = AsWorkerMessages(
      {{std::nullopt, MakeLogs("j", 1, 0, {"a", "b"})}, {MakeMetrics("j", 1, 1, 3), std::nullopt}});
  for (const char* fails : {"CommitGroup", "AppendMetrics"}) {
    store->SetWriteFaultForTest(
        [fails](int64_t, absl::string_view op) { return absl::StartsWith(op, fails); });
    absl::Status failed = store->telemetry().AppendGroup(Pointers(msgs), {{"w", 2}});
    EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << fails << ": " << failed;
  }
  store->SetWriteFaultForTest(nullptr);
  EXPECT_TRUE(store->telemetry().ListLogs("j", 1, 0, 0)->empty());
  EXPECT_TRUE(store->telemetry().ListMetrics("j", 0)->empty());
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_TRUE(snapshot->telemetry_seqs.empty());

  msgs[0].mutable_logs()->mutable_lines(1)->set_text("c");
  ASSERT_TRUE(store->telemetry().AppendGroup(Pointers(msgs), {{"w", 2}}).ok());
  EXPECT_THAT(Texts(*store->telemetry().ListLogs("j", 1, 0, 0)), ElementsAre("0:a", "0:c"));
  EXPECT_THAT(Steps(*store->telemetry().ListMetrics("j", 0)), ElementsAre(1, 2, 3));
  snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_THAT(snapshot->telemetry_seqs, ElementsAre(std::pair<std::string, int64_t>("w", 2)));
}

TRAINCTL_STORE_BACKENDS(StoreBackendTest);

// The PostgreSQL server and database of StoreBackendTest only.
class PostgresTelemetryTest : public StoreBackendTest {};
INSTANTIATE_TEST_SUITE_P(Backends, PostgresTelemetryTest, ::testing::Values(Backend::kPostgres),
                         BackendName);

// The queued rows reach the server only at the commit: a connection lost
// by then fails the commit, and nothing of the group -- rows, trims, seqs --
// is kept; the next group reconnects and stores.
TEST_P(PostgresTelemetryTest, AConnectionLostBeforeTheCommitKeepsNothingOfTheGroup) {
  PgTestServer& pg = PgServer();
  StoreOptions options;
  options.max_log_lines_per_rank = 3;
  auto store = Reopen(options);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("j", 1, 0, {"a", "b"})).ok());
  ASSERT_TRUE(store->BeginGroup().ok());
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("j", 1, 0, {"c", "d"})).ok());
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("j", 1, 1, 100)).ok());
  ASSERT_TRUE(pg.AdminExec("postgres",
                           absl::StrCat("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                        "WHERE datname = '",
                                        pg.last_database(), "'"))
                  .ok());
  absl::Status lost = store->CommitGroup("w", 5);
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable) << lost;
  EXPECT_THAT(lost.message(), HasSubstr("CommitGroup('w', seq 5)"));

  ASSERT_TRUE(store->BeginGroup().ok());
  ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("j", 1, 0, {"e"})).ok());
  ASSERT_TRUE(store->CommitGroup("w", 6).ok());
  EXPECT_THAT(Texts(*store->telemetry().ListLogs("j", 1, 0, 0)), ElementsAre("0:a", "0:b", "0:e"));
  EXPECT_TRUE(store->telemetry().ListMetrics("j", 0)->empty());
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_THAT(snapshot->telemetry_seqs, ElementsAre(std::pair<std::string, int64_t>("w", 6)));
}

}  // namespace
}  // namespace trainctl::coordinator
