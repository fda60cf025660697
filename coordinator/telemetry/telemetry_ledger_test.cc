#include "coordinator/telemetry/telemetry_ledger.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"

namespace trainctl::coordinator {
namespace {

using Outcome = TelemetryLedger::Outcome;

class TelemetryLedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/telemetry_ledger_test_XXXXXX";
    dir_ = mkdtemp(tmpl);
    Open();
  }
  void TearDown() override {
    ledger_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  // (Re)opens the store and a fresh ledger on it, as a restarted coordinator does.
  void Open() {
    ledger_.reset();
    store_.reset();
    auto store = StateStore::Open(dir_ + "/state.db");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    auto snapshot = store_->LoadAll();
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    ledger_ = std::make_unique<TelemetryLedger>(store_.get());
    ledger_->Recover(*snapshot);
  }
  // A handler that stores one metric point with `step` (and counts its runs).
  std::function<absl::Status()> StorePoint(int64_t step) {
    return [this, step] {
      ++runs_;
      v1::MetricBatch b;
      b.set_job_id("job");
      b.set_attempt(1);
      b.add_points()->set_step(step);
      return store_->telemetry().AppendMetrics(b);
    };
  }
  std::vector<int64_t> StoredSteps() {
    std::vector<int64_t> steps;
    absl::StatusOr<std::vector<v1::MetricPoint>> points = store_->telemetry().ListMetrics("job", 0);
    EXPECT_TRUE(points.ok()) << points.status();
    if (!points.ok()) return steps;
    for (const v1::MetricPoint& p : *points) steps.push_back(p.step());
    return steps;
  }

  std::string dir_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<TelemetryLedger> ledger_;
  int runs_ = 0;
};

TEST_F(TelemetryLedgerTest, AppliesEachSeqOnceAndAcceptsGaps) {
  EXPECT_EQ(ledger_->Applied("w"), 0);
  EXPECT_EQ(ledger_->Apply("w", 1, StorePoint(1)).outcome, Outcome::kApplied);
  EXPECT_EQ(ledger_->Apply("w", 2, StorePoint(2)).outcome, Outcome::kApplied);
  // A resend of what was applied: dropped, the handler does not run.
  EXPECT_EQ(ledger_->Apply("w", 1, StorePoint(1)).outcome, Outcome::kDuplicate);
  EXPECT_EQ(ledger_->Apply("w", 2, StorePoint(2)).outcome, Outcome::kDuplicate);
  // The worker dropped 3..4 when its buffer was full: 5 is applied.
  EXPECT_EQ(ledger_->Apply("w", 5, StorePoint(5)).outcome, Outcome::kApplied);
  EXPECT_EQ(ledger_->Apply("w", 4, StorePoint(4)).outcome, Outcome::kDuplicate);
  // Sequences are per worker.
  EXPECT_EQ(ledger_->Apply("other", 1, StorePoint(100)).outcome, Outcome::kApplied);
  EXPECT_EQ(runs_, 4);
  EXPECT_EQ(ledger_->Applied("w"), 5);
  EXPECT_EQ(ledger_->Applied("other"), 1);
  EXPECT_EQ(StoredSteps(), (std::vector<int64_t>{1, 2, 5, 100}));
}

TEST_F(TelemetryLedgerTest, AResendAfterARestartIsDroppedExactly) {
  for (int seq = 1; seq <= 3; ++seq)
    ASSERT_EQ(ledger_->Apply("w", seq, StorePoint(seq)).outcome, Outcome::kApplied);
  Open();  // The coordinator restarts on the same database.
  EXPECT_EQ(ledger_->Applied("w"), 3);
  // The worker resends from its last acknowledged seq (say 1): 2 and 3 are
  // duplicates, 4 is new.
  for (int seq = 2; seq <= 4; ++seq) ledger_->Apply("w", seq, StorePoint(seq));
  EXPECT_EQ(StoredSteps(), (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST_F(TelemetryLedgerTest, ARefusedMessageCountsAsAppliedSoTheStreamGoesOn) {
  TelemetryLedger::Result r =
      ledger_->Apply("w", 1, [] { return absl::AbortedError("attempt 1 of job ended"); });
  EXPECT_EQ(r.outcome, Outcome::kApplied);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ledger_->Applied("w"), 1);
  EXPECT_EQ(ledger_->Apply("w", 1, StorePoint(1)).outcome, Outcome::kDuplicate);
}

TEST_F(TelemetryLedgerTest, AStoreFailureKeepsNothingAndTheResendApplies) {
  TelemetryLedger::Result r = ledger_->Apply("w", 1, [this] {
    // It wrote, then failed in a way a retry may cure.
    EXPECT_TRUE(StorePoint(1)().ok());
    return absl::UnavailableError("state store: database is locked");
  });
  EXPECT_EQ(r.outcome, Outcome::kRetry);
  EXPECT_EQ(ledger_->Applied("w"), 0);
  EXPECT_TRUE(StoredSteps().empty()) << "the group was rolled back";
  EXPECT_EQ(ledger_->Apply("w", 1, StorePoint(1)).outcome, Outcome::kApplied);
  EXPECT_EQ(StoredSteps(), (std::vector<int64_t>{1}));
}

TEST_F(TelemetryLedgerTest, MemoryOnlyMessagesNeedNoWriteAndStaySafeAcrossARestart) {
  ASSERT_EQ(ledger_->Apply("w", 1, StorePoint(1)).outcome, Outcome::kApplied);
  // Progress reports change only memory: applied and acknowledged, no write.
  ASSERT_EQ(ledger_->Apply("w", 2, [] { return absl::OkStatus(); }).outcome, Outcome::kApplied);
  ASSERT_EQ(ledger_->Apply("w", 3, [] { return absl::OkStatus(); }).outcome, Outcome::kApplied);
  EXPECT_EQ(ledger_->Applied("w"), 3);
  Open();
  // The durable seq is the last one that wrote. The worker was acknowledged
  // up to 3 and resends from 4: nothing it sends is taken for a duplicate.
  EXPECT_EQ(ledger_->Applied("w"), 1);
  EXPECT_EQ(ledger_->Apply("w", 4, StorePoint(4)).outcome, Outcome::kApplied);
  EXPECT_EQ(StoredSteps(), (std::vector<int64_t>{1, 4}));
}

TEST_F(TelemetryLedgerTest, ABatchAppliesManyWorkersInOneCommitAndDropsResends) {
  ASSERT_EQ(ledger_->Apply("a", 1, StorePoint(1)).outcome, Outcome::kApplied);
  std::vector<TelemetryLedger::Item> batch = {
      {"a", 1, StorePoint(1)},  // already applied: a resend
      {"a", 2, StorePoint(2)},  {"b", 1, StorePoint(10)},
      {"a", 3, StorePoint(3)},  {"a", 3, StorePoint(3)},   // the same seq twice in one batch
      {"b", 2, StorePoint(11)}, {"b", 5, StorePoint(12)},  // a gap is accepted
  };
  runs_ = 0;
  TelemetryLedger::Result r = ledger_->ApplyBatch(batch);
  EXPECT_EQ(r.outcome, Outcome::kApplied);
  EXPECT_EQ(runs_, 5);
  EXPECT_EQ(ledger_->Applied("a"), 3);
  EXPECT_EQ(ledger_->Applied("b"), 5);
  EXPECT_EQ(StoredSteps(), (std::vector<int64_t>{1, 2, 10, 3, 11, 12}));
  Open();  // Both workers' seqs were committed with their points.
  EXPECT_EQ(ledger_->Applied("a"), 3);
  EXPECT_EQ(ledger_->Applied("b"), 5);
}

TEST_F(TelemetryLedgerTest, AStoreFailureInABatchKeepsNothingOfIt) {
  std::vector<TelemetryLedger::Item> batch = {
      {"a", 1, StorePoint(1)},
      {"b", 1, [] { return absl::UnavailableError("state store: disk I/O error"); }},
      {"a", 2, StorePoint(2)},
  };
  TelemetryLedger::Result r = ledger_->ApplyBatch(batch);
  EXPECT_EQ(r.outcome, Outcome::kRetry);
  EXPECT_EQ(ledger_->Applied("a"), 0);
  EXPECT_EQ(ledger_->Applied("b"), 0);
  EXPECT_TRUE(StoredSteps().empty()) << "the whole batch was rolled back";
  // The resends apply.
  batch[1].apply = StorePoint(10);
  EXPECT_EQ(ledger_->ApplyBatch(batch).outcome, Outcome::kApplied);
  EXPECT_EQ(StoredSteps(), (std::vector<int64_t>{1, 10, 2}));
}

// The store queues a batch's points and writes them at the commit: a write
// failing in the middle still keeps nothing of the batch (not the points
// queued before it) and applies no seq; the resend stores each point once.
TEST_F(TelemetryLedgerTest, AWriteFaultMidBatchKeepsNoPointQueuedBeforeIt) {
  std::vector<TelemetryLedger::Item> batch = {{"a", 1, StorePoint(1)},
                                              {"b", 1, StorePoint(2)},
                                              {"a", 2, StorePoint(3)},
                                              {"b", 2, StorePoint(4)}};
  store_->SetWriteFaultForTest([](int64_t write_no, absl::string_view) { return write_no == 3; });
  TelemetryLedger::Result r = ledger_->ApplyBatch(batch);
  EXPECT_EQ(r.outcome, Outcome::kRetry);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kUnavailable) << r.status;
  EXPECT_EQ(ledger_->Applied("a"), 0);
  EXPECT_EQ(ledger_->Applied("b"), 0);
  EXPECT_TRUE(StoredSteps().empty());
  store_->SetWriteFaultForTest(nullptr);
  EXPECT_EQ(ledger_->ApplyBatch(batch).outcome, Outcome::kApplied);
  EXPECT_EQ(StoredSteps(), (std::vector<int64_t>{1, 2, 3, 4}));
  Open();
  EXPECT_EQ(ledger_->Applied("a"), 2);
  EXPECT_EQ(ledger_->Applied("b"), 2);
  EXPECT_EQ(StoredSteps(), (std::vector<int64_t>{1, 2, 3, 4}));
}

}  // namespace
}  // namespace trainctl::coordinator
