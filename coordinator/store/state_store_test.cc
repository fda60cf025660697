// StateStore: jobs and their events, workers, reopening, schema versions,
// refusals of foreign or damaged files, injected write faults, groups.
#include "coordinator/store/state_store_test_support.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "common/file_env.h"

namespace trainctl::coordinator {
namespace {

using namespace store_testing;  // NOLINT: the tests' shared helpers

const std::string kDigestA = "sha256:" + std::string(64, 'a');
const std::string kDigestB = "sha256:" + std::string(64, 'b');
const std::string kDigestC = "sha256:" + std::string(64, 'c');

TEST_P(StoreBackendTest, EmptyStoreLoadsNothing) {
  auto store = Fresh();
  ASSERT_NE(store, nullptr);
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_TRUE(snapshot->jobs.empty());
  EXPECT_TRUE(snapshot->workers.empty());
  EXPECT_TRUE(snapshot->submit_seqs.empty());
  EXPECT_TRUE(snapshot->last_event_seqs.empty());
}

TEST_P(StoreBackendTest, PutJobRoundTripInSubmissionOrder) {
  auto store = Fresh();
  ASSERT_NE(store, nullptr);
  v1::Job b = MakeJob("job-b");
  v1::Attempt* attempt = b.add_attempts();
  attempt->set_number(1);
  attempt->set_state(v1::ATTEMPT_STATE_RUNNING);
  v1::RankAssignment* rank = attempt->add_ranks();
  rank->set_job_id("job-b");
  rank->set_rank(1);
  rank->set_worker_id("w1");
  ASSERT_TRUE(store->jobs().PutJob(b, 20, {MakeEvent("job-b", 1), MakeEvent("job-b", 2)}).ok());
  ASSERT_TRUE(store->jobs().PutJob(MakeJob("job-a"), 10, {MakeEvent("job-a", 1)}).ok());
  ASSERT_TRUE(store->jobs().PutJob(MakeJob("job-c"), 30).ok());

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

TEST_P(StoreBackendTest, PutJobReplacesButKeepsFirstSubmitSeq) {
  auto store = Fresh();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->jobs().PutJob(MakeJob("a"), 1, {MakeEvent("a", 1, "submitted")}).ok());
  ASSERT_TRUE(store->jobs().PutJob(MakeJob("b"), 2).ok());
  v1::Job running = MakeJob("a", v1::JOB_STATE_RUNNING);
  running.set_restarts(2);
  // A later write with another submit_seq must not reorder the job.
  ASSERT_TRUE(store->jobs().PutJob(running, 99, {MakeEvent("a", 2, "running")}).ok());

  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  ASSERT_EQ(snapshot->jobs.size(), 2u);
  EXPECT_EQ(snapshot->jobs[0].id(), "a");
  EXPECT_EQ(snapshot->jobs[0].state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(snapshot->jobs[0].restarts(), 2);
  EXPECT_THAT(snapshot->submit_seqs, ElementsAre(1, 2));
  EXPECT_THAT(snapshot->last_event_seqs, ElementsAre(2, 0));
}

TEST_P(StoreBackendTest, PutJobIsAtomicWithItsEvents) {
  auto store = Fresh();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->jobs().PutJob(MakeJob("a"), 1, {MakeEvent("a", 1)}).ok());
  // Seq 1 again: the whole call fails and neither the job nor seq 2 is written.
  absl::Status status = store->jobs().PutJob(MakeJob("a", v1::JOB_STATE_FAILED), 1,
                                             {MakeEvent("a", 2), MakeEvent("a", 1)});
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists) << status;
  EXPECT_THAT(status.message(), HasSubstr("PutJob('a')"));
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->jobs[0].state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(snapshot->last_event_seqs, ElementsAre(1));
  // The store still works after the rollback.
  EXPECT_TRUE(store->jobs().PutJob(MakeJob("a"), 1, {MakeEvent("a", 2)}).ok());
}

TEST_P(StoreBackendTest, RejectsBadInput) {
  auto store = Fresh();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->jobs().PutJob(MakeJob(""), 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->jobs().PutJob(MakeJob("a"), 1, {MakeEvent("other", 1)}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->workers().PutWorker(v1::Worker()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->telemetry().AppendMetrics(MakeMetrics("", 1, 1, 1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->telemetry().AppendLogs(MakeLogs("", 1, 0, {"x"})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StateStore::Open("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(StoreBackendTest, PutWorkerReplaces) {
  auto store = Fresh();
  ASSERT_NE(store, nullptr);
  v1::Worker w;
  w.set_id("w2");
  w.set_hostname("host2");
  (*w.mutable_labels())["zone"] = "a";
  w.add_slots()->set_kind(v1::Slot::KIND_GPU);
  ASSERT_TRUE(store->workers().PutWorker(w).ok());
  v1::Worker w1;
  w1.set_id("w1");
  ASSERT_TRUE(store->workers().PutWorker(w1).ok());
  w.set_state(v1::WORKER_STATE_LOST);
  ASSERT_TRUE(store->workers().PutWorker(w).ok());

  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok());
  ASSERT_EQ(snapshot->workers.size(), 2u);
  EXPECT_EQ(snapshot->workers[0].id(), "w1");
  EXPECT_EQ(snapshot->workers[1].SerializeAsString(), w.SerializeAsString());
}

// A store closed cleanly has let go of its lock (PostgreSQL: the session's
// advisory lock) when the close returns: an open right after it succeeds.
TEST_P(StoreBackendTest, ReopenRightAfterACloseFindsTheLockFree) {
  for (int i = 0; i < 30; ++i) {
    auto store = Reopen();
    ASSERT_NE(store, nullptr) << "open " << i;
  }
}

TEST_P(StoreBackendTest, ReopenFileLoadsEverything) {
  v1::Job job = MakeJob("j1", v1::JOB_STATE_RUNNING);
  job.add_attempts()->set_number(1);
  v1::Worker worker;
  worker.set_id("w1");
  worker.set_address("10.0.0.1");
  {
    auto store = Reopen();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->jobs().PutJob(job, 7, {MakeEvent("j1", 1), MakeEvent("j1", 2)}).ok());
    ASSERT_TRUE(store->jobs().PutJob(MakeJob("j0"), 3).ok());
    ASSERT_TRUE(store->workers().PutWorker(worker).ok());
    ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("j1", 1, 1, 5)).ok());
    ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("j1", 1, 0, {"hello", "world"})).ok());
  }
  auto store = Reopen();
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
  auto metrics = store->telemetry().ListMetrics("j1", 0);
  ASSERT_TRUE(metrics.ok());
  EXPECT_THAT(Steps(*metrics), ElementsAre(1, 2, 3, 4, 5));
  auto logs = store->telemetry().ListLogs("j1", 1, std::nullopt, 0);
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

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
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
  const std::string before = ReadBytes(path);
  auto store = StateStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("not a trainctl database"));
  // Refused before the WAL switch, which would rewrite its header.
  EXPECT_EQ(ReadBytes(path), before) << "the foreign file is left byte for byte";
}

TEST(StateStoreTest, DamagedDatabaseIsRefusedAtOpenAndLeftAsItWas) {
  TempDir dir;
  const std::string path = dir.File("state.db");
  {
    std::unique_ptr<StateStore> store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    // Many small rows: b-tree pages all through the file (no overflow or
    // free pages, whose bytes no check could fault).
    for (int i = 0; i < 400; ++i) {
      const std::string id = absl::StrCat("job-", i);
      std::vector<v1::Event> events;
      for (int e = 1; e <= 10; ++e) events.push_back(MakeEvent(id, e));
      ASSERT_TRUE(store->jobs().PutJob(MakeJob(id), i + 1, events).ok());
    }
  }
  const size_t size = std::filesystem::file_size(path);
  ASSERT_GT(size, 16u * 4096) << "the closed store checkpointed its WAL into the file";
  std::string bytes = ReadBytes(path);
  std::mt19937 rng(7);
  const size_t page = (size / 4096 / 2) * 4096;
  for (size_t i = page; i < page + 4096; ++i) bytes[i] = static_cast<char>(rng());
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  auto store = StateStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("the database is damaged"));
  EXPECT_THAT(store.status().message(), HasSubstr(path));
  EXPECT_EQ(ReadBytes(path), bytes) << "the damaged file is left byte for byte";
  EXPECT_FALSE(std::filesystem::exists(path + "-wal"));
  // The check can be turned off (an operator who knows better).
  StoreOptions unchecked;
  unchecked.integrity_check_timeout = absl::ZeroDuration();
  EXPECT_TRUE(StateStore::Open(path, unchecked).ok());
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

// The check of the database file before SQLite opens it fails (the file
// seam, common/file_env.h): a directory it may not search (EACCES), a
// broken disk (EIO). The open is refused naming the path and the errno's
// text, makes no file for a new database, leaves an existing one as it
// was, and opens once the fault is gone.
TEST(StateStoreTest, AFailedCheckOfTheDatabaseFileIsNamedAndChangesNothing) {
  TempDir dir;
  const std::string existing = dir.File("existing.db");
  ASSERT_NE(OpenOrDie(existing), nullptr);
  const auto size = std::filesystem::file_size(existing);
  const std::string fresh = dir.File("fresh.db");
  for (int err : {EACCES, EIO}) {
    for (const std::string& path : {existing, fresh}) {
      SCOPED_TRACE(path + " " + std::strerror(err));
      FaultFileEnv env;
      env.Inject({FileOp::kStat, path, err});
      StoreOptions options;
      options.file_env = &env;
      auto store = StateStore::Open(path, options);
      ASSERT_FALSE(store.ok());
      EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
      EXPECT_THAT(store.status().message(), HasSubstr(path));
      EXPECT_THAT(store.status().message(), HasSubstr(std::strerror(err)));
      EXPECT_EQ(env.injected(), 1);
    }
    EXPECT_FALSE(std::filesystem::exists(fresh)) << "a refused open made the database";
    EXPECT_EQ(std::filesystem::file_size(existing), size) << "a refused open changed the database";
  }
  EXPECT_NE(OpenOrDie(existing), nullptr);
  EXPECT_NE(OpenOrDie(fresh), nullptr);
}

TEST_P(StoreBackendTest, InjectedWriteFaultFailsExactlyThatWriteAndRollsItBack) {
  auto store = Fresh();
  ASSERT_NE(store, nullptr);
  std::vector<std::string> ops;
  store->SetWriteFaultForTest([&](int64_t write_no, absl::string_view op) {
    ops.emplace_back(op);
    return write_no == 2 || write_no == 5;
  });
  ASSERT_TRUE(store->jobs().PutJob(MakeJob("a"), 1, {MakeEvent("a", 1)}).ok());  // write 1
  absl::Status failed =
      store->jobs().PutJob(MakeJob("a", v1::JOB_STATE_FAILED), 1, {MakeEvent("a", 2)});  // write 2
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("PutJob('a')"));
  EXPECT_THAT(failed.message(), HasSubstr("injected write fault"));
  // Reads do not count and see nothing of the failed write.
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->jobs[0].state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(snapshot->last_event_seqs, ElementsAre(1));
  // The same write succeeds when retried (its event seq was not used).
  ASSERT_TRUE(
      store->jobs().PutJob(MakeJob("a", v1::JOB_STATE_FAILED), 1, {MakeEvent("a", 2)}).ok());  // 3
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("a", 1, 0, 2)).ok());               // 4
  v1::Worker worker;
  worker.set_id("w");
  EXPECT_EQ(store->workers().PutWorker(worker).code(), absl::StatusCode::kUnavailable);  // 5
  EXPECT_TRUE(store->telemetry().AppendLogs(MakeLogs("a", 1, 0, {"x", "y"})).ok());      // 6
  EXPECT_THAT(ops, ElementsAre("PutJob('a')", "PutJob('a')", "PutJob('a')", "AppendMetrics('a')",
                               "PutWorker('w')", HasSubstr("AppendLogs('a'")));
  // Clearing the fault: writes are plain again.
  store->SetWriteFaultForTest(nullptr);
  EXPECT_TRUE(store->workers().PutWorker(worker).ok());
  snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->jobs[0].state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(snapshot->last_event_seqs, ElementsAre(2));
  EXPECT_EQ(snapshot->workers.size(), 1u);
  auto metrics = store->telemetry().ListMetrics("a", 0);
  ASSERT_TRUE(metrics.ok());
  EXPECT_EQ(metrics->size(), 2u);
}

