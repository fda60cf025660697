#include "coordinator/store/state_store.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A fresh directory under $TMPDIR, removed with its contents at the end.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(base != nullptr ? base : "/tmp", "/state_store_test.XXXXXX");
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    char* dir = mkdtemp(buf.data());
    if (dir == nullptr) {
      ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
      return;
    }
    path_ = dir;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

v1::Job MakeJob(const std::string& id, v1::JobState state = v1::JOB_STATE_PENDING) {
  v1::Job job;
  job.set_id(id);
  job.set_state(state);
  job.mutable_spec()->set_name(id);
  job.mutable_spec()->set_world_size(2);
  return job;
}

v1::Event MakeEvent(const std::string& job_id, int64_t seq, const std::string& type = "e") {
  v1::Event event;
  event.set_seq(seq);
  event.set_job_id(job_id);
  event.set_type(type);
  event.set_rank(-1);
  event.set_message(absl::StrCat(type, " #", seq));
  return event;
}

v1::MetricBatch MakeMetrics(const std::string& job_id, int32_t attempt, int64_t first_step,
                            int n, int32_t rank = 0) {
  v1::MetricBatch batch;
  batch.set_job_id(job_id);
  batch.set_attempt(attempt);
  for (int i = 0; i < n; ++i) {
    v1::MetricPoint* p = batch.add_points();
    p->set_kind(v1::MetricPoint::KIND_TRAIN);
    p->set_rank(rank);
    p->set_step(first_step + i);
    p->set_loss(1.0 / static_cast<double>(first_step + i));
  }
  return batch;
}

v1::LogChunk MakeLogs(const std::string& job_id, int32_t attempt, int32_t rank,
                      const std::vector<std::string>& texts) {
  v1::LogChunk chunk;
  chunk.set_job_id(job_id);
  chunk.set_attempt(attempt);
  chunk.set_rank(rank);
  for (const std::string& text : texts) {
    v1::LogLine* line = chunk.add_lines();
    line->set_rank(rank);
    line->set_stream(v1::LogLine::STREAM_STDOUT);
    line->set_text(text);
  }
  return chunk;
}

std::vector<int64_t> Steps(const std::vector<v1::MetricPoint>& points) {
  std::vector<int64_t> steps;
  for (const auto& p : points) steps.push_back(p.step());
  return steps;
}
std::vector<int64_t> Seqs(const std::vector<v1::Event>& events) {
  std::vector<int64_t> seqs;
  for (const auto& e : events) seqs.push_back(e.seq());
  return seqs;
}
std::vector<std::string> Texts(const std::vector<v1::LogLine>& lines) {
  std::vector<std::string> texts;
  for (const auto& l : lines) texts.push_back(absl::StrCat(l.rank(), ":", l.text()));
  return texts;
}

std::unique_ptr<StateStore> OpenOrDie(const std::string& path, StoreOptions options = {}) {
  auto store = StateStore::Open(path, options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(store).value() : nullptr;
}

// Runs SQL on a database file with the raw C API (the store must be closed).
void RawExec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  EXPECT_EQ(rc, SQLITE_OK) << (error != nullptr ? error : "") << " in " << sql;
  sqlite3_free(error);
  sqlite3_close(db);
}

std::string IntegrityCheck(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) return "cannot open";
  sqlite3_stmt* stmt = nullptr;
  std::string result;
  if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &stmt, nullptr) == SQLITE_OK) {
    while (sqlite3_step(stmt) == SQLITE_ROW) {
      result += reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    }
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return result;
}

// ---------------------------------------------------------------------------

TEST(StateStoreTest, EmptyStoreLoadsNothing) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_TRUE(snapshot->jobs.empty());
  EXPECT_TRUE(snapshot->workers.empty());
  EXPECT_TRUE(snapshot->submit_seqs.empty());
  EXPECT_TRUE(snapshot->last_event_seqs.empty());
}

