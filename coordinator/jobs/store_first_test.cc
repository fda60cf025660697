// Memory never runs ahead of the store (#47): a worker's reports applied in
// one telemetry group (TelemetryLedger) whose commit fails leave the job,
// its events, checkpoint records, metric history, watchers and the workers
// exactly as before; the held reports, retried, then apply once, with
// dense event numbers. A checkpoint record that was never stored never
// causes the deletion of one that was.
//
// The JobManager fixture (a fake clock, a real SQLite store with its write
// fault seam, fake worker channels) with a TelemetryLedger on the same
// store, as the coordinator composes them.
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <memory>

#include "coordinator/jobs/job_manager_fixture.h"
#include "coordinator/telemetry/telemetry_ledger.h"

namespace trainctl::coordinator {
namespace {

using Outcome = TelemetryLedger::Outcome;
using google::protobuf::util::MessageDifferencer;

class StoreFirstTest : public JobManagerTest {
 protected:
  // A ledger as the coordinator makes it (coordinator_server.cc).
  std::unique_ptr<TelemetryLedger> NewLedger() {
    return std::make_unique<TelemetryLedger>(store_.get(), &owners_->book);
  }

  // A 2-rank job on a and b keeping one checkpoint per worker, RUNNING,
  // with epoch 1's checkpoint stored on both (through `ledger`, seqs 1, 2
  // of each worker).
  std::string RunningWithStoredCheckpoint(TelemetryLedger& ledger) {
    a_ = AddWorker("a", 1);
    b_ = AddWorker("b", 1);
    v1::JobSpec spec = Spec(2);
    spec.mutable_training()->set_epochs(4);
    spec.mutable_checkpoint()->set_keep(1);
    std::string id = RunTwoRanks(spec);
    EXPECT_FALSE(id.empty());
    auto one = ledger.ApplyBatch({
        {"a", 1, [&, id] { return Checkpoint(*jobs_, "a", id, 1, 0, 1, 10, "/wa"); }},
        {"b", 1, [&, id] { return Checkpoint(*jobs_, "b", id, 1, 1, 1, 10, "/wb"); }},
    });
    EXPECT_EQ(one.outcome, Outcome::kApplied) << one.status;
    return id;
  }

  // Points of `rank` in epoch `epoch` (0-based): one train point and the
  // epoch's end (an epoch_end event when rank 0's).
  static v1::MetricBatch EpochPoints(const std::string& id, int epoch, int rank = 0) {
    v1::MetricBatch batch;
    batch.set_job_id(id);
    batch.set_attempt(1);
    v1::MetricPoint* p = batch.add_points();
    p->set_kind(v1::MetricPoint::KIND_TRAIN);
    p->set_rank(rank);
    p->set_epoch(epoch);
    p->set_step(3);
    p->set_steps_per_epoch(4);
    p->set_loss(0.5);
    p->set_samples_per_sec(64);
    p->set_samples_seen(64);
    v1::MetricPoint* end = batch.add_points();
    *end = *p;
    end->set_kind(v1::MetricPoint::KIND_EPOCH_END);
    end->set_step(4);
    return batch;
  }

  // Paths each channel was told to delete, in order.
  static std::vector<std::string> Drops(const FakeChannel* ch) {
    std::vector<std::string> out;
    for (const auto& m : ch->sent) {
      if (!m.has_drop_checkpoints()) continue;
      out.insert(out.end(), m.drop_checkpoints().paths().begin(),
                 m.drop_checkpoints().paths().end());
    }
    return out;
  }

  std::vector<v1::Event> Events(const std::string& id) {
    auto events = store_->jobs().ListEvents(id, 0, 0);
    EXPECT_TRUE(events.ok()) << events.status();
    return events.ok() ? *events : std::vector<v1::Event>{};
  }
  std::vector<v1::MetricPoint> Metrics(const std::string& id) {
    auto points = store_->telemetry().ListMetrics(id, 0);
    EXPECT_TRUE(points.ok()) << points.status();
    return points.ok() ? *points : std::vector<v1::MetricPoint>{};
  }

  // Fails every group's commit (a disk that fills at COMMIT).
  void FailCommits() {
    store_->SetWriteFaultForTest(
        [](int64_t, absl::string_view op) { return absl::StartsWith(op, "CommitGroup"); });
  }
};

// Event seqs of `events` are 1, 2, ... n.
void ExpectDense(const std::vector<v1::Event>& events) {
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].seq(), static_cast<int64_t>(i + 1))
        << "event " << i << ": " << events[i].type();
  }
}