TEST_P(StoreBackendTest, SecondOpenOfTheSameFileIsUnavailable) {
  auto first = Reopen();
  ASSERT_NE(first, nullptr);
  auto second = StateStore::OpenSpec(Persistent());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  first.reset();
  EXPECT_NE(Reopen(), nullptr);
}

TEST(StateStoreTest, CorruptBlobIsReportedNotACrash) {
  TempDir dir;
  const std::string path = dir.File("state.db");
  {
    auto store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->jobs().PutJob(MakeJob("a"), 1, {MakeEvent("a", 1)}).ok());
    ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("a", 1, 1, 1)).ok());
    ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("a", 1, 0, {"x"})).ok());
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
  EXPECT_EQ(store->jobs().ListEvents("a", 0, 0).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store->telemetry().ListMetrics("a", 0).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store->telemetry().ListLogs("a", 1, std::nullopt, 0).status().code(),
            absl::StatusCode::kDataLoss);
  // Writes still work.
  EXPECT_TRUE(store->workers().PutWorker(v1::Worker()).code() ==
              absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("a", 1, 2, 1)).ok());
}

TEST_P(StoreBackendTest, GroupCommitsItsWritesWithTheTelemetrySeqAtomically) {
  {
    auto store = Reopen();
    ASSERT_TRUE(store->jobs().PutJob(MakeJob("j"), 1).ok());
    // Two writes and the seq: one transaction.
    ASSERT_TRUE(store->BeginGroup().ok());
    EXPECT_EQ(store->BeginGroup().code(), absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("j", 1, 1, 3)).ok());
    ASSERT_TRUE(
        store->jobs().PutJob(MakeJob("j", v1::JOB_STATE_RUNNING), 1, {MakeEvent("j", 1)}).ok());
    ASSERT_TRUE(store->CommitGroup("w1", 7).ok());
    // A group that wrote nothing stores no seq (and costs no write).
    ASSERT_TRUE(store->BeginGroup().ok());
    ASSERT_TRUE(store->CommitGroup("w2", 3).ok());
    // A lower seq never lowers the stored one.
    ASSERT_TRUE(store->BeginGroup().ok());
    ASSERT_TRUE(store->telemetry().AppendLogs(MakeLogs("j", 1, 0, {"a"})).ok());
    ASSERT_TRUE(store->CommitGroup("w1", 5).ok());
  }
  auto store = Reopen();
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_THAT(snapshot->telemetry_seqs, ElementsAre(std::pair<std::string, int64_t>("w1", 7)));
  EXPECT_EQ(snapshot->jobs[0].state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(store->telemetry().ListMetrics("j", 0)->size(), 3u);
  EXPECT_EQ(store->telemetry().ListLogs("j", 1, std::nullopt, 0)->size(), 1u);
}

