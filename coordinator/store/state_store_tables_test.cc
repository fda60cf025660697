// StateStore's tables (state_store.h: jobs(), telemetry(), workers(),
// auth(), queues(), usage(), code_archives()) are views of one store: one
// connection, one transaction, one write fault, one lock. These cases hold
// the split to that on both backends: a group spans every table and commits
// or rolls back as one, every table's write asks the store's fault with its
// operation's name, and the tables can be used from several threads at
// once. Each table's own behaviour is tested in state_store_test.cc and
// state_store_telemetry_test.cc.
#include <thread>
#include <type_traits>

#include "coordinator/store/state_store_test_support.h"

namespace trainctl::coordinator {
namespace {

using namespace store_testing;  // NOLINT: the tests' shared helpers

// The tables are the store's own: never copied out of it.
static_assert(!std::is_copy_constructible_v<JobsTable>);
static_assert(!std::is_copy_constructible_v<TelemetryTables>);
static_assert(!std::is_copy_constructible_v<WorkersTable>);
static_assert(!std::is_copy_constructible_v<AuthTables>);
static_assert(!std::is_copy_constructible_v<QueueTables>);
static_assert(!std::is_copy_constructible_v<UsageTable>);
static_assert(!std::is_copy_constructible_v<CodeArchives>);

const std::string kDigest = "sha256:" + std::string(64, 'd');

v1::AttemptUsage Usage(const std::string& job) {
  v1::AttemptUsage u;
  u.set_job_id(job);
  u.set_attempt(1);
  u.mutable_start_time()->set_seconds(1700000000);
  u.mutable_end_time()->set_seconds(1700000100);
  return u;
}

// One write through each table (the same rows every time).
void WriteEveryTable(StateStore& store) {
  ASSERT_TRUE(store.jobs().PutJob(MakeJob("j"), 1, {MakeEvent("j", 1)}).ok());
  ASSERT_TRUE(store.telemetry().AppendMetrics(MakeMetrics("j", 1, 1, 2)).ok());
  ASSERT_TRUE(store.telemetry().AppendLogs(MakeLogs("j", 1, 0, {"hello"})).ok());
  v1::Worker worker;
  worker.set_id("w");
  ASSERT_TRUE(store.workers().PutWorker(worker).ok());
  v1::Token token;
  token.set_id("t");
  ASSERT_TRUE(store.auth().PutToken(token, std::string(64, 'a')).ok());
  ASSERT_TRUE(store.auth().PutOwnerNumber("alice", 1).ok());
  v1::Queue queue;
  queue.set_name("q");
  ASSERT_TRUE(store.queues().PutQueue(queue).ok());
  ASSERT_TRUE(store.usage().PutAttemptUsage(Usage("j")).ok());
  ASSERT_TRUE(store.code_archives().PutCode(kDigest, "code", absl::FromUnixSeconds(1)).ok());
}

// How many of WriteEveryTable's rows each table holds, in its order.
std::vector<size_t> RowsOfEveryTable(StateStore& store) {
  auto snapshot = store.LoadAll();
  auto events = store.jobs().ListEvents("j", 0, 0);
  auto metrics = store.telemetry().ListMetrics("j", 0);
  auto logs = store.telemetry().ListLogs("j", 1, std::nullopt, 0);
  auto tokens = store.auth().LoadTokens();
  auto owners = store.auth().LoadOwnerNumbers();
  auto queues = store.queues().LoadQueues();
  auto usage = store.usage().LoadAttemptUsage(absl::InfinitePast(), absl::InfiniteFuture());
  auto code = store.code_archives().CodeSize(kDigest);
  for (const absl::Status& s :
       {snapshot.status(), events.status(), metrics.status(), logs.status(), tokens.status(),
        owners.status(), queues.status(), usage.status(), code.status()}) {
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) return {};
  }
  return {snapshot->jobs.size(),
          events->size(),
          metrics->size(),
          logs->size(),
          snapshot->workers.size(),
          tokens->size(),
          owners->size(),
          queues->size(),
          usage->size(),
          code->has_value() ? size_t{1} : size_t{0}};
}

const std::vector<size_t> kNone(10, 0);
const std::vector<size_t> kAll = {1, 1, 2, 1, 1, 1, 1, 1, 1, 1};

TEST_P(StoreBackendTest, AGroupSpansEveryTableAndRollsBackAsOne) {
  auto store = Reopen();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->BeginGroup().ok());
  WriteEveryTable(*store);
  // Inside the group its writes are what this connection sees.
  EXPECT_EQ(RowsOfEveryTable(*store), kAll);
  store->RollbackGroup();
  EXPECT_EQ(RowsOfEveryTable(*store), kNone) << "every table's write was in the one transaction";
}