TEST(StateStoreTest, PutJobRoundTripInSubmissionOrder) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  v1::Job b = MakeJob("job-b");
  v1::Attempt* attempt = b.add_attempts();
  attempt->set_number(1);
  attempt->set_state(v1::ATTEMPT_STATE_RUNNING);
  v1::RankAssignment* rank = attempt->add_ranks();
  rank->set_job_id("job-b");
  rank->set_rank(1);
  rank->set_worker_id("w1");
  ASSERT_TRUE(store->PutJob(b, 20, {MakeEvent("job-b", 1), MakeEvent("job-b", 2)}).ok());
  ASSERT_TRUE(store->PutJob(MakeJob("job-a"), 10, {MakeEvent("job-a", 1)}).ok());
  ASSERT_TRUE(store->PutJob(MakeJob("job-c"), 30).ok());

  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  ASSERT_EQ(snapshot->jobs.size(), 3u);
  EXPECT_EQ(snapshot->jobs[0].id(), "job-a");
  EXPECT_EQ(snapshot->jobs[1].id(), "job-b");
  EXPECT_EQ(snapshot->jobs[2].id(), "job-c");
  EXPECT_THAT(snapshot->submit_seqs, ElementsAre(10, 20, 30));
  EXPECT_THAT(snapshot->last_event_seqs, ElementsAre(1, 2, 0));
  EXPECT_EQ(snapshot->jobs[1].SerializeAsString(), b.SerializeAsString());
}

TEST(StateStoreTest, PutJobReplacesButKeepsFirstSubmitSeq) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->PutJob(MakeJob("a"), 1, {MakeEvent("a", 1, "submitted")}).ok());
  ASSERT_TRUE(store->PutJob(MakeJob("b"), 2).ok());
  v1::Job running = MakeJob("a", v1::JOB_STATE_RUNNING);
  running.set_restarts(2);
  // A later write with another submit_seq must not reorder the job.
  ASSERT_TRUE(store->PutJob(running, 99, {MakeEvent("a", 2, "running")}).ok());

  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  ASSERT_EQ(snapshot->jobs.size(), 2u);
  EXPECT_EQ(snapshot->jobs[0].id(), "a");
  EXPECT_EQ(snapshot->jobs[0].state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(snapshot->jobs[0].restarts(), 2);
  EXPECT_THAT(snapshot->submit_seqs, ElementsAre(1, 2));
  EXPECT_THAT(snapshot->last_event_seqs, ElementsAre(2, 0));
}

TEST(StateStoreTest, PutJobIsAtomicWithItsEvents) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->PutJob(MakeJob("a"), 1, {MakeEvent("a", 1)}).ok());
  // Seq 1 again: the whole call fails and neither the job nor seq 2 is written.
  absl::Status status = store->PutJob(MakeJob("a", v1::JOB_STATE_FAILED), 1,
                                      {MakeEvent("a", 2), MakeEvent("a", 1)});
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists) << status;
  EXPECT_THAT(status.message(), HasSubstr("PutJob('a')"));
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->jobs[0].state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(snapshot->last_event_seqs, ElementsAre(1));
  // The store still works after the rollback.
  EXPECT_TRUE(store->PutJob(MakeJob("a"), 1, {MakeEvent("a", 2)}).ok());
}