TEST_P(StoreBackendTest, GroupRollbackDiscardsEverythingAndAFailedWriteOnlyItself) {
  StoreOptions options;
  options.max_metric_points_per_job = 5;
  auto store = Reopen(options);
  ASSERT_TRUE(store->jobs().PutJob(MakeJob("j"), 1, {MakeEvent("j", 1)}).ok());
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("j", 1, 1, 2)).ok());

  ASSERT_TRUE(store->BeginGroup().ok());
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("j", 1, 3, 3)).ok());
  // A refused write (event seq already stored) undoes only itself.
  EXPECT_EQ(
      store->jobs().PutJob(MakeJob("j", v1::JOB_STATE_RUNNING), 1, {MakeEvent("j", 1)}).code(),
      absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(Steps(*store->telemetry().ListMetrics("j", 0)), ElementsAre(1, 2, 3, 4, 5));
  store->RollbackGroup();
  store->RollbackGroup();  // No group: a no-op.
  EXPECT_THAT(Steps(*store->telemetry().ListMetrics("j", 0)), ElementsAre(1, 2));

  // Retention still counts right after the rollback (its cached counts went).
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("j", 1, 10, 4)).ok());
  EXPECT_THAT(Steps(*store->telemetry().ListMetrics("j", 0)), ElementsAre(2, 10, 11, 12, 13));
  EXPECT_EQ(store->CommitGroup("w", 1).code(), absl::StatusCode::kFailedPrecondition);
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_TRUE(snapshot->telemetry_seqs.empty());
  EXPECT_EQ(snapshot->jobs[0].state(), v1::JOB_STATE_PENDING);
}

