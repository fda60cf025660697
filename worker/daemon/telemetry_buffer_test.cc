#include "worker/daemon/telemetry_buffer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace trainctl::worker {
namespace {

v1::WorkerMessage Logs(int rank, int lines, size_t line_bytes = 100) {
  v1::WorkerMessage m;
  v1::LogChunk* c = m.mutable_logs();
  c->set_job_id("job");
  c->set_attempt(1);
  c->set_rank(rank);
  for (int i = 0; i < lines; ++i) {
    v1::LogLine* l = c->add_lines();
    l->set_rank(rank);
    l->set_text(std::string(line_bytes, 'x'));
    l->set_seq(i + 1);
  }
  return m;
}

v1::WorkerMessage Metrics(int points) {
  v1::WorkerMessage m;
  m.mutable_metrics()->set_job_id("job");
  m.mutable_metrics()->set_attempt(1);
  for (int i = 0; i < points; ++i) {
    v1::MetricPoint* p = m.mutable_metrics()->add_points();
    p->set_step(i);
    p->set_loss(1.0 / (i + 1));
  }
  return m;
}

v1::WorkerMessage Status(v1::RankState state) {
  v1::WorkerMessage m;
  m.mutable_rank_status()->set_job_id("job");
  m.mutable_rank_status()->set_attempt(1);
  m.mutable_rank_status()->set_state(state);
  return m;
}

std::vector<int64_t> Seqs(const TelemetryBuffer& b) {
  std::vector<int64_t> out;
  b.ForEach([&](const v1::WorkerMessage& m) { out.push_back(m.seq()); });
  return out;
}

// What a session sends from `after` on, in order.
std::vector<v1::WorkerMessage> Drain(const TelemetryBuffer& b, int64_t after) {
  std::vector<v1::WorkerMessage> out;
  v1::WorkerMessage m;
  while (b.NextAfter(after, &m)) {
    after = m.seq();
    out.push_back(m);
  }
  return out;
}

TEST(TelemetryBufferTest, NumbersInOrderAndResendsWhatIsNotAcked) {
  TelemetryBuffer b(1 << 20);
  EXPECT_EQ(b.Append(Metrics(2)), 1);
  EXPECT_EQ(b.Append(Logs(0, 3)), 2);
  EXPECT_EQ(b.Append(Status(v1::RANK_STATE_SUCCEEDED)), 3);
  EXPECT_EQ(b.last_seq(), 3);

  // First session: sends 1..3; only 1 is acknowledged before it breaks.
  std::vector<v1::WorkerMessage> sent = Drain(b, b.acked());
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_TRUE(sent[0].has_metrics());
  EXPECT_TRUE(sent[1].has_logs());
  EXPECT_TRUE(sent[2].has_rank_status());
  b.Ack(1);
  EXPECT_EQ(Seqs(b), (std::vector<int64_t>{2, 3}));

  // Reconnect: the rest again, in the same order, with the same seqs.
  b.OnRegistered(1);
  sent = Drain(b, b.acked());
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].seq(), 2);
  EXPECT_TRUE(sent[0].has_logs());
  EXPECT_EQ(sent[1].seq(), 3);
  EXPECT_TRUE(sent[1].has_rank_status());

  // An ack trims everything up to it; later appends continue the numbering.
  b.Ack(3);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.bytes(), 0);
  EXPECT_EQ(b.Append(Metrics(1)), 4);
  // A stale (lower) ack changes nothing.
  b.Ack(2);
  EXPECT_EQ(Seqs(b), (std::vector<int64_t>{4}));
}

TEST(TelemetryBufferTest, FreshProcessContinuesTheWorkersSequence) {
  // The coordinator applied up to 41 from an earlier process with this id.
  TelemetryBuffer b(1 << 20);
  b.OnRegistered(41);
  EXPECT_EQ(b.Append(Metrics(1)), 42);
  // Later registrations (reconnects) only acknowledge.
  b.OnRegistered(41);
  EXPECT_EQ(Seqs(b), (std::vector<int64_t>{42}));
  b.OnRegistered(42);
  EXPECT_TRUE(b.empty());
}

TEST(TelemetryBufferTest, MessagesHeldBeforeTheFirstRegistrationAreRenumbered) {
  TelemetryBuffer b(1 << 20);
  b.Append(Metrics(1));
  b.Append(Status(v1::RANK_STATE_RUNNING));
  b.OnRegistered(100);
  EXPECT_EQ(Seqs(b), (std::vector<int64_t>{101, 102}));
  EXPECT_EQ(b.Append(Metrics(1)), 103);
}

