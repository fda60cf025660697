// WorkerRegistry's leases under --max-heartbeats-per-sec: a fleet past the
// bound is given longer heartbeat intervals and leases, workers already
// registered learn them from a heartbeat's answer, and a shrinking fleet
// gets its shorter terms back. The registry is driven from the test thread
// (it is the loop), on a fake clock and a real SQLite store.
#include "coordinator/workers/worker_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/temp_dir.h"

namespace trainctl::coordinator {
namespace {

using ::testing::UnorderedElementsAre;

class Channel : public WorkerChannel {
 public:
  bool Send(const v1::CoordinatorMessage&) override { return !closed; }
  void Close(const absl::Status&) override { closed = true; }
  bool closed = false;
};

class WorkerRegistryTermsTest : public ::testing::Test {
 protected:
  void Open(int max_heartbeats_per_sec) {
    auto s = StateStore::Open(dir_.File("state.db"));
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    RegistryOptions o;
    o.heartbeat_interval = absl::Seconds(1);
    o.lease_timeout = absl::Seconds(3);
    o.disconnect_grace = absl::Seconds(1);
    o.max_heartbeats_per_sec = max_heartbeats_per_sec;
    registry_ = std::make_unique<WorkerRegistry>(store_.get(), &clock_, o);
  }
  Channel* Add(const std::string& id) {
    channels_.push_back(std::make_unique<Channel>());
    v1::Register r;
    r.set_worker_id(id);
    r.set_hostname("h-" + id);
    r.add_slots()->set_kind(v1::Slot::KIND_CPU);
    auto got = registry_->Register(r, channels_.back().get());
    EXPECT_TRUE(got.ok()) << got.status();
    return channels_.back().get();
  }
  // The terms a heartbeat of `id` answers with; {0, 0} for none (unchanged).
  WorkerRegistry::LeaseTerms Beat(const std::string& id, const Channel* c) {
    auto got = registry_->Heartbeat(id, c);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok() || !got->has_value()) return {};
    return **got;
  }