TEST_P(StoreBackendTest, OwnerNumbersAreGivenOnceAndSurviveAReopen) {
  {
    auto store = Reopen();
    ASSERT_TRUE(store->auth().PutOwnerNumber("alice", 1).ok());
    ASSERT_TRUE(store->auth().PutOwnerNumber("", 2).ok())
        << "jobs submitted without tokens have owner ''";
    EXPECT_TRUE(absl::IsAlreadyExists(store->auth().PutOwnerNumber("bob", 1)))
        << "a number is given once";
    EXPECT_TRUE(absl::IsAlreadyExists(store->auth().PutOwnerNumber("alice", 3)))
        << "an owner has one number";
    EXPECT_TRUE(absl::IsInvalidArgument(store->auth().PutOwnerNumber("carol", 0)));
  }
  auto store = Reopen();
  auto numbers = store->auth().LoadOwnerNumbers();
  ASSERT_TRUE(numbers.ok()) << numbers.status();
  EXPECT_THAT(*numbers, ElementsAre(std::pair<std::string, int64_t>("alice", 1),
                                    std::pair<std::string, int64_t>("", 2)));
}

TEST(StateStoreTest, SchemaVersion1MigratesToTheTelemetrySeqTable) {
  TempDir dir;
  const std::string path = dir.File("state.db");
  {
    auto store = OpenOrDie(path);
    ASSERT_TRUE(store->jobs().PutJob(MakeJob("old"), 1).ok());
  }
  // What a coordinator before telemetry seqs left behind.
  // (Nor the later tables: tokens and worker_bindings came with version 3,
  // revoked_workers with 4, owner_numbers with 5, queues with 6, leader and
  // the leader_epoch columns with 7, code archives and jobs.code_digest
  // with 8, fair_share with 9, attempt_usage with 10.)
  RawExec(path,
          "DROP TABLE attempt_usage; DROP TABLE fair_share; DROP TABLE code_archives; DROP INDEX "
          "jobs_by_code_digest; ALTER TABLE jobs DROP COLUMN code_digest; "
          "DROP TABLE telemetry_seqs; DROP TABLE tokens; DROP TABLE worker_bindings; "
          "DROP TABLE revoked_workers; DROP TABLE owner_numbers; DROP TABLE queues; "
          "DROP TABLE leader; ALTER TABLE jobs DROP COLUMN leader_epoch; "
          "ALTER TABLE events DROP COLUMN leader_epoch; PRAGMA user_version=1");
  auto store = OpenOrDie(path);
  ASSERT_TRUE(store->BeginGroup().ok());
  ASSERT_TRUE(store->telemetry().AppendMetrics(MakeMetrics("old", 1, 1, 1)).ok());
  ASSERT_TRUE(store->CommitGroup("w", 9).ok());
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  ASSERT_EQ(snapshot->jobs.size(), 1u);
  EXPECT_THAT(snapshot->telemetry_seqs, ElementsAre(std::pair<std::string, int64_t>("w", 9)));
  // Migrated on to the current version: tokens and worker bindings work.
  v1::Token token;
  token.set_id("t-1");
  ASSERT_TRUE(store->auth().PutToken(token, std::string(64, 'a')).ok());
  ASSERT_TRUE(store->auth().PutWorkerBinding("w", "t-1").ok());
  ASSERT_TRUE(store->auth().PutWorkerBinding("w", "t-2").ok()) << "a binding is never replaced";
  auto tokens = store->auth().LoadTokens();
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 1u);
  EXPECT_EQ((*tokens)[0].secret_hash, std::string(64, 'a'));
  EXPECT_THAT(*store->auth().LoadWorkerBindings(),
              ElementsAre(std::pair<std::string, std::string>("w", "t-1")));
}

TEST_P(StoreBackendTest, CodeArchivesRoundTripAndReadInRanges) {
  {
    auto store = Reopen();
    EXPECT_FALSE(store->code_archives().CodeSize(kDigestA)->has_value());
    ASSERT_TRUE(store->code_archives()
                    .PutCode(kDigestA, std::string("ab\0cdefgh", 9), absl::FromUnixSeconds(100))
                    .ok());
    ASSERT_TRUE(
        store->code_archives().PutCode(kDigestA, "ignored", absl::FromUnixSeconds(200)).ok())
        << "a second put keeps the bytes";
  }
  auto store = Reopen();
  EXPECT_EQ(*store->code_archives().CodeSize(kDigestA), 9);
  EXPECT_EQ(*store->code_archives().ReadCode(kDigestA, 0, 1 << 20), std::string("ab\0cdefgh", 9));
  EXPECT_EQ(*store->code_archives().ReadCode(kDigestA, 2, 3), std::string("\0cd", 3));
  EXPECT_EQ(*store->code_archives().ReadCode(kDigestA, 7, 10), "gh");
  EXPECT_EQ(*store->code_archives().ReadCode(kDigestA, 9, 10), "");
  EXPECT_TRUE(absl::IsNotFound(store->code_archives().ReadCode(kDigestB, 0, 10).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store->code_archives().ReadCode(kDigestA, -1, 10).status()));
  EXPECT_TRUE(
      absl::IsNotFound(store->code_archives().TouchCode(kDigestB, absl::FromUnixSeconds(1))));
}