TEST(TelemetryBufferTest, StaysWithinItsBoundAndDropsLogLinesFirstWithACountedMarker) {
  const int64_t kMax = 64 * 1024;
  TelemetryBuffer b(kMax);
  b.Append(Metrics(50));                     // seq 1
  b.Append(Status(v1::RANK_STATE_RUNNING));  // seq 2
  for (int i = 0; i < 200; ++i) {            // seq 3..202: ~2 MB of logs
    b.Append(Logs(i % 2, 100));
    EXPECT_LE(b.bytes(), kMax);
  }
  EXPECT_GT(b.dropped_log_lines(), 0);
  EXPECT_EQ(b.dropped_messages(), 0) << "log lines go before any metric";

  // The metrics and the status are intact; every log chunk is either whole
  // or one marker line that counts exactly what it replaced.
  int64_t marker_lines = 0, kept_lines = 0;
  bool metrics = false, status = false;
  b.ForEach([&](const v1::WorkerMessage& m) {
    if (m.has_metrics()) metrics = m.metrics().points_size() == 50;
    if (m.has_rank_status()) status = true;
    if (!m.has_logs()) return;
    if (m.logs().lines_size() == 1 &&
        absl::StrContains(m.logs().lines(0).text(), "log lines dropped")) {
      EXPECT_EQ(m.logs().lines(0).text(),
                absl::StrCat("[trainctl-worker] ", m.logs().dropped_lines(),
                             " log lines dropped (telemetry buffer full)"));
      EXPECT_EQ(m.logs().lines(0).rank(), m.logs().rank());
      // It takes the last cut line's number: a resumed `logs -f` past the
      // marker does not ask for the lines it stands for.
      EXPECT_EQ(m.logs().lines(0).seq(), m.logs().dropped_lines());
      marker_lines += m.logs().dropped_lines();
    } else {
      EXPECT_EQ(m.logs().lines_size(), 100);
      kept_lines += m.logs().lines_size();
    }
  });
  EXPECT_TRUE(metrics);
  EXPECT_TRUE(status);
  EXPECT_EQ(marker_lines, b.dropped_log_lines());
  EXPECT_EQ(marker_lines + kept_lines, 200 * 100);
  EXPECT_GT(kept_lines, 0) << "the newest lines are kept";
  // Markers sit at the old end: seqs stay ascending and the newest chunk is whole.
  std::vector<int64_t> seqs = Seqs(b);
  EXPECT_TRUE(std::is_sorted(seqs.begin(), seqs.end()));
  EXPECT_EQ(seqs.back(), 202);
}

TEST(TelemetryBufferTest, WhenOnlyMetricsAreLeftTheOldestGoButStatusIsNeverDropped) {
  const int64_t kMax = 16 * 1024;
  TelemetryBuffer b(kMax);
  b.Append(Status(v1::RANK_STATE_STARTING));  // seq 1
  for (int i = 0; i < 100; ++i) {
    b.Append(Metrics(20));
    EXPECT_LE(b.bytes(), kMax);
  }
  b.Append(Status(v1::RANK_STATE_SUCCEEDED));
  EXPECT_GT(b.dropped_messages(), 0);
  std::vector<v1::WorkerMessage> held = Drain(b, 0);
  ASSERT_GE(held.size(), 3u);
  EXPECT_EQ(held.front().seq(), 1);
  EXPECT_EQ(held.front().rank_status().state(), v1::RANK_STATE_STARTING);
  EXPECT_EQ(held.back().rank_status().state(), v1::RANK_STATE_SUCCEEDED);
  // The newest metrics survive, the oldest went: a gap after seq 1.
  EXPECT_EQ(held[held.size() - 2].seq(), 101);
  EXPECT_GT(held[1].seq(), 2);
}

TEST(TelemetryBufferTest, ALogChunkLargerThanTheBoundArrivesAsItsMarker) {
  TelemetryBuffer b(8 * 1024);
  b.Append(Logs(3, 1000));
  ASSERT_EQ(b.size(), 1u);
  EXPECT_LE(b.bytes(), 8 * 1024);
  v1::WorkerMessage m;
  ASSERT_TRUE(b.NextAfter(0, &m));
  EXPECT_EQ(m.logs().dropped_lines(), 1000);
  EXPECT_EQ(m.logs().lines(0).rank(), 3);
}

}  // namespace
}  // namespace trainctl::worker