  ScopedTempDir dir_{"registry_test"};
  FakeClock clock_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<WorkerRegistry> registry_;
  std::vector<std::unique_ptr<Channel>> channels_;
};

MATCHER_P2(Terms, interval, lease, "") {
  return arg.heartbeat_interval == interval && arg.lease_timeout == lease;
}

TEST_F(WorkerRegistryTermsTest, AFleetPastTheBoundIsToldLongerIntervalsAndLeases) {
  Open(/*max_heartbeats_per_sec=*/2);
  // Two sessions heartbeating every second are the bound: the options' terms.
  Channel* a = Add("a");
  Channel* b = Add("b");
  EXPECT_THAT(registry_->TermsOf("a"), Terms(absl::Seconds(1), absl::Seconds(3)));
  EXPECT_THAT(registry_->TermsOf("b"), Terms(absl::Seconds(1), absl::Seconds(3)));
  // A third and a fourth: 1.5 s, then 2 s, and leases in proportion.
  Channel* c = Add("c");
  EXPECT_THAT(registry_->TermsOf("c"), Terms(absl::Milliseconds(1500), absl::Milliseconds(4500)));
  Channel* d = Add("d");
  EXPECT_THAT(registry_->TermsOf("d"), Terms(absl::Seconds(2), absl::Seconds(6)));
  // The earlier ones learn theirs from a heartbeat's answer; d already has them.
  EXPECT_THAT(Beat("a", a), Terms(absl::Seconds(2), absl::Seconds(6)));
  EXPECT_THAT(Beat("b", b), Terms(absl::Seconds(2), absl::Seconds(6)));
  EXPECT_THAT(Beat("c", c), Terms(absl::Seconds(2), absl::Seconds(6)));
  EXPECT_THAT(Beat("d", d), Terms(absl::ZeroDuration(), absl::ZeroDuration()));
  EXPECT_THAT(registry_->TermsOf("a"), Terms(absl::Seconds(2), absl::Seconds(6)));
  // Silent for longer than the options' lease, within the new one: alive.
  clock_.Advance(absl::Milliseconds(5900));
  EXPECT_TRUE(registry_->ExpireLeases().empty());
  // Past the new lease: LOST, every one of them.
  clock_.Advance(absl::Milliseconds(200));
  EXPECT_THAT(registry_->ExpireLeases(), UnorderedElementsAre("a", "b", "c", "d"));
}

TEST_F(WorkerRegistryTermsTest, AShrinkingFleetGetsItsShorterTermsBackAfterTheLongerLease) {
  Open(/*max_heartbeats_per_sec=*/10);
  std::vector<Channel*> cs;
  for (int i = 0; i < 25; ++i) cs.push_back(Add("w" + std::to_string(i)));
  EXPECT_THAT(Beat("w0", cs[0]), Terms(absl::Milliseconds(2500), absl::Milliseconds(7500)));
  // 24 sessions want 2.4 s: not a fifth shorter than 2.5 s, so kept.
  registry_->SessionEnded("w24", cs[24], /*left=*/true);
  EXPECT_THAT(Beat("w0", cs[0]), Terms(absl::ZeroDuration(), absl::ZeroDuration()));
  // 20 want 2 s: told, but the worker may already wait its old 2.5 s for the
  // next heartbeat, so this heartbeat's lease is still 7.5 s.
  for (int i = 20; i < 24; ++i) {
    registry_->SessionEnded("w" + std::to_string(i), cs[i], /*left=*/true);
  }
  EXPECT_THAT(Beat("w0", cs[0]), Terms(absl::Seconds(2), absl::Seconds(6)));
  clock_.Advance(absl::Milliseconds(7000));
  // The silent others are LOST (leases of 1 to 6 s); w0 is not.
  EXPECT_THAT(registry_->ExpireLeases(), ::testing::Not(::testing::Contains("w0")));
  // Alone now: the options' terms, and again the 2 s worker's 6 s lease for
  // this heartbeat; then 6 s of silence and it is LOST.
  EXPECT_THAT(Beat("w0", cs[0]), Terms(absl::Seconds(1), absl::Seconds(3)));
  clock_.Advance(absl::Milliseconds(5900));
  EXPECT_THAT(registry_->ExpireLeases(), ::testing::Not(::testing::Contains("w0")));
  clock_.Advance(absl::Milliseconds(200));
  EXPECT_THAT(registry_->ExpireLeases(), ::testing::ElementsAre("w0"));
}

TEST_F(WorkerRegistryTermsTest, WithoutABoundEveryWorkerKeepsTheOptionsTerms) {
  Open(/*max_heartbeats_per_sec=*/0);
  std::vector<Channel*> cs;
  for (int i = 0; i < 50; ++i) cs.push_back(Add("w" + std::to_string(i)));
  EXPECT_THAT(registry_->TermsOf("w49"), Terms(absl::Seconds(1), absl::Seconds(3)));
  EXPECT_THAT(Beat("w0", cs[0]), Terms(absl::ZeroDuration(), absl::ZeroDuration()));
  clock_.Advance(absl::Milliseconds(3100));
  EXPECT_EQ(registry_->ExpireLeases().size(), 50u);
}

// The housekeeping passes skip their walk until the earliest deadline they
// know of; a deadline moved earlier (a broken stream's grace) must still be
// met on time, as must a gone worker's forgetting.
TEST_F(WorkerRegistryTermsTest, ABrokenStreamIsLostAtItsGraceThoughThePassesSkipTheirWalk) {
  Open(/*max_heartbeats_per_sec=*/0);
  Channel* a = Add("a");
  Channel* b = Add("b");
  EXPECT_TRUE(registry_->ExpireLeases().empty());  // a walk: nothing due for 3 s
  clock_.Advance(absl::Milliseconds(100));
  registry_->SessionEnded("a", a, /*left=*/false);  // LOST 1 s from now
  clock_.Advance(absl::Milliseconds(900));
  EXPECT_TRUE(Beat("b", b).heartbeat_interval == absl::ZeroDuration());
  EXPECT_TRUE(registry_->ExpireLeases().empty());
  clock_.Advance(absl::Milliseconds(200));
  EXPECT_THAT(registry_->ExpireLeases(), ::testing::ElementsAre("a"));
  // b heartbeat at 1.0 s: its lease runs to 4.0 s, not to its first 3.0 s.
  clock_.Advance(absl::Milliseconds(1700));  // 2.9 s
  EXPECT_TRUE(registry_->ExpireLeases().empty());
  clock_.Advance(absl::Milliseconds(1000));  // 3.9 s
  EXPECT_TRUE(registry_->ExpireLeases().empty());
  clock_.Advance(absl::Milliseconds(200));
  EXPECT_THAT(registry_->ExpireLeases(), ::testing::ElementsAre("b"));
}

TEST_F(WorkerRegistryTermsTest, AGoneWorkerIsForgottenWhenDueAndOnceItsRanksAreGone) {
  Open(/*max_heartbeats_per_sec=*/0);
  // Re-made with a short gone_ttl.
  RegistryOptions o = registry_->options();
  o.gone_ttl = absl::Seconds(10);
  registry_ = std::make_unique<WorkerRegistry>(store_.get(), &clock_, o);
  Channel* a = Add("a");
  Add("b");
  bool a_holds_ranks = true;
  auto holds = [&](const std::string& id) { return id == "a" && a_holds_ranks; };
  EXPECT_TRUE(registry_->ForgetGone(holds).empty());
  registry_->SessionEnded("a", a, /*left=*/true);  // LEFT; last heartbeat at 0 s
  clock_.Advance(absl::Seconds(9));
  EXPECT_TRUE(registry_->ForgetGone(holds).empty());
  clock_.Advance(absl::Seconds(2));  // 11 s: due, but its ranks are still there
  EXPECT_TRUE(registry_->ForgetGone(holds).empty());
  a_holds_ranks = false;
  clock_.Advance(absl::Seconds(1));
  EXPECT_THAT(registry_->CountByState(),
              ::testing::UnorderedElementsAre(::testing::Pair(v1::WORKER_STATE_ALIVE, 1),
                                              ::testing::Pair(v1::WORKER_STATE_LEFT, 1)));
  EXPECT_THAT(registry_->ForgetGone(holds), ::testing::ElementsAre("a"));
  EXPECT_EQ(registry_->Find("a"), nullptr);
  EXPECT_NE(registry_->Find("b"), nullptr);  // ALIVE: never forgotten here
}

}  // namespace
}  // namespace trainctl::coordinator