TEST_P(StoreBackendTest, UnreferencedCodeGoesAfterTheCutoffAndNamedCodeStays) {
  auto store = Fresh();
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  ASSERT_TRUE(store->code_archives().PutCode(kDigestA, "named", t0).ok());
  ASSERT_TRUE(store->code_archives().PutCode(kDigestB, "orphan", t0).ok());
  ASSERT_TRUE(store->code_archives().PutCode(kDigestC, "recent", t0 + absl::Hours(2)).ok());
  v1::Job job = MakeJob("j");
  job.mutable_spec()->mutable_command()->mutable_code()->set_digest(kDigestA);
  ASSERT_TRUE(store->jobs().PutJob(job, 1).ok());
  // Before the cutoff: nothing goes.
  EXPECT_EQ(*store->code_archives().DeleteUnreferencedCode(t0), 0);
  EXPECT_EQ(*store->code_archives().DeleteUnreferencedCode(t0 + absl::Hours(1)), 1);
  EXPECT_TRUE(store->code_archives().CodeSize(kDigestA)->has_value()) << "a stored job names it";
  EXPECT_FALSE(store->code_archives().CodeSize(kDigestB)->has_value());
  EXPECT_TRUE(store->code_archives().CodeSize(kDigestC)->has_value())
      << "uploaded after the cutoff";
  // A touch restarts the grace; a job that stops naming it frees it.
  ASSERT_TRUE(store->code_archives().TouchCode(kDigestC, t0 + absl::Hours(5)).ok());
  EXPECT_EQ(*store->code_archives().DeleteUnreferencedCode(t0 + absl::Hours(4)), 0);
  job.mutable_spec()->mutable_command()->clear_code();
  ASSERT_TRUE(store->jobs().PutJob(job, 1).ok());
  EXPECT_EQ(*store->code_archives().DeleteUnreferencedCode(t0 + absl::Hours(6)), 2);
}

TEST_P(StoreBackendTest, CodeWritesGoThroughTheWriteFault) {
  auto store = Fresh();
  store->SetWriteFaultForTest([](int64_t, absl::string_view) { return true; });
  EXPECT_TRUE(
      absl::IsUnavailable(store->code_archives().PutCode(kDigestA, "x", absl::FromUnixSeconds(1))));
  store->SetWriteFaultForTest(nullptr);
  EXPECT_FALSE(store->code_archives().CodeSize(kDigestA)->has_value())
      << "a failed put stores nothing";
}

TEST_P(StoreBackendTest, QueuesRoundTripReplaceDeleteAndSurviveAReopen) {
  {
    auto store = Reopen();
    v1::Queue a;
    a.set_name("a");
    a.set_nominal_gpu(8);
    a.set_cohort("research");
    a.set_max_job_size(4);
    a.set_default_priority(5);
    a.mutable_create_time()->set_seconds(1700000000);
    v1::Queue b;
    b.set_name("b");  // nominals unset: unlimited
    ASSERT_TRUE(store->queues().PutQueue(b).ok());
    ASSERT_TRUE(store->queues().PutQueue(a).ok());
    a.set_nominal_gpu(2);
    ASSERT_TRUE(store->queues().PutQueue(a).ok()) << "a put replaces";
    v1::Queue c;
    c.set_name("c");
    ASSERT_TRUE(store->queues().PutQueue(c).ok());
    ASSERT_TRUE(store->queues().DeleteQueue("c").ok());
    ASSERT_TRUE(store->queues().DeleteQueue("never-there").ok()) << "absent is fine";
    EXPECT_TRUE(absl::IsInvalidArgument(store->queues().PutQueue(v1::Queue())));
  }
  auto store = Reopen();
  auto queues = store->queues().LoadQueues();
  ASSERT_TRUE(queues.ok()) << queues.status();
  ASSERT_EQ(queues->size(), 2u);
  EXPECT_EQ((*queues)[0].name(), "a");
  EXPECT_EQ((*queues)[0].nominal_gpu(), 2);
  EXPECT_FALSE((*queues)[0].has_nominal_cpu()) << "unset (unlimited) stays unset";
  EXPECT_EQ((*queues)[0].cohort(), "research");
  EXPECT_EQ((*queues)[0].max_job_size(), 4);
  EXPECT_EQ((*queues)[0].default_priority(), 5);
  EXPECT_EQ((*queues)[0].create_time().seconds(), 1700000000);
  EXPECT_EQ((*queues)[1].name(), "b");
  EXPECT_FALSE((*queues)[1].has_nominal_gpu());
}