TEST_P(StoreBackendTest, AGroupSpanningEveryTableCommitsAsOne) {
  {
    auto store = Reopen();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->BeginGroup().ok());
    WriteEveryTable(*store);
    ASSERT_TRUE(store->CommitGroup("w", 4).ok());
  }
  auto store = Reopen();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(RowsOfEveryTable(*store), kAll);
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_THAT(snapshot->telemetry_seqs, ElementsAre(std::pair<std::string, int64_t>("w", 4)));
}

TEST_P(StoreBackendTest, EveryTablesWriteAsksTheStoresWriteFault) {
  auto store = Fresh();
  ASSERT_NE(store, nullptr);
  std::vector<std::string> asked;
  store->SetWriteFaultForTest([&asked](int64_t n, absl::string_view op) {
    asked.push_back(absl::StrCat(n, " ", op));
    return true;
  });
  EXPECT_TRUE(absl::IsUnavailable(store->jobs().PutJob(MakeJob("j"), 1)));
  EXPECT_TRUE(absl::IsUnavailable(store->telemetry().AppendMetrics(MakeMetrics("j", 1, 1, 1))));
  EXPECT_TRUE(absl::IsUnavailable(store->telemetry().AppendLogs(MakeLogs("j", 1, 0, {"x"}))));
  v1::Worker worker;
  worker.set_id("w");
  EXPECT_TRUE(absl::IsUnavailable(store->workers().PutWorker(worker)));
  v1::Token token;
  token.set_id("t");
  EXPECT_TRUE(absl::IsUnavailable(store->auth().PutToken(token, "h")));
  v1::Queue queue;
  queue.set_name("q");
  EXPECT_TRUE(absl::IsUnavailable(store->queues().PutQueue(queue)));
  EXPECT_TRUE(absl::IsUnavailable(store->usage().PutAttemptUsage(Usage("j"))));
  EXPECT_TRUE(
      absl::IsUnavailable(store->code_archives().PutCode(kDigest, "c", absl::FromUnixSeconds(1))));
  // The operation names are the store's as before the split, counted on one
  // sequence across the tables.
  EXPECT_THAT(asked, ElementsAre("1 PutJob('j')", "2 AppendMetrics('j')",
                                 "3 AppendLogs('j', attempt 1, rank 0)", "4 PutWorker('w')",
                                 "5 PutToken('t')", "6 PutQueue('q')", "7 PutAttemptUsage('j', 1)",
                                 absl::StrCat("8 PutCode('", kDigest, "')")));
  store->SetWriteFaultForTest(nullptr);
  EXPECT_EQ(RowsOfEveryTable(*store), kNone);
}

TEST_P(StoreBackendTest, TablesShareTheStoresLockAcrossThreads) {
  auto store = Fresh();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->jobs().PutJob(MakeJob("j"), 1).ok());
  constexpr int kRounds = 50;
  // Each thread writes through its own table; one connection serves them all.
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    for (int i = 1; i <= kRounds; ++i) {
      EXPECT_TRUE(store->jobs().PutJob(MakeJob("j"), 1, {MakeEvent("j", i)}).ok());
    }
  });
  threads.emplace_back([&] {
    for (int i = 1; i <= kRounds; ++i) {
      EXPECT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("j", 1, i, 1)).ok());
    }
  });
  threads.emplace_back([&] {
    for (int i = 1; i <= kRounds; ++i) {
      v1::Worker worker;
      worker.set_id(absl::StrCat("w", i));
      EXPECT_TRUE(store->workers().PutWorker(worker).ok());
    }
  });
  threads.emplace_back([&] {
    for (int i = 1; i <= kRounds; ++i) {
      v1::Queue queue;
      queue.set_name(absl::StrCat("q", i));
      EXPECT_TRUE(store->queues().PutQueue(queue).ok());
    }
  });
  for (std::thread& t : threads) t.join();
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->workers.size(), static_cast<size_t>(kRounds));
  EXPECT_EQ(snapshot->last_event_seqs[0], kRounds);
  EXPECT_EQ(store->jobs().ListEvents("j", 0, 0)->size(), static_cast<size_t>(kRounds));
  EXPECT_EQ(store->telemetry().ListMetrics("j", 0)->size(), static_cast<size_t>(kRounds));
  EXPECT_EQ(store->queues().LoadQueues()->size(), static_cast<size_t>(kRounds));
}

TRAINCTL_STORE_BACKENDS(StoreBackendTest);

}  // namespace
}  // namespace trainctl::coordinator
