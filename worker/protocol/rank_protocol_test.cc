#include "worker/protocol/rank_protocol.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/temp_dir.h"

#include <cstdlib>
#include <fstream>

namespace trainctl::rankproto {
namespace {

TEST(RankProtocolTest, ConfigRoundTripsWithEscapes) {
  FlatConfig c{{"a.b", "1"}, {"msg", "two\nlines \\ and more"}, {"empty", ""}};
  auto back = ParseConfig(FormatConfig(c));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, c);
  EXPECT_EQ(ParseConfig("novalue\n").status().code(), absl::StatusCode::kInvalidArgument);
}

// The config carries the attempt's rendezvous secret: owner-only, also when
// it replaces a file that was readable by others.
TEST(RankProtocolTest, ConfigFileIsOwnerOnly) {
  const ScopedTempDir dir("rank_protocol_test");
  ASSERT_FALSE(dir.path().empty());
  const std::string path = dir.File("rank.conf");
  { std::ofstream(path + ".tmp") << "old\n"; }
  chmod((path + ".tmp").c_str(), 0644);
  FlatConfig c{{"run.store_secret", "s3cr3t-s3cr3t-s3cr3t"}};
  ASSERT_TRUE(WriteConfigFile(path, c).ok());
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(*ReadConfigFile(path), c);
}

TEST(RankProtocolTest, TypedGettersNameTheKey) {
  FlatConfig c{{"n", "12"}, {"x", "abc"}, {"b", "true"}, {"d", "0.5"}};
  EXPECT_EQ(*GetInt(c, "n"), 12);
  EXPECT_EQ(*GetInt(c, "missing", 7), 7);
  EXPECT_EQ(GetInt(c, "x").status().message(), "x: not an integer: 'abc'");
  EXPECT_EQ(GetInt(c, "nope").status().message(), "nope: missing");
  EXPECT_TRUE(*GetBool(c, "b"));
  EXPECT_DOUBLE_EQ(*GetDouble(c, "d"), 0.5);
  EXPECT_EQ(GetString(c, "zz", "dflt"), "dflt");
}

TEST(RankProtocolTest, ProgressHeartbeatRoundTripsAndPlainProgressStillParses) {
  RankHeartbeat hb;
  hb.phase = "train";
  hb.seq = 1234;
  hb.waiting_seq = 1234;
  hb.op = "allreduce";
  hb.op_step = 617;
  hb.op_bucket = 3;
  hb.waiting_ms = 9800;
  hb.p99_step_ms = 12.5;
  hb.compute_ms = 7.25;
  auto p = ParseStatusLine(FormatProgress(1, 616, hb));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->type, StatusMessage::Type::kProgress);
  EXPECT_EQ(p->epoch, 1);
  EXPECT_EQ(p->step, 616);
  EXPECT_TRUE(p->heartbeat.present);
  EXPECT_EQ(p->heartbeat.phase, "train");
  EXPECT_EQ(p->heartbeat.seq, 1234);
  EXPECT_EQ(p->heartbeat.waiting_seq, 1234);
  EXPECT_EQ(p->heartbeat.op, "allreduce");
  EXPECT_EQ(p->heartbeat.op_step, 617);
  EXPECT_EQ(p->heartbeat.op_bucket, 3);
  EXPECT_EQ(p->heartbeat.waiting_ms, 9800);
  EXPECT_DOUBLE_EQ(p->heartbeat.p99_step_ms, 12.5);
  EXPECT_DOUBLE_EQ(p->heartbeat.compute_ms, 7.25);
  auto plain = ParseStatusLine("progress 2 345\n");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->heartbeat.present);
  // Unknown keys are skipped (a newer rank); malformed numbers are errors.
  EXPECT_TRUE(ParseStatusLine("progress 2 345 seq=4 future=x").ok());
  EXPECT_FALSE(ParseStatusLine("progress 2 345 seq=four").ok());
  EXPECT_FALSE(ParseStatusLine("progress 2 345 seq").ok());
}

// The heartbeat a command job's Python rank sends (python/trainctl/_rank_boot/sitecustomize.py).
TEST(RankProtocolTest, ScriptHeartbeatWordsParse) {
  auto p = ParseStatusLine("progress 0 30 phase=train moves=17 torch_ms=4200\n");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->heartbeat.present);
  EXPECT_EQ(p->step, 30);
  EXPECT_EQ(p->heartbeat.stack_moves, 17);
  EXPECT_EQ(p->heartbeat.torch_wait_ms, 4200);
  EXPECT_FALSE(ParseStatusLine("progress 0 30 moves=x").ok());
}