TEST_P(StoreBackendTest, FairShareUsageRoundTripsReplacesAndSurvivesAReopen) {
  {
    auto store = Reopen();
    auto none = store->queues().LoadFairShare();
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_EQ(none->queues_size(), 0) << "nothing stored: an empty snapshot";
    v1::FairShareSnapshot first;
    first.mutable_as_of()->set_seconds(1700000000);
    v1::FairShareUsage* a = first.add_queues();
    a->set_queue("a");
    (*a->mutable_owners())["alice"].set_gpu_slot_seconds(1234.5);
    ASSERT_TRUE(store->queues().PutFairShare(first).ok());
    v1::FairShareSnapshot second = first;
    second.mutable_as_of()->set_seconds(1700000010);
    (*second.mutable_queues(0)->mutable_owners())["bob"].set_cpu_slot_seconds(0.25);
    v1::FairShareUsage* b = second.add_queues();
    b->set_queue("b");
    (*b->mutable_owners())[""].set_gpu_slot_seconds(7);
    ASSERT_TRUE(store->queues().PutFairShare(second).ok()) << "a put replaces";
  }
  auto store = Reopen();
  auto got = store->queues().LoadFairShare();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->as_of().seconds(), 1700000010);
  ASSERT_EQ(got->queues_size(), 2);
  EXPECT_EQ(got->queues(0).queue(), "a");
  EXPECT_EQ(got->queues(0).owners().at("alice").gpu_slot_seconds(), 1234.5);
  EXPECT_EQ(got->queues(0).owners().at("bob").cpu_slot_seconds(), 0.25);
  EXPECT_EQ(got->queues(1).owners().at("").gpu_slot_seconds(), 7);
}

TEST_P(StoreBackendTest, QueueWritesGoThroughTheWriteFault) {
  auto store = Fresh();
  std::vector<std::string> ops;
  store->SetWriteFaultForTest([&](int64_t, absl::string_view op) {
    ops.emplace_back(op);
    return true;
  });
  v1::Queue a;
  a.set_name("a");
  EXPECT_TRUE(absl::IsUnavailable(store->queues().PutQueue(a)));
  EXPECT_TRUE(absl::IsUnavailable(store->queues().DeleteQueue("a")));
  store->SetWriteFaultForTest(nullptr);
  EXPECT_THAT(ops, ElementsAre("PutQueue('a')", "DeleteQueue('a')"));
  EXPECT_TRUE(store->queues().LoadQueues()->empty()) << "a failed put stores nothing";
}

TEST_P(StoreBackendTest, ATokensQueuesPersist) {
  {
    auto store = Reopen();
    v1::Token token;
    token.set_id("t-1");
    token.set_role(v1::ROLE_SUBMITTER);
    token.add_queues("a");
    token.add_queues("b");
    ASSERT_TRUE(store->auth().PutToken(token, std::string(64, 'a')).ok());
  }
  auto store = Reopen();
  auto tokens = store->auth().LoadTokens();
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 1u);
  EXPECT_THAT((*tokens)[0].token.queues(), ElementsAre("a", "b"));
}

TEST(StateStoreTest, SchemaVersion6MigratesToTheLeaderTableAndEpochColumns) {
  TempDir dir;
  const std::string path = dir.File("state.db");
  {
    auto store = OpenOrDie(path);
    ASSERT_TRUE(store->jobs().PutJob(MakeJob("old"), 1, {MakeEvent("old", 1)}).ok());
  }
  // What a coordinator before active/standby left behind.
  RawExec(path,
          "DROP TABLE attempt_usage; DROP TABLE fair_share; DROP TABLE code_archives; DROP INDEX "
          "jobs_by_code_digest; ALTER TABLE jobs DROP COLUMN code_digest; "
          "DROP TABLE leader; ALTER TABLE jobs DROP COLUMN leader_epoch; "
          "ALTER TABLE events DROP COLUMN leader_epoch; PRAGMA user_version=6");
  auto store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->jobs().PutJob(MakeJob("new"), 2, {MakeEvent("new", 1)}).ok());
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  ASSERT_EQ(snapshot->jobs.size(), 2u);
  auto events = store->jobs().ListEvents("old", 0, 0);
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_EQ(events->size(), 1u);
}

TEST(StateStoreTest, SchemaVersion5MigratesToTheQueuesTable) {
  TempDir dir;
  const std::string path = dir.File("state.db");
  {
    auto store = OpenOrDie(path);
    ASSERT_TRUE(store->jobs().PutJob(MakeJob("old"), 1).ok());
  }
  // What a coordinator before queues left behind.
  RawExec(path,
          "DROP TABLE attempt_usage; DROP TABLE fair_share; DROP TABLE code_archives; DROP INDEX "
          "jobs_by_code_digest; ALTER TABLE jobs DROP COLUMN code_digest; "
          "DROP TABLE queues; DROP TABLE leader; ALTER TABLE jobs DROP COLUMN leader_epoch; "
          "ALTER TABLE events DROP COLUMN leader_epoch; PRAGMA user_version=5");
  auto store = OpenOrDie(path);
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  ASSERT_EQ(snapshot->jobs.size(), 1u);
  EXPECT_TRUE(store->queues().LoadQueues()->empty());
  v1::Queue a;
  a.set_name("a");
  ASSERT_TRUE(store->queues().PutQueue(a).ok());
  EXPECT_EQ(store->queues().LoadQueues()->size(), 1u);
}