TEST_F(StoreFirstTest, AFailedCommitLeavesEverythingAsStoredAndTheRetryAppliesOnce) {
  std::unique_ptr<TelemetryLedger> ledger = NewLedger();
  const std::string id = RunningWithStoredCheckpoint(*ledger);
  ASSERT_FALSE(id.empty());
  RecordingSubscriber sub;
  hub_.Subscribe(id, &sub);

  const v1::Job before = Get(id);
  const std::vector<v1::Event> events_before = Events(id);
  const size_t metrics_before = Metrics(id).size();
  const size_t a_sent = a_->sent.size(), b_sent = b_->sent.size();
  ASSERT_EQ(before.checkpoints_size(), 2);

  // Epoch 2 and the job's end, from both workers, in one group: two epoch
  // ends, both ranks' epoch-2 checkpoints (keep 1: epoch 1's would go), and
  // both ranks' success.
  std::vector<TelemetryLedger::Item> batch = {
      {"a", 2, [&] { return owners_->ingest.OnMetrics("a", EpochPoints(id, 0)); }},
      {"a", 3, [&] { return owners_->ingest.OnMetrics("a", EpochPoints(id, 1)); }},
      {"a", 4, [&] { return Checkpoint(*jobs_, "a", id, 1, 0, 2, 20, "/wa"); }},
      {"b", 2, [&] { return Checkpoint(*jobs_, "b", id, 1, 1, 2, 20, "/wb"); }},
      {"a", 5, [&] { return Status("a", id, 1, 0, v1::RANK_STATE_SUCCEEDED); }},
      {"b", 3, [&] { return Status("b", id, 1, 1, v1::RANK_STATE_SUCCEEDED); }},
  };
  FailCommits();
  TelemetryLedger::Result failed = ledger->ApplyBatch(batch);
  ASSERT_EQ(failed.outcome, Outcome::kRetry);
  EXPECT_EQ(failed.status.code(), absl::StatusCode::kUnavailable) << failed.status;

  // Memory is what the store has: the job (state, checkpoints, progress,
  // summary, last event seq shown through the next events) as before.
  const v1::Job after_failure = Get(id);
  EXPECT_EQ(after_failure.state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(MessageDifferencer::Equals(after_failure, before))
      << "before:\n"
      << before.DebugString() << "after:\n"
      << after_failure.DebugString();
  EXPECT_EQ(Events(id).size(), events_before.size());
  EXPECT_EQ(Metrics(id).size(), metrics_before);
  // Watchers heard nothing, and no worker was told anything (no deletion).
  EXPECT_TRUE(sub.updates.empty())
      << sub.updates.size() << " updates, first: " << sub.updates[0].DebugString();
  EXPECT_FALSE(sub.ended);
  EXPECT_EQ(a_->sent.size(), a_sent);
  EXPECT_EQ(b_->sent.size(), b_sent);
  EXPECT_TRUE(Drops(a_).empty());
  EXPECT_TRUE(Drops(b_).empty());
  EXPECT_EQ(ledger->Applied("a"), 1);
  EXPECT_EQ(ledger->Applied("b"), 1);

  // The store is back: the held batch, retried, applies once.
  store_->SetWriteFaultForTest(nullptr);
  TelemetryLedger::Result retried = ledger->ApplyBatch(batch);
  ASSERT_EQ(retried.outcome, Outcome::kApplied) << retried.status;
  const v1::Job done = Get(id);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  std::vector<v1::Event> events = Events(id);
  ExpectDense(events);
  std::vector<std::string> new_types;
  for (size_t i = events_before.size(); i < events.size(); ++i)
    new_types.push_back(events[i].type());
  EXPECT_EQ(std::count(new_types.begin(), new_types.end(), "epoch_end"), 2);
  EXPECT_EQ(std::count(new_types.begin(), new_types.end(), "checkpoint"), 2);
  EXPECT_EQ(std::count(new_types.begin(), new_types.end(), "succeeded"), 1)
      << absl::StrJoin(new_types, ",");
  EXPECT_EQ(Metrics(id).size(), metrics_before + 4);
  // The watcher saw each stored event once, in order, and the end.
  std::vector<int64_t> seen;
  for (const v1::JobUpdate& u : sub.updates) {
    if (u.has_event()) seen.push_back(u.event().seq());
  }
  std::vector<int64_t> stored_new;
  for (size_t i = events_before.size(); i < events.size(); ++i)
    stored_new.push_back(events[i].seq());
  EXPECT_EQ(seen, stored_new);
  EXPECT_TRUE(sub.ended);
  // Epoch 1's files go once the epoch-2 records are stored, once.
  EXPECT_EQ(Drops(a_), std::vector<std::string>{CkPath("/wa", id, 1)});
  EXPECT_EQ(Drops(b_), std::vector<std::string>{CkPath("/wb", id, 1)});

  // A restarted coordinator has the same: nothing was applied twice.
  channels_.clear();
  Open();
  const v1::Job recovered = Get(id);
  EXPECT_EQ(recovered.state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(recovered.checkpoints_size(), 2);
  for (const v1::CheckpointRecord& r : recovered.checkpoints()) EXPECT_EQ(r.epochs_done(), 2);
  ExpectDense(Events(id));
}

// A write failing in the middle of a group (not only at its commit) undoes
// what the items before it did to memory, too.
TEST_F(StoreFirstTest, AWriteFailingMidGroupUndoesTheItemsBeforeIt) {
  std::unique_ptr<TelemetryLedger> ledger = NewLedger();
  const std::string id = RunningWithStoredCheckpoint(*ledger);
  ASSERT_FALSE(id.empty());
  RecordingSubscriber sub;
  hub_.Subscribe(id, &sub);
  const v1::Job before = Get(id);
  const size_t events_before = Events(id).size();
  // The second checkpoint's job write fails (b's), after a's was applied.
  int puts = 0;
  store_->SetWriteFaultForTest(
      [&](int64_t, absl::string_view op) { return absl::StartsWith(op, "PutJob") && ++puts == 2; });
  std::vector<TelemetryLedger::Item> batch = {
      {"a", 2, [&] { return Checkpoint(*jobs_, "a", id, 1, 0, 2, 20, "/wa"); }},
      {"b", 2, [&] { return Checkpoint(*jobs_, "b", id, 1, 1, 2, 20, "/wb"); }},
  };
  ASSERT_EQ(ledger->ApplyBatch(batch).outcome, Outcome::kRetry);
  EXPECT_TRUE(MessageDifferencer::Equals(Get(id), before)) << Get(id).DebugString();
  EXPECT_TRUE(sub.updates.empty());
  EXPECT_TRUE(Drops(a_).empty());
  store_->SetWriteFaultForTest(nullptr);
  ASSERT_EQ(ledger->ApplyBatch(batch).outcome, Outcome::kApplied);
  std::vector<v1::Event> events = Events(id);
  EXPECT_EQ(events.size(), events_before + 2);
  ExpectDense(events);
  EXPECT_EQ(Drops(a_), std::vector<std::string>{CkPath("/wa", id, 1)});
}

// A checkpoint record whose commit failed never causes the deletion of a
// stored checkpoint: not at the failure, not when a later group (other
// reports) commits, not after a coordinator restart. Only the record's own
// retried commit orders it.
TEST_F(StoreFirstTest, AnUnstoredCheckpointRecordNeverDeletesAStoredOne) {
  std::unique_ptr<TelemetryLedger> ledger = NewLedger();
  const std::string id = RunningWithStoredCheckpoint(*ledger);
  ASSERT_FALSE(id.empty());
  FailCommits();
  TelemetryLedger::Item epoch2 = {"a", 2,
                                  [&] { return Checkpoint(*jobs_, "a", id, 1, 0, 2, 20, "/wa"); }};
  ASSERT_EQ(ledger->ApplyBatch({epoch2}).outcome, Outcome::kRetry);
  TelemetryLedger::Item epoch3 = {"a", 3,
                                  [&] { return Checkpoint(*jobs_, "a", id, 1, 0, 3, 30, "/wa"); }};
  ASSERT_EQ(ledger->ApplyBatch({epoch2, epoch3}).outcome, Outcome::kRetry);
  EXPECT_TRUE(Drops(a_).empty()) << "ordered on records that were never stored";
  const v1::Job held = Get(id);
  ASSERT_EQ(held.checkpoints_size(), 2);
  for (const v1::CheckpointRecord& r : held.checkpoints()) EXPECT_EQ(r.epochs_done(), 1);

  // Another worker's report commits: it releases nothing of the failed groups.
  store_->SetWriteFaultForTest(nullptr);
  TelemetryLedger::Item metrics = {
      "b", 2, [&] { return owners_->ingest.OnMetrics("b", EpochPoints(id, 0, 1)); }};
  ASSERT_EQ(ledger->ApplyBatch({metrics}).outcome, Outcome::kApplied);
  EXPECT_TRUE(Drops(a_).empty());

  // The coordinator is killed now: what it will resume from is the stored
  // epoch 1, whose files are still there (no order went out).
  ledger.reset();
  channels_.clear();
  Open();
  const v1::Job recovered = Get(id);
  ASSERT_EQ(recovered.checkpoints_size(), 2);
  for (const v1::CheckpointRecord& r : recovered.checkpoints()) EXPECT_EQ(r.epochs_done(), 1);
  ExpectDense(Events(id));
}

}  // namespace
}  // namespace trainctl::coordinator