TEST(RankProtocolTest, StatusLinesRoundTrip) {
  auto r = ParseStatusLine(FormatRendezvous("10.0.0.1:2345"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->type, StatusMessage::Type::kRendezvous);
  EXPECT_EQ(r->address, "10.0.0.1:2345");
  EXPECT_EQ(ParseStatusLine(FormatReady())->type, StatusMessage::Type::kReady);
  auto p = ParseStatusLine(FormatProgress(2, 345));
  EXPECT_EQ(p->epoch, 2);
  EXPECT_EQ(p->step, 345);
  RankMetric m;
  m.kind = "epoch_end";
  m.epoch = 1;
  m.step = 10;
  m.loss = 0.25;
  m.samples_per_sec = 1234.5;
  m.has_eval = true;
  m.eval_accuracy = 0.91;
  auto mm = ParseStatusLine(FormatMetric(m));
  ASSERT_TRUE(mm.ok());
  EXPECT_EQ(mm->metric.kind, "epoch_end");
  EXPECT_DOUBLE_EQ(mm->metric.samples_per_sec, 1234.5);
  EXPECT_TRUE(mm->metric.has_eval);
  EXPECT_DOUBLE_EQ(mm->metric.eval_accuracy, 0.91);
  auto e =
      ParseStatusLine(FormatError(ErrorKind::kConfig, "data.train.images: no such file\nsecond"));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->error_kind, ErrorKind::kConfig);
  EXPECT_EQ(e->message, "data.train.images: no such file second");
  auto model = ParseStatusLine(FormatModel("/ckpt/my job/model.pt"));
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->type, StatusMessage::Type::kModel);
  EXPECT_EQ(model->path, "/ckpt/my job/model.pt");
  CheckpointNote c;
  c.epochs_done = 3;
  c.global_step = 120;
  c.epoch_consumed = 4500;
  c.size_bytes = 99;
  c.checksum = "crc32:0000abcd";
  c.path = "/ckpt/a b/job.ckpt-epoch-000003-0000004500.pt";
  auto ck = ParseStatusLine(FormatCheckpoint(c));
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->type, StatusMessage::Type::kCheckpoint);
  EXPECT_EQ(ck->checkpoint.epoch_consumed, 4500);
  EXPECT_EQ(ck->checkpoint.global_step, 120);
  EXPECT_EQ(ck->checkpoint.path, c.path);
  // A line without CONSUMED (an older rank) is an epoch boundary.
  auto old = ParseStatusLine("checkpoint 2 80 99 - /ckpt/x y.pt");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->checkpoint.epoch_consumed, 0);
  EXPECT_EQ(old->checkpoint.path, "/ckpt/x y.pt");
  EXPECT_FALSE(ParseStatusLine("checkpoint 2 80 99 - -5 /ckpt/x.pt").ok());
  EXPECT_FALSE(ParseStatusLine("model").ok());
  EXPECT_FALSE(ParseStatusLine("bogus").ok());
  EXPECT_FALSE(ParseStatusLine("metric loss=abc").ok());
  EXPECT_FALSE(ParseStatusLine("").ok());
}

TEST(RankProtocolTest, ErrorLinesCarryTheNewKindsAndANanStep) {
  auto m = ParseStatusLine(FormatError(ErrorKind::kNan, "NaN/Inf gradients at step 57", 57));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(FormatError(ErrorKind::kNan, "x", 57), "error nan:57 x\n");
  EXPECT_EQ(m->error_kind, ErrorKind::kNan);
  EXPECT_EQ(m->step, 57);
  EXPECT_EQ(m->message, "NaN/Inf gradients at step 57");
  for (ErrorKind k : {ErrorKind::kData, ErrorKind::kOutOfMemory, ErrorKind::kDiskFull}) {
    auto p = ParseStatusLine(FormatError(k, "why it failed"));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->error_kind, k) << ErrorKindName(k);
    EXPECT_EQ(p->step, 0);
    EXPECT_EQ(p->message, "why it failed");
  }
  EXPECT_FALSE(ParseStatusLine("error nan:x oops").ok());
  EXPECT_FALSE(ParseStatusLine("error nan:-3 oops").ok());
}