TEST(StateStoreTest, SchemaVersion7MigratesToCodeArchives) {
  TempDir dir;
  const std::string path = dir.File("state.db");
  {
    auto store = OpenOrDie(path);
    ASSERT_TRUE(store->jobs().PutJob(MakeJob("old"), 1).ok());
  }
  // What a coordinator before code archives left behind.
  RawExec(path,
          "DROP TABLE attempt_usage; DROP TABLE fair_share; DROP TABLE code_archives; DROP INDEX "
          "jobs_by_code_digest; "
          "ALTER TABLE jobs DROP COLUMN code_digest; PRAGMA user_version=7");
  auto store = OpenOrDie(path);
  ASSERT_EQ(store->LoadAll()->jobs.size(), 1u);
  ASSERT_TRUE(store->code_archives().PutCode(kDigestA, "abc", absl::FromUnixSeconds(1)).ok());
  EXPECT_EQ(*store->code_archives().CodeSize(kDigestA), 3);
  // The old job names no code: it keeps nothing.
  EXPECT_EQ(*store->code_archives().DeleteUnreferencedCode(absl::FromUnixSeconds(2)), 1);
}

TEST(StateStoreTest, SchemaVersion8MigratesToTheFairShareTable) {
  TempDir dir;
  const std::string path = dir.File("state.db");
  {
    auto store = OpenOrDie(path);
    ASSERT_TRUE(store->jobs().PutJob(MakeJob("old"), 1).ok());
  }
  // What a coordinator before stored fair share left behind.
  RawExec(path, "DROP TABLE attempt_usage; DROP TABLE fair_share; PRAGMA user_version=8");
  auto store = OpenOrDie(path);
  ASSERT_EQ(store->LoadAll()->jobs.size(), 1u);
  EXPECT_EQ(store->queues().LoadFairShare()->queues_size(), 0);
  v1::FairShareSnapshot usage;
  usage.add_queues()->set_queue("a");
  ASSERT_TRUE(store->queues().PutFairShare(usage).ok());
  EXPECT_EQ(store->queues().LoadFairShare()->queues_size(), 1);
}

v1::AttemptUsage Usage(const std::string& job, int attempt, int64_t start_s, int64_t end_s) {
  v1::AttemptUsage u;
  u.set_job_id(job);
  u.set_attempt(attempt);
  u.set_owner("alice");
  u.set_queue("research");
  u.set_kind("cpu");
  u.set_slots(2);
  u.mutable_start_time()->set_seconds(start_s);
  u.mutable_end_time()->set_seconds(end_s);
  u.set_wall_seconds(static_cast<double>(end_s - start_s));
  u.set_cpu_seconds(3.25);
  u.set_peak_memory_bytes(int64_t{5} << 30);
  u.set_ranks_measured(2);
  return u;
}

TEST_P(StoreBackendTest, AttemptUsageRoundTripsReplacesFiltersByWindowAndSurvivesAReopen) {
  const absl::Time t0 = absl::FromUnixSeconds(1700000000);
  {
    auto store = Reopen();
    ASSERT_TRUE(store->usage().PutAttemptUsage(Usage("j-b", 1, 1700000100, 1700000200)).ok());
    ASSERT_TRUE(store->usage().PutAttemptUsage(Usage("j-a", 2, 1700000000, 1700000050)).ok());
    ASSERT_TRUE(store->usage().PutAttemptUsage(Usage("j-a", 1, 1700000000, 1700000010)).ok());
    v1::AttemptUsage longer = Usage("j-b", 1, 1700000100, 1700000300);
    longer.set_state("preempted");
    ASSERT_TRUE(store->usage().PutAttemptUsage(longer).ok()) << "a put replaces the attempt's row";
    v1::AttemptUsage bad = Usage("", 1, 1, 2);
    EXPECT_TRUE(absl::IsInvalidArgument(store->usage().PutAttemptUsage(bad)));
    bad = Usage("j-c", 0, 1, 2);
    EXPECT_TRUE(absl::IsInvalidArgument(store->usage().PutAttemptUsage(bad)));
    bad = Usage("j-c", 1, 1, 2);
    bad.clear_end_time();
    EXPECT_TRUE(absl::IsInvalidArgument(store->usage().PutAttemptUsage(bad)));
  }
  auto store = Reopen();
  auto all = store->usage().LoadAttemptUsage(absl::InfinitePast(), absl::InfiniteFuture());
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 3u);
  // By start, then job id, then attempt.
  EXPECT_EQ((*all)[0].job_id(), "j-a");
  EXPECT_EQ((*all)[0].attempt(), 1);
  EXPECT_EQ((*all)[1].attempt(), 2);
  EXPECT_EQ((*all)[2].job_id(), "j-b");
  EXPECT_EQ((*all)[2].end_time().seconds(), 1700000300);
  EXPECT_EQ((*all)[2].state(), "preempted");
  EXPECT_EQ((*all)[2].cpu_seconds(), 3.25);
  EXPECT_EQ((*all)[2].peak_memory_bytes(), int64_t{5} << 30);
  // The window: rows that end after since and start before until.
  auto late = store->usage().LoadAttemptUsage(t0 + absl::Seconds(50), absl::InfiniteFuture());
  ASSERT_TRUE(late.ok()) << late.status();
  ASSERT_EQ(late->size(), 1u) << "j-a/2 ended at since exactly: outside";
  EXPECT_EQ((*late)[0].job_id(), "j-b");
  auto early = store->usage().LoadAttemptUsage(absl::InfinitePast(), t0 + absl::Seconds(100));
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_EQ(early->size(), 2u) << "j-b/1 started at until exactly: outside";
}