TEST(StateStoreTest, RejectsBadInput) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->PutJob(MakeJob(""), 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->PutJob(MakeJob("a"), 1, {MakeEvent("other", 1)}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->PutWorker(v1::Worker()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->AppendMetrics(MakeMetrics("", 1, 1, 1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->AppendLogs(MakeLogs("", 1, 0, {"x"})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StateStore::Open("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StateStoreTest, ListEventsAfterSeqAscendingWithLimit) {
  auto store = OpenOrDie(":memory:");
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

TEST(StateStoreTest, MetricsNewestFirstLimitOldestFirstOrder) {
  auto store = OpenOrDie(":memory:");
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

TEST(StateStoreTest, LogsPerRankInOrderWithRankFilterAndTail) {
  auto store = OpenOrDie(":memory:");
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

TEST(StateStoreTest, PutWorkerReplaces) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  v1::Worker w;
  w.set_id("w2");
  w.set_hostname("host2");
  (*w.mutable_labels())["zone"] = "a";
  w.add_slots()->set_kind(v1::Slot::KIND_GPU);
  ASSERT_TRUE(store->PutWorker(w).ok());
  v1::Worker w1;
  w1.set_id("w1");
  ASSERT_TRUE(store->PutWorker(w1).ok());
  w.set_state(v1::WORKER_STATE_LOST);
  ASSERT_TRUE(store->PutWorker(w).ok());

  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok());
  ASSERT_EQ(snapshot->workers.size(), 2u);
  EXPECT_EQ(snapshot->workers[0].id(), "w1");
  EXPECT_EQ(snapshot->workers[1].SerializeAsString(), w.SerializeAsString());
}

TEST(StateStoreTest, MetricRetentionKeepsNewestPerJob) {
  StoreOptions options;
  options.max_metric_points_per_job = 10;
  auto store = OpenOrDie(":memory:", options);
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
TEST(StateStoreTest, MetricRetentionDownsamplesOldPointsKeepingMinMaxLast) {
  StoreOptions options;
  options.max_metric_points_per_job = 64;
  auto store = OpenOrDie(":memory:", options);
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

TEST(StateStoreTest, ListMetricPageFiltersAndPagesByBytes) {
  auto store = OpenOrDie(":memory:");
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

TEST(StateStoreTest, LogRetentionPerJobAttemptRank) {
  StoreOptions options;
  options.max_log_lines_per_rank = 3;
  auto store = OpenOrDie(":memory:", options);
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

TEST(StateStoreTest, EventRetentionKeepsLastSeq) {
  StoreOptions options;
  options.max_events_per_job = 4;
  auto store = OpenOrDie(":memory:", options);
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

TEST(StateStoreTest, RetentionHoldsAcrossReopen) {
  TempDir dir;
  const std::string path = dir.File("state.db");
  StoreOptions options;
  options.max_metric_points_per_job = 5;
  options.max_log_lines_per_rank = 5;
  options.max_events_per_job = 5;
  {
    auto store = OpenOrDie(path, options);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->AppendMetrics(MakeMetrics("a", 1, 1, 4)).ok());
    ASSERT_TRUE(store->AppendLogs(MakeLogs("a", 1, 0, {"1", "2", "3", "4"})).ok());
    ASSERT_TRUE(store->PutJob(MakeJob("a"), 1,
                              {MakeEvent("a", 1), MakeEvent("a", 2), MakeEvent("a", 3),
                               MakeEvent("a", 4)})
                    .ok());
  }
  // A new process starts with no cached counts: they come from the file.
  auto store = OpenOrDie(path, options);
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

TEST(StateStoreTest, ReopenFileLoadsEverything) {
  TempDir dir;
  const std::string path = dir.File("state.db");
  v1::Job job = MakeJob("j1", v1::JOB_STATE_RUNNING);
  job.add_attempts()->set_number(1);
  v1::Worker worker;
  worker.set_id("w1");
  worker.set_address("10.0.0.1");
  {
    auto store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->PutJob(job, 7, {MakeEvent("j1", 1), MakeEvent("j1", 2)}).ok());
    ASSERT_TRUE(store->PutJob(MakeJob("j0"), 3).ok());
    ASSERT_TRUE(store->PutWorker(worker).ok());
    ASSERT_TRUE(store->AppendMetrics(MakeMetrics("j1", 1, 1, 5)).ok());
    ASSERT_TRUE(store->AppendLogs(MakeLogs("j1", 1, 0, {"hello", "world"})).ok());
  }
  auto store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  ASSERT_EQ(snapshot->jobs.size(), 2u);
  EXPECT_EQ(snapshot->jobs[0].id(), "j0");
  EXPECT_EQ(snapshot->jobs[1].SerializeAsString(), job.SerializeAsString());
  EXPECT_THAT(snapshot->submit_seqs, ElementsAre(3, 7));
  EXPECT_THAT(snapshot->last_event_seqs, ElementsAre(0, 2));
  ASSERT_EQ(snapshot->workers.size(), 1u);
  EXPECT_EQ(snapshot->workers[0].SerializeAsString(), worker.SerializeAsString());
  auto metrics = store->ListMetrics("j1", 0);
  ASSERT_TRUE(metrics.ok());
  EXPECT_THAT(Steps(*metrics), ElementsAre(1, 2, 3, 4, 5));
  auto logs = store->ListLogs("j1", 1, std::nullopt, 0);
  ASSERT_TRUE(logs.ok());
  EXPECT_THAT(Texts(*logs), ElementsAre("0:hello", "0:world"));
}

TEST(StateStoreTest, SchemaVersionTooNewIsFailedPrecondition) {
  TempDir dir;
  const std::string path = dir.File("state.db");
  ASSERT_NE(OpenOrDie(path), nullptr);
  RawExec(path, "PRAGMA user_version=99");
  auto store = StateStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("schema version 99"));
  EXPECT_THAT(store.status().message(), HasSubstr(path));
}

TEST(StateStoreTest, GarbageFileIsAClearError) {
  TempDir dir;
  for (size_t size : {size_t{16}, size_t{4096}}) {
    const std::string path = dir.File(absl::StrCat("garbage-", size));
    std::string garbage(size, '\0');
    std::mt19937 rng(static_cast<uint32_t>(size));
    for (char& c : garbage) c = static_cast<char>(rng());
    {
      std::ofstream out(path, std::ios::binary);
      out << garbage;
    }
    auto store = StateStore::Open(path);
    ASSERT_FALSE(store.ok()) << size;
    EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
    EXPECT_THAT(store.status().message(), HasSubstr("not an SQLite"));
    EXPECT_THAT(store.status().message(), HasSubstr(path));
    // The file is left as it was.
    std::ifstream in(path, std::ios::binary);
    std::string after((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(after, garbage);
  }
}

TEST(StateStoreTest, ForeignSqliteDatabaseIsRefused) {
  TempDir dir;
  const std::string path = dir.File("other.db");
  RawExec(path, "CREATE TABLE notes (text TEXT)");
  auto store = StateStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("not a trainctl database"));
}

TEST(StateStoreTest, EmptyExistingFileIsRefusedNotStartedAsANewCluster) {
  TempDir dir;
  // A 0-byte file (touch, a failed copy) and an SQLite file with no tables:
  // neither is a trainctl database, and neither may silently become one.
  const std::string zero = dir.File("zero.db");
  { std::ofstream out(zero, std::ios::binary); }
  const std::string blank = dir.File("blank.db");
  RawExec(blank, "CREATE TABLE t (x); DROP TABLE t");
  for (const std::string& path : {zero, blank}) {
    SCOPED_TRACE(path);
    auto store = StateStore::Open(path);
    ASSERT_FALSE(store.ok());
    EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
    EXPECT_THAT(store.status().message(), HasSubstr(path));
    EXPECT_THAT(store.status().message(), HasSubstr("not a trainctl database (it is empty)"));
    EXPECT_THAT(store.status().message(), HasSubstr("a path that does not exist yet"));
  }
  EXPECT_EQ(std::filesystem::file_size(zero), 0u) << "the refused file is left as it was";
  // A path that does not exist is a new database, and reopening it works.
  const std::string fresh = dir.File("fresh.db");
  ASSERT_NE(OpenOrDie(fresh), nullptr);
  EXPECT_NE(OpenOrDie(fresh), nullptr);
}

TEST(StateStoreTest, InjectedWriteFaultFailsExactlyThatWriteAndRollsItBack) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  std::vector<std::string> ops;
  store->SetWriteFaultForTest([&](int64_t write_no, absl::string_view op) {
    ops.emplace_back(op);
    return write_no == 2 || write_no == 5;
  });
  ASSERT_TRUE(store->PutJob(MakeJob("a"), 1, {MakeEvent("a", 1)}).ok());        // write 1
  absl::Status failed =
      store->PutJob(MakeJob("a", v1::JOB_STATE_FAILED), 1, {MakeEvent("a", 2)});  // write 2
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("PutJob('a')"));
  EXPECT_THAT(failed.message(), HasSubstr("injected write fault"));
  // Reads do not count and see nothing of the failed write.
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->jobs[0].state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(snapshot->last_event_seqs, ElementsAre(1));
  // The same write succeeds when retried (its event seq was not used).
  ASSERT_TRUE(store->PutJob(MakeJob("a", v1::JOB_STATE_FAILED), 1, {MakeEvent("a", 2)}).ok());  // 3
  ASSERT_TRUE(store->AppendMetrics(MakeMetrics("a", 1, 0, 2)).ok());                            // 4
  v1::Worker worker;
  worker.set_id("w");
  EXPECT_EQ(store->PutWorker(worker).code(), absl::StatusCode::kUnavailable);                  // 5
  EXPECT_TRUE(store->AppendLogs(MakeLogs("a", 1, 0, {"x", "y"})).ok());                        // 6
  EXPECT_THAT(ops, ElementsAre("PutJob('a')", "PutJob('a')", "PutJob('a')", "AppendMetrics('a')",
                               "PutWorker('w')", HasSubstr("AppendLogs('a'")));
  // Clearing the fault: writes are plain again.
  store->SetWriteFaultForTest(nullptr);
  EXPECT_TRUE(store->PutWorker(worker).ok());
  snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->jobs[0].state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(snapshot->last_event_seqs, ElementsAre(2));
  EXPECT_EQ(snapshot->workers.size(), 1u);
  auto metrics = store->ListMetrics("a", 0);
  ASSERT_TRUE(metrics.ok());
  EXPECT_EQ(metrics->size(), 2u);
}

TEST(StateStoreTest, SecondOpenOfTheSameFileIsUnavailable) {
  TempDir dir;
  const std::string path = dir.File("state.db");
  auto first = OpenOrDie(path);
  ASSERT_NE(first, nullptr);
  auto second = StateStore::Open(path);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  first.reset();
  EXPECT_NE(OpenOrDie(path), nullptr);
}

TEST(StateStoreTest, CorruptBlobIsReportedNotACrash) {
  TempDir dir;
  const std::string path = dir.File("state.db");
  {
    auto store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->PutJob(MakeJob("a"), 1, {MakeEvent("a", 1)}).ok());
    ASSERT_TRUE(store->AppendMetrics(MakeMetrics("a", 1, 1, 1)).ok());
    ASSERT_TRUE(store->AppendLogs(MakeLogs("a", 1, 0, {"x"})).ok());
  }
  // Field 1, length-delimited, claims 127 bytes that are not there.
  RawExec(path,
          "UPDATE jobs SET blob = x'0a7f01'; UPDATE events SET blob = x'0a7f01';"
          "UPDATE metrics SET blob = x'0a7f01'; UPDATE logs SET blob = x'0a7f01';");
  auto store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  auto snapshot = store->LoadAll();
  ASSERT_FALSE(snapshot.ok());
  EXPECT_EQ(snapshot.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(snapshot.status().message(), HasSubstr("jobs row 'a'"));
  EXPECT_EQ(store->ListEvents("a", 0, 0).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store->ListMetrics("a", 0).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store->ListLogs("a", 1, std::nullopt, 0).status().code(),
            absl::StatusCode::kDataLoss);
  // Writes still work.
  EXPECT_TRUE(store->PutWorker(v1::Worker()).code() == absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store->AppendMetrics(MakeMetrics("a", 1, 2, 1)).ok());
}

TEST(StateStoreTest, ConcurrentWritersAndReaders) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("state.db"));
  ASSERT_NE(store, nullptr);
  constexpr int kThreads = 6;
  constexpr int kIterations = 25;
  std::atomic<int> failures{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 1; i <= kIterations; ++i) {
        const std::string job_id = absl::StrCat("job-", t);
        if (!store->PutJob(MakeJob(job_id), t, {MakeEvent(job_id, i)}).ok()) ++failures;
        if (!store->AppendMetrics(MakeMetrics("shared", 1, t * 1000 + i, 1, t)).ok()) ++failures;
        if (!store->AppendLogs(MakeLogs("shared", 1, t, {absl::StrCat(i)})).ok()) ++failures;
        v1::Worker worker;
        worker.set_id(absl::StrCat("w", t));
        worker.add_busy_slots(i);
        if (!store->PutWorker(worker).ok()) ++failures;
      }
    });
  }
  std::thread reader([&] {
    while (!done.load()) {
      if (!store->ListMetrics("shared", 10).ok()) ++failures;
      if (!store->LoadAll().ok()) ++failures;
      if (!store->ListLogs("shared", 1, std::nullopt, 3).ok()) ++failures;
    }
  });
  for (auto& thread : threads) thread.join();
  done = true;
  reader.join();
  EXPECT_EQ(failures.load(), 0);

  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->jobs.size(), size_t{kThreads});
  for (int64_t last : snapshot->last_event_seqs) EXPECT_EQ(last, kIterations);
  EXPECT_EQ(snapshot->workers.size(), size_t{kThreads});
  auto metrics = store->ListMetrics("shared", 0);
  ASSERT_TRUE(metrics.ok());
  EXPECT_EQ(metrics->size(), size_t{kThreads * kIterations});
  for (int t = 0; t < kThreads; ++t) {
    auto logs = store->ListLogs("shared", 1, t, 0);
    ASSERT_TRUE(logs.ok());
    ASSERT_EQ(logs->size(), size_t{kIterations});
    // Per rank, in the order each writer appended.
    for (int i = 0; i < kIterations; ++i) EXPECT_EQ((*logs)[i].text(), absl::StrCat(i + 1));
  }
}

// ---------------------------------------------------------------------------
// Crash test: a child process writes through the store and acknowledges each
// iteration on a pipe only after every call in it returned OK; the parent
// SIGKILLs it at a random moment and checks that every acknowledged write
// survived. The child is this binary re-executed with the disabled test
// below (exec right after fork: nothing of the parent's threads is reused).

constexpr char kCrashDbEnv[] = "TRAINCTL_STORE_CRASH_DB";
constexpr char kCrashAckFdEnv[] = "TRAINCTL_STORE_CRASH_ACK_FD";
constexpr int64_t kCrashRetention = 100000;  // large enough to never trim in the test

StoreOptions CrashOptions() {
  StoreOptions options;
  options.max_metric_points_per_job = kCrashRetention;
  options.max_log_lines_per_rank = kCrashRetention;
  options.max_events_per_job = kCrashRetention;
  return options;
}

// Iteration i of the child: a new job "j<i>" with its event, an update of job
// "main" with event seq i, a metric point of step i, a log line "i" on rank
// i % 2, and worker "w" with busy slot i.
absl::Status CrashIteration(StateStore& store, int64_t i) {
  const std::string id = absl::StrCat("j", i);
  absl::Status status = store.PutJob(MakeJob(id), i, {MakeEvent(id, 1, "submitted")});
  if (!status.ok()) return status;
  v1::Job main = MakeJob("main", v1::JOB_STATE_RUNNING);
  main.mutable_progress()->set_step(i);
  status = store.PutJob(main, 0, {MakeEvent("main", i, "progress")});
  if (!status.ok()) return status;
  status = store.AppendMetrics(MakeMetrics("main", 1, i, 1));
  if (!status.ok()) return status;
  status = store.AppendLogs(MakeLogs("main", 1, static_cast<int32_t>(i % 2), {absl::StrCat(i)}));
  if (!status.ok()) return status;
  v1::Worker worker;
  worker.set_id("w");
  worker.add_busy_slots(static_cast<int32_t>(i));
  return store.PutWorker(worker);
}

TEST(StateStoreCrashChild, DISABLED_WriteUntilKilled) {
  const char* db = std::getenv(kCrashDbEnv);
  const char* fd_text = std::getenv(kCrashAckFdEnv);
  if (db == nullptr || fd_text == nullptr) GTEST_SKIP() << "only run by CrashLosesNoAckedWrite";
  const int ack_fd = std::atoi(fd_text);
  auto store = StateStore::Open(db, CrashOptions());
  ASSERT_TRUE(store.ok()) << store.status();
  for (int64_t i = 1;; ++i) {
    absl::Status status = CrashIteration(**store, i);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_EQ(write(ack_fd, &i, sizeof(i)), static_cast<ssize_t>(sizeof(i)));
  }
}

// Reads one acknowledgement; false at EOF or after timeout_ms.
bool ReadAck(int fd, int timeout_ms, int64_t* ack) {
  pollfd pfd{fd, POLLIN, 0};
  if (poll(&pfd, 1, timeout_ms) <= 0) return false;
  size_t got = 0;
  char* out = reinterpret_cast<char*>(ack);
  while (got < sizeof(*ack)) {
    ssize_t n = read(fd, out + got, sizeof(*ack) - got);
    if (n <= 0) return false;  // a partial ack at EOF cannot happen: writes <= PIPE_BUF are atomic
    got += static_cast<size_t>(n);
  }
  return true;
}

TEST(StateStoreCrashTest, CrashLosesNoAckedWrite) {
  std::random_device seed_source;
  const uint32_t seed = seed_source();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937 rng(seed);
  const auto test_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(12);

  constexpr int kRounds = 4;
  for (int round = 0; round < kRounds; ++round) {
    if (std::chrono::steady_clock::now() > test_deadline) break;
    SCOPED_TRACE(absl::StrCat("round ", round));
    TempDir dir;
    const std::string path = dir.File("state.db");

    // Prepared before fork: the child only calls async-signal-safe functions
    // until execve.
    int pipe_fds[2];
    ASSERT_EQ(pipe(pipe_fds), 0);
    std::vector<std::string> env_strings = {
        absl::StrCat(kCrashDbEnv, "=", path),
        absl::StrCat(kCrashAckFdEnv, "=", pipe_fds[1]),
    };
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    std::vector<char*> envp;
    for (std::string& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe";
    std::string filter = "--gtest_filter=StateStoreCrashChild.DISABLED_WriteUntilKilled";
    std::string also_disabled = "--gtest_also_run_disabled_tests";
    std::vector<char*> argv = {exe.data(), filter.data(), also_disabled.data(), nullptr};
    int dev_null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    ASSERT_GE(dev_null, 0);

    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(pipe_fds[0]);
      dup2(dev_null, STDOUT_FILENO);  // keep gtest's chatter out of our output
      execve(exe.c_str(), argv.data(), envp.data());
      _exit(127);
    }
    close(dev_null);
    close(pipe_fds[1]);

    // Kill after a random number of acknowledged iterations, then after a
    // random pause so the kill lands anywhere inside an iteration.
    const int64_t kill_after = std::uniform_int_distribution<int64_t>(1, 60)(rng);
    int64_t last_ack = 0;
    int64_t ack = 0;
    bool child_alive = true;
    while (last_ack < kill_after) {
      if (!ReadAck(pipe_fds[0], 5000, &ack)) {
        child_alive = false;
        break;
      }
      ASSERT_EQ(ack, last_ack + 1);
      last_ack = ack;
    }
    std::this_thread::sleep_for(
        std::chrono::microseconds(std::uniform_int_distribution<int>(0, 5000)(rng)));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    // Acknowledgements already in the pipe count too.
    while (ReadAck(pipe_fds[0], 5000, &ack)) {
      ASSERT_EQ(ack, last_ack + 1);
      last_ack = ack;
    }
    close(pipe_fds[0]);
    int wstatus = 0;
    ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(child_alive) << "child stopped before it was killed, status " << wstatus;
    ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
        << "child was not killed by SIGKILL, status " << wstatus;
    ASSERT_GE(last_ack, kill_after);

    // Every acknowledged iteration is there; at most the one in flight
    // beyond it, and only as whole calls (each call is one transaction).
    auto store = StateStore::Open(path, CrashOptions());
    ASSERT_TRUE(store.ok()) << store.status();
    auto snapshot = (*store)->LoadAll();
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    ASSERT_GE(snapshot->jobs.size(), static_cast<size_t>(last_ack + 1));
    ASSERT_LE(snapshot->jobs.size(), static_cast<size_t>(last_ack + 2));
    EXPECT_EQ(snapshot->jobs[0].id(), "main");
    EXPECT_EQ(snapshot->submit_seqs[0], 0);
    const int64_t main_step = snapshot->jobs[0].progress().step();
    EXPECT_GE(main_step, last_ack);
    EXPECT_LE(main_step, last_ack + 1);
    EXPECT_EQ(snapshot->last_event_seqs[0], main_step);
    for (size_t k = 1; k < snapshot->jobs.size(); ++k) {
      EXPECT_EQ(snapshot->jobs[k].id(), absl::StrCat("j", k));
      EXPECT_EQ(snapshot->submit_seqs[k], static_cast<int64_t>(k));
      EXPECT_EQ(snapshot->last_event_seqs[k], 1);
    }
    auto events = (*store)->ListEvents("main", 0, 0);
    ASSERT_TRUE(events.ok());
    ASSERT_EQ(events->size(), static_cast<size_t>(main_step));
    for (int64_t i = 0; i < main_step; ++i) EXPECT_EQ((*events)[i].seq(), i + 1);

    auto metrics = (*store)->ListMetrics("main", 0);
    ASSERT_TRUE(metrics.ok());
    ASSERT_GE(metrics->size(), static_cast<size_t>(last_ack));
    ASSERT_LE(metrics->size(), static_cast<size_t>(last_ack + 1));
    for (size_t i = 0; i < metrics->size(); ++i) {
      EXPECT_EQ((*metrics)[i].step(), static_cast<int64_t>(i + 1));
    }
    auto logs = (*store)->ListLogs("main", 1, std::nullopt, 0);
    ASSERT_TRUE(logs.ok());
    ASSERT_GE(logs->size(), static_cast<size_t>(last_ack));
    ASSERT_LE(logs->size(), static_cast<size_t>(last_ack + 1));
    std::set<int64_t> lines;
    for (const auto& line : *logs) lines.insert(std::stoll(line.text()));
    for (int64_t i = 1; i <= last_ack; ++i) EXPECT_EQ(lines.count(i), 1u) << "log line " << i;

    ASSERT_EQ(snapshot->workers.size(), 1u);
    ASSERT_EQ(snapshot->workers[0].busy_slots_size(), 1);
    EXPECT_GE(snapshot->workers[0].busy_slots(0), last_ack);

    // The reopened store keeps working, and SQLite finds the file sound.
    EXPECT_TRUE(CrashIteration(**store, last_ack + 100).ok());
    store->reset();
    EXPECT_EQ(IntegrityCheck(path), "ok");
  }
}

// --- groups (at-least-once telemetry) ------------------------------------------

TEST(StateStoreTest, GroupCommitsItsWritesWithTheTelemetrySeqAtomically) {
  TempDir dir;
  const std::string path = dir.File("state.db");
  {
    auto store = OpenOrDie(path);
    ASSERT_TRUE(store->PutJob(MakeJob("j"), 1).ok());
    // Two writes and the seq: one transaction.
    ASSERT_TRUE(store->BeginGroup().ok());
    EXPECT_EQ(store->BeginGroup().code(), absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(store->AppendMetrics(MakeMetrics("j", 1, 1, 3)).ok());
    ASSERT_TRUE(store->PutJob(MakeJob("j", v1::JOB_STATE_RUNNING), 1, {MakeEvent("j", 1)}).ok());
    ASSERT_TRUE(store->CommitGroup("w1", 7).ok());
    // A group that wrote nothing stores no seq (and costs no write).
    ASSERT_TRUE(store->BeginGroup().ok());
    ASSERT_TRUE(store->CommitGroup("w2", 3).ok());
    // A lower seq never lowers the stored one.
    ASSERT_TRUE(store->BeginGroup().ok());
    ASSERT_TRUE(store->AppendLogs(MakeLogs("j", 1, 0, {"a"})).ok());
    ASSERT_TRUE(store->CommitGroup("w1", 5).ok());
  }
  auto store = OpenOrDie(path);
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_THAT(snapshot->telemetry_seqs, ElementsAre(std::pair<std::string, int64_t>("w1", 7)));
  EXPECT_EQ(snapshot->jobs[0].state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(store->ListMetrics("j", 0)->size(), 3u);
  EXPECT_EQ(store->ListLogs("j", 1, std::nullopt, 0)->size(), 1u);
}

TEST(StateStoreTest, GroupRollbackDiscardsEverythingAndAFailedWriteOnlyItself) {
  TempDir dir;
  const std::string path = dir.File("state.db");
  StoreOptions options;
  options.max_metric_points_per_job = 5;
  auto store = OpenOrDie(path, options);
  ASSERT_TRUE(store->PutJob(MakeJob("j"), 1, {MakeEvent("j", 1)}).ok());
  ASSERT_TRUE(store->AppendMetrics(MakeMetrics("j", 1, 1, 2)).ok());

  ASSERT_TRUE(store->BeginGroup().ok());
  ASSERT_TRUE(store->AppendMetrics(MakeMetrics("j", 1, 3, 3)).ok());
  // A refused write (event seq already stored) undoes only itself.
  EXPECT_EQ(store->PutJob(MakeJob("j", v1::JOB_STATE_RUNNING), 1, {MakeEvent("j", 1)}).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(Steps(*store->ListMetrics("j", 0)), ElementsAre(1, 2, 3, 4, 5));
  store->RollbackGroup();
  store->RollbackGroup();  // No group: a no-op.
  EXPECT_THAT(Steps(*store->ListMetrics("j", 0)), ElementsAre(1, 2));

  // Retention still counts right after the rollback (its cached counts went).
  ASSERT_TRUE(store->AppendMetrics(MakeMetrics("j", 1, 10, 4)).ok());
  EXPECT_THAT(Steps(*store->ListMetrics("j", 0)), ElementsAre(2, 10, 11, 12, 13));
  EXPECT_EQ(store->CommitGroup("w", 1).code(), absl::StatusCode::kFailedPrecondition);
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_TRUE(snapshot->telemetry_seqs.empty());
  EXPECT_EQ(snapshot->jobs[0].state(), v1::JOB_STATE_PENDING);
}

TEST(StateStoreTest, SchemaVersion1MigratesToTheTelemetrySeqTable) {
  TempDir dir;
  const std::string path = dir.File("state.db");
  {
    auto store = OpenOrDie(path);
    ASSERT_TRUE(store->PutJob(MakeJob("old"), 1).ok());
  }
  // What a coordinator before telemetry seqs left behind.
  // (Nor the later tables: tokens and worker_bindings came with version 3.)
  RawExec(path, "DROP TABLE telemetry_seqs; DROP TABLE tokens; DROP TABLE worker_bindings; "
                "PRAGMA user_version=1");
  auto store = OpenOrDie(path);
  ASSERT_TRUE(store->BeginGroup().ok());
  ASSERT_TRUE(store->AppendMetrics(MakeMetrics("old", 1, 1, 1)).ok());
  ASSERT_TRUE(store->CommitGroup("w", 9).ok());
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  ASSERT_EQ(snapshot->jobs.size(), 1u);
  EXPECT_THAT(snapshot->telemetry_seqs, ElementsAre(std::pair<std::string, int64_t>("w", 9)));
  // Migrated on to version 3: tokens and worker bindings work.
  v1::Token token;
  token.set_id("t-1");
  ASSERT_TRUE(store->PutToken(token, std::string(64, 'a')).ok());
  ASSERT_TRUE(store->PutWorkerBinding("w", "t-1").ok());
  ASSERT_TRUE(store->PutWorkerBinding("w", "t-2").ok()) << "a binding is never replaced";
  auto tokens = store->LoadTokens();
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 1u);
  EXPECT_EQ((*tokens)[0].secret_hash, std::string(64, 'a'));
  EXPECT_THAT(*store->LoadWorkerBindings(), ElementsAre(std::pair<std::string, std::string>("w", "t-1")));
}

}  // namespace
}  // namespace trainctl::coordinator
