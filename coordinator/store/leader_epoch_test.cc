// Active/standby on PostgreSQL (state_store.h, StoreOptions): each store
// that takes the lock takes the next leader epoch and records its address;
// a store that lost its session to another coordinator, or whose epoch is
// no longer the stored one, is deposed and writes nothing; the session's
// lease frees the lock of a holder that stops talking. Real PostgreSQL
// (pg_test_server.h); skipped without it.
#include <atomic>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/store/state_store_test_support.h"

namespace trainctl::coordinator {
namespace {

using namespace store_testing;  // NOLINT: the tests' shared helpers

class LeaderEpochTest : public StoreBackendTest {
 protected:
  static StoreOptions Leader(const std::string& address,
                             absl::Duration lease = absl::ZeroDuration()) {
    StoreOptions o;
    o.leader_address = address;
    o.leader_lease = lease;
    return o;
  }
  std::string Scalar(const std::string& sql) {
    absl::StatusOr<std::string> v = PgServer().AdminQuery(PgServer().last_database(), sql);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : "(error)";
  }
};
INSTANTIATE_TEST_SUITE_P(Backends, LeaderEpochTest, ::testing::Values(Backend::kPostgres),
                         BackendName);

// Counts on_deposed calls (from whichever thread finds it).
struct Told {
  absl::Mutex mu;
  int calls = 0;
  std::string why;
  std::function<void(const absl::Status&)> Hook() {
    return [this](const absl::Status& s) {
      absl::MutexLock lock(&mu);
      ++calls;
      why = std::string(s.message());
    };
  }
  int count() {
    absl::MutexLock lock(&mu);
    return calls;
  }
};

TEST_P(LeaderEpochTest, EachActiveStoreTakesTheNextEpochAndAStandbySeesTheHolder) {
  auto first = OpenSpecOrDie(Persistent(), Leader("coord-a:7070"));
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->leader_epoch(), 1);
  ASSERT_TRUE(first->jobs().PutJob(MakeJob("a"), 1, {MakeEvent("a", 1)}).ok());

  StoreLeader holder;
  auto refused = StateStore::OpenSpec(Persistent(), Leader("coord-b:7070"), &holder);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_EQ(holder.epoch, 1);
  EXPECT_EQ(holder.address, "coord-a:7070");

  first.reset();
  auto second = OpenSpecOrDie(Persistent(), Leader("coord-b:7070"));
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->leader_epoch(), 2);
  ASSERT_TRUE(second->jobs().PutJob(MakeJob("b"), 2, {MakeEvent("b", 1)}).ok());
  EXPECT_EQ(Scalar("SELECT address FROM leader"), "coord-b:7070");
  // Every jobs and events row carries the epoch of the coordinator that wrote it.
  EXPECT_EQ(Scalar("SELECT leader_epoch FROM jobs WHERE id = 'a'"), "1");
  EXPECT_EQ(Scalar("SELECT leader_epoch FROM events WHERE job_id = 'a'"), "1");
  EXPECT_EQ(Scalar("SELECT leader_epoch FROM jobs WHERE id = 'b'"), "2");
  EXPECT_EQ(Scalar("SELECT leader_epoch FROM events WHERE job_id = 'b'"), "2");
  auto snapshot = second->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->jobs.size(), 2u);
}