// The metric line's words and their order are what older daemons parse:
// pinned here, with every field set, eval fields only with has_eval.
TEST(RankProtocolTest, MetricLineKeepsItsWordsAndOrder) {
  RankMetric m;
  m.kind = "train";
  m.epoch = 2;
  m.step = 7;
  m.steps_per_epoch = 50;
  m.loss = 0.5;
  m.lr = 0.01;
  m.samples_per_sec = 100;
  m.data_ms = 1.5;
  m.compute_ms = 2.5;
  m.comm_ms = 3.5;
  m.loss_scale = 65536;
  m.skipped_steps = 1;
  m.peak_memory_bytes = 4096;
  m.samples_seen = 640;
  const std::string plain =
      "metric kind=train epoch=2 step=7 steps_per_epoch=50 loss=0.5 lr=0.01 samples_per_sec=100 "
      "data_ms=1.5 "
      "compute_ms=2.5 comm_ms=3.5 loss_scale=65536 skipped_steps=1 peak_memory_bytes=4096 "
      "samples_seen=640";
  EXPECT_EQ(FormatMetric(m), plain + "\n");
  m.has_eval = true;
  m.eval_loss = 0.25;
  m.eval_accuracy = 0.75;
  m.eval_samples = 1000;
  EXPECT_EQ(FormatMetric(m), plain + " eval_loss=0.25 eval_accuracy=0.75 eval_samples=1000\n");
  auto parsed = ParseStatusLine(FormatMetric(m));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->metric.steps_per_epoch, 50);
  EXPECT_EQ(parsed->metric.peak_memory_bytes, 4096);
  EXPECT_DOUBLE_EQ(parsed->metric.comm_ms, 3.5);
  EXPECT_EQ(parsed->metric.eval_samples, 1000);
  // Unknown keys are ignored (a newer rank may report more).
  auto newer = ParseStatusLine("metric kind=train epoch=1 future_key=3");
  ASSERT_TRUE(newer.ok()) << newer.status();
  EXPECT_FALSE(newer->metric.has_eval);
}

// A script's line names what it reported: the parsed metric says so
// field by field (a 0 it named is reported, a field it left out is not),
// and formats back to the same words.
TEST(RankProtocolTest, MetricLineSaysWhichFieldsWereReported) {
  RankMetric engine;
  EXPECT_TRUE(engine.Reports("loss"));
  EXPECT_TRUE(engine.Reports("samples_per_sec"));
  EXPECT_FALSE(engine.Reports("eval_accuracy")) << "no eval without has_eval";

  const std::string train = "metric kind=train epoch=0 step=3 loss=0 lr=0.1 s.val=2";
  auto t = ParseStatusLine(train);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->metric.Reports("step"));
  EXPECT_TRUE(t->metric.Reports("loss"));
  EXPECT_TRUE(t->metric.Reports("lr"));
  EXPECT_FALSE(t->metric.Reports("samples_per_sec"));
  EXPECT_FALSE(t->metric.Reports("steps_per_epoch"));
  EXPECT_FALSE(t->metric.has_eval);
  EXPECT_EQ(FormatMetric(t->metric), train + "\n");

  const std::string eval = "metric kind=eval epoch=1 step=40 eval_accuracy=0.5 s.val_f1=0.75";
  auto e = ParseStatusLine(eval);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->metric.kind, "eval");
  EXPECT_TRUE(e->metric.has_eval);
  EXPECT_TRUE(e->metric.Reports("eval_accuracy"));
  EXPECT_FALSE(e->metric.Reports("eval_loss"));
  EXPECT_FALSE(e->metric.Reports("loss"));
  EXPECT_FALSE(e->metric.Reports("samples_per_sec"));
  EXPECT_EQ(FormatMetric(e->metric), eval + "\n");

  // A bare step reports nothing but itself.
  auto bare = ParseStatusLine("metric kind=train epoch=0 step=5");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_FALSE(bare->metric.Reports("loss"));
  EXPECT_EQ(bare->metric.step, 5);
}

TEST(RankProtocolTest, CustomScalarsRoundTripAndBadOnesMakeTheLineMalformed) {
  RankMetric m;
  m.step = 3;
  m.scalars = {{"val_f1", 0.8}, {"eval/top5", 0.5}};
  const std::string line = FormatMetric(m);
  EXPECT_NE(line.find(" s.val_f1=0.8 s.eval/top5=0.5\n"), std::string::npos) << line;
  auto parsed = ParseStatusLine(line);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->metric.scalars, m.scalars);
  for (const char* bad :
       {"metric kind=train epoch=0 s.=1", "metric kind=train epoch=0 s.a$b=1",
        "metric kind=train epoch=0 s.x=nan", "metric kind=train epoch=0 s.x=abc"}) {
    EXPECT_FALSE(ParseStatusLine(bad).ok()) << bad;
  }
  std::string many = "metric kind=train epoch=0";
  for (size_t i = 0; i <= kMaxScalars; ++i) absl::StrAppend(&many, " s.m", i, "=1");
  EXPECT_FALSE(ParseStatusLine(many).ok()) << "at most kMaxScalars";
  EXPECT_TRUE(IsScalarName(std::string(64, 'a')));
  EXPECT_FALSE(IsScalarName(std::string(65, 'a')));
}

}  // namespace
}  // namespace trainctl::rankproto