TEST_P(StoreBackendTest, AttemptUsageWritesGoThroughTheWriteFaultAndAGroup) {
  auto store = Fresh();
  store->SetWriteFaultForTest(
      [](int64_t, absl::string_view op) { return absl::StartsWith(op, "PutAttemptUsage"); });
  EXPECT_TRUE(absl::IsUnavailable(store->usage().PutAttemptUsage(Usage("j", 1, 1, 2))));
  store->SetWriteFaultForTest(nullptr);
  EXPECT_TRUE(
      store->usage().LoadAttemptUsage(absl::InfinitePast(), absl::InfiniteFuture())->empty());
  // Inside a group: stored with the group, gone with its rollback.
  ASSERT_TRUE(store->BeginGroup().ok());
  ASSERT_TRUE(store->usage().PutAttemptUsage(Usage("j", 1, 1, 2)).ok());
  store->RollbackGroup();
  EXPECT_TRUE(
      store->usage().LoadAttemptUsage(absl::InfinitePast(), absl::InfiniteFuture())->empty());
  ASSERT_TRUE(store->BeginGroup().ok());
  ASSERT_TRUE(store->usage().PutAttemptUsage(Usage("j", 1, 1, 2)).ok());
  ASSERT_TRUE(store->CommitGroup("w", 1).ok());
  EXPECT_EQ(store->usage().LoadAttemptUsage(absl::InfinitePast(), absl::InfiniteFuture())->size(),
            1u);
}

TEST(StateStoreTest, SchemaVersion9MigratesToTheAttemptUsageTable) {
  TempDir dir;
  const std::string path = dir.File("state.db");
  {
    auto store = OpenOrDie(path);
    ASSERT_TRUE(store->jobs().PutJob(MakeJob("old"), 1).ok());
  }
  // What a coordinator before per-attempt accounting left behind.
  RawExec(path, "DROP TABLE attempt_usage; PRAGMA user_version=9");
  auto store = OpenOrDie(path);
  ASSERT_EQ(store->LoadAll()->jobs.size(), 1u);
  EXPECT_TRUE(
      store->usage().LoadAttemptUsage(absl::InfinitePast(), absl::InfiniteFuture())->empty());
  ASSERT_TRUE(store->usage().PutAttemptUsage(Usage("old", 1, 10, 20)).ok());
  EXPECT_EQ(store->usage().LoadAttemptUsage(absl::InfinitePast(), absl::InfiniteFuture())->size(),
            1u);
}

// --- the store spec, and what only PostgreSQL has ---------------------------

TEST(StateStoreTest, SpecThatIsNeitherSqliteNorPostgresIsInvalidArgument) {
  auto store = StateStore::OpenSpec("mysql://db");
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument) << store.status();
  EXPECT_EQ(StateStore::OpenSpec("sqlite:").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StateStore::DescribeSpec("postgresql://alice:s3cret@db.example:5433/jobs"),
            "postgresql://alice@db.example:5433/jobs");
}

TEST(StateStoreTest, UnreachablePostgresIsUnavailableNamingTheHostNeverThePassword) {
  // Port 1 on loopback: nothing listens there.
  auto store = StateStore::OpenSpec("postgresql://alice:s3cret@127.0.0.1:1/jobs?connect_timeout=5");
  ASSERT_FALSE(store.ok());
  if (absl::StrContains(store.status().message(), "built without libpq")) {
    GTEST_SKIP() << store.status();
  }
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("127.0.0.1"));
  EXPECT_THAT(store.status().message(), HasSubstr("jobs"));
  EXPECT_THAT(std::string(store.status().message()), ::testing::Not(HasSubstr("s3cret")));
}

// The PostgreSQL server and database of StoreBackendTest, without the
// SQLite variant.
class PostgresStoreTest : public StoreBackendTest {};
INSTANTIATE_TEST_SUITE_P(Backends, PostgresStoreTest, ::testing::Values(Backend::kPostgres),
                         BackendName);

// (SQLite: ForeignSqliteDatabaseIsRefused.)
TEST_P(PostgresStoreTest, DatabaseWithOtherTablesIsRefused) {
  PgTestServer& pg = PgServer();
  ASSERT_TRUE(pg.AdminExec(pg.last_database(), "CREATE TABLE invoices (id BIGINT)").ok());
  auto store = StateStore::OpenSpec(Persistent());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("not a trainctl database"));
}

TEST_P(PostgresStoreTest, LostConnectionFailsOneWriteThenReconnects) {
  PgTestServer& pg = PgServer();
  auto store = Reopen();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->jobs().PutJob(MakeJob("a"), 1, {MakeEvent("a", 1)}).ok());
  ASSERT_TRUE(pg.AdminExec("postgres",
                           absl::StrCat("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                        "WHERE datname = '",
                                        pg.last_database(), "'"))
                  .ok());
  absl::Status lost = store->jobs().PutJob(MakeJob("b"), 2);
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable) << lost;
  EXPECT_TRUE(StateStore::IsWriteFailure(lost));
  // The next write reconnects (and takes the lock again).
  absl::Status retried = store->jobs().PutJob(MakeJob("b"), 2, {MakeEvent("b", 1)});
  ASSERT_TRUE(retried.ok()) << retried;
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->jobs.size(), 2u);
  // Still the only store on the database.
  EXPECT_EQ(StateStore::OpenSpec(Persistent()).status().code(), absl::StatusCode::kUnavailable);
}

TRAINCTL_STORE_BACKENDS(StoreBackendTest);

}  // namespace
}  // namespace trainctl::coordinator