TEST_P(LeaderEpochTest, AStoreWhoseLockWasTakenIsDeposedForGoodAndSaysSoOnce) {
  Told told;
  StoreOptions a = Leader("coord-a:7070");
  a.on_deposed = told.Hook();
  auto old = OpenSpecOrDie(Persistent(), a);
  ASSERT_NE(old, nullptr);
  ASSERT_TRUE(old->jobs().PutJob(MakeJob("a"), 1).ok());
  // Its session is cut; another coordinator takes the lock meanwhile.
  ASSERT_TRUE(PgServer().TerminateSessions(PgServer().last_database()).ok());
  auto fresh = OpenSpecOrDie(Persistent(), Leader("coord-b:7070"));
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(fresh->leader_epoch(), 2);

  // The first use finds the connection gone (Unavailable, as any lost
  // connection); the next one reconnects and finds the lock taken.
  absl::Status lost = old->jobs().PutJob(MakeJob("late"), 2, {MakeEvent("late", 1)});
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable) << lost;
  absl::Status late = old->jobs().PutJob(MakeJob("late"), 2, {MakeEvent("late", 1)});
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_THAT(late.message(), HasSubstr("deposed"));
  EXPECT_EQ(told.count(), 1);
  // Every later write fails the same way, groups too, without a second call.
  EXPECT_EQ(old->jobs().PutJob(MakeJob("later"), 3).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(old->BeginGroup().code(), absl::StatusCode::kFailedPrecondition);
  v1::Worker worker;
  worker.set_id("w");
  EXPECT_EQ(old->workers().PutWorker(worker).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(told.count(), 1);
  EXPECT_EQ(old->deposed().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(fresh->deposed().ok());

  EXPECT_EQ(Scalar("SELECT COUNT(*) FROM jobs"), "1");
  EXPECT_EQ(Scalar("SELECT COUNT(*) FROM workers"), "0");
}

TEST_P(LeaderEpochTest, AStaleEpochIsFencedEvenWhenTheLockIsFreeAgain) {
  Told told;
  StoreOptions a = Leader("coord-a:7070");
  a.on_deposed = told.Hook();
  auto old = OpenSpecOrDie(Persistent(), a);
  ASSERT_NE(old, nullptr);
  ASSERT_TRUE(PgServer().TerminateSessions(PgServer().last_database()).ok());
  {
    // A newer coordinator came and went (killed): the lock is free again,
    // but the stored epoch is 2.
    auto newer = OpenSpecOrDie(Persistent(), Leader("coord-b:7070"));
    ASSERT_NE(newer, nullptr);
    EXPECT_EQ(newer->leader_epoch(), 2);
  }
  // The old one's first write finds its connection gone; the next one
  // reconnects and takes the lock, and its epoch check (in the same
  // transaction as the write) refuses it.
  absl::Status lost = old->jobs().PutJob(MakeJob("late"), 1, {MakeEvent("late", 1)});
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable) << lost;
  absl::Status late = old->jobs().PutJob(MakeJob("late"), 1, {MakeEvent("late", 1)});
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_THAT(late.message(), HasSubstr("was deposed by epoch 2"));
  EXPECT_THAT(late.message(), HasSubstr("coord-b:7070"));
  EXPECT_EQ(told.count(), 1);
  EXPECT_EQ(Scalar("SELECT COUNT(*) FROM jobs"), "0");
  EXPECT_EQ(Scalar("SELECT COUNT(*) FROM events"), "0");
}

TEST_P(LeaderEpochTest, TheLeaseEndsTheSessionOfAHolderSilentInATransaction) {
  Told told;
  StoreOptions a = Leader("coord-a:7070", absl::Seconds(1));
  a.on_deposed = told.Hook();
  auto old = OpenSpecOrDie(Persistent(), a);
  ASSERT_NE(old, nullptr);
  // The holder goes silent for 4 s inside a write transaction (the fault
  // hook runs before the commit, with the store's lock held).
  old->SetWriteFaultForTest([](int64_t, absl::string_view) {
    absl::SleepFor(absl::Seconds(4));
    return false;
  });
  absl::Status late;
  std::thread writer(
      [&] { late = old->jobs().PutJob(MakeJob("late"), 1, {MakeEvent("late", 1)}); });
  // A standby gets the lock once PostgreSQL ended the silent session.
  std::unique_ptr<StateStore> fresh;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (fresh == nullptr && absl::Now() < deadline) {
    auto opened = StateStore::OpenSpec(Persistent(), Leader("coord-b:7070"));
    if (opened.ok()) {
      fresh = std::move(opened).value();
    } else {
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  writer.join();
  ASSERT_NE(fresh, nullptr) << "the silent holder kept the lock";
  EXPECT_FALSE(late.ok());
  // The old one's lease ping finds its session gone and the lock taken.
  while (told.count() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(told.count(), 1);
  EXPECT_EQ(old->jobs().PutJob(MakeJob("later"), 2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Scalar("SELECT COUNT(*) FROM jobs"), "0");
}

TEST_P(LeaderEpochTest, ThePingKeepsAnIdleHolderAlivePastItsLease) {
  Told told;
  StoreOptions a = Leader("coord-a:7070", absl::Seconds(1));
  a.on_deposed = told.Hook();
  auto holder = OpenSpecOrDie(Persistent(), a);
  ASSERT_NE(holder, nullptr);
  absl::SleepFor(absl::Seconds(3));  // idle for three leases: what is tested
  EXPECT_EQ(StateStore::OpenSpec(Persistent(), Leader("coord-b:7070")).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(holder->jobs().PutJob(MakeJob("a"), 1).ok());
  EXPECT_EQ(told.count(), 0);
  EXPECT_EQ(holder->leader_epoch(), 1);
}

TEST(LeaderEpochSqliteTest, SqliteHasNoEpochAndStillWrites) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("state.db"));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->leader_epoch(), 0);
  EXPECT_TRUE(store->jobs().PutJob(MakeJob("a"), 1, {MakeEvent("a", 1)}).ok());
  store.reset();
  store = OpenOrDie(dir.File("state.db"));
  ASSERT_NE(store, nullptr);
  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->jobs.size(), 1u);
}

}  // namespace
}  // namespace trainctl::coordinator
