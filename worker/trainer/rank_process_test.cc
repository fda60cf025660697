// End-to-end tests of trainctl-rank: real rank processes, Gloo over loopback,
// the daemon's status-pipe contract. Each test keeps its data tiny so that it
// runs in seconds on two cores.
#include <signal.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/trainer/checkpoint.h"
#include "worker/trainer/rank_process_test_support.h"
#include "worker/trainer/trainer.h"

namespace trainctl::trainer {
namespace {

using ::testing::HasSubstr;
using testing::MetricField;
using testing::RankGroup;

class RankProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("rank_process");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  // The classic DDP example: synthetic 5 -> 2 classification, Linear(5, 2),
  // Adam, cross-entropy, batch 30 per rank.
  rankproto::FlatConfig Classic(const std::string& ckpt) const {
    return testing::ResolvedJobConfig({
        {"name", "mlp-synthetic"},
        {"model.name", "mlp"},
        {"model.input_dim", "5"},
        {"model.hidden", ""},
        {"model.classes", "2"},
        {"data.train.format", "synthetic"},
        {"data.train.length", "600"},
        {"data.train.size", "5"},
        {"data.train.classes", "2"},
        {"data.train.seed", "0"},
        {"data.batch_size", "30"},
        {"data.shuffle", "true"},
        {"data.seed", "0"},
        {"data.drop_last", "false"},
        {"data.num_workers", "0"},
        {"data.pin_memory", "true"},
        {"training.epochs", "2"},
        {"training.loss", "cross_entropy"},
        {"training.optimizer.name", "adam"},
        {"training.optimizer.lr", "0.01"},
        {"training.lr_schedule.name", "constant"},
        {"training.grad_accumulation", "1"},
        {"training.max_grad_norm", "0"},
        {"training.amp.enabled", "false"},
        {"ddp.bucket_cap_mb", "25"},
        {"ddp.broadcast_buffers", "true"},
        {"ddp.find_unused_parameters", "false"},
        {"ddp.comm_hook", "none"},
        {"checkpoint.every_epochs", "1"},
        {"checkpoint.keep", "2"},
        {"metrics.every_steps", "5"},
        {"run.device", "cpu"},
        {"run.backend", "gloo"},
        {"run.advertise_host", "127.0.0.1"},
        {"run.timeout_s", "30"},
        {"run.checkpoint_dir", ckpt},
        {"run.job_id", "test-job"},
        {"run.attempt", "1"},
    });
  }

  // The classic example made longer and stateful: hidden 8, 4 epochs of 20
  // steps, SGD with momentum; a resume that restores anything wrong ends
  // with other parameters.
  rankproto::FlatConfig SmallSgd() const {
    auto c = Classic("");
    c["model.hidden"] = "8";
    c["training.epochs"] = "4";
    c["data.batch_size"] = "15";  // 20 steps per epoch
    c["training.optimizer.name"] = "sgd";
    c["training.optimizer.momentum"] = "0.9";
    return c;
  }

  // `base` resumed from checkpoint `latest` in `ckpt` as attempt 2.
  static rankproto::FlatConfig ResumeFrom(rankproto::FlatConfig base, const std::string& ckpt,
                                          const std::string& latest) {
    base["run.checkpoint_dir"] = ckpt;
    base["run.resume_from"] = latest;
    base["run.resume_job_id"] = "test-job";
    base["run.attempt"] = "2";
    return base;
  }

  // Runs `config` on two ranks (working dir dir_/sub) to the end; both exit
  // 0. `out`, when given, keeps the group for more checks.
  void RunToSuccess(const std::string& sub, const rankproto::FlatConfig& config,
                    std::unique_ptr<RankGroup>* out = nullptr) {
    std::filesystem::create_directories(dir_ + "/" + sub);
    auto g = RankGroup::Start(dir_ + "/" + sub, 2, config);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE((*g)->Wait(absl::Seconds(60))) << (*g)->Describe();
    ASSERT_EQ((*g)->exit_code(0), 0) << (*g)->Describe();
    ASSERT_EQ((*g)->exit_code(1), 0) << (*g)->Describe();
    if (out != nullptr) *out = std::move(*g);
  }

  std::string dir_;
};

// Named parameters of an exported TorchScript model.
std::map<std::string, at::Tensor> LoadParams(const std::string& path) {
  std::map<std::string, at::Tensor> out;
  torch::jit::Module m = torch::jit::load(path);
  for (const auto& p : m.named_parameters()) out[p.name] = p.value.detach().clone();
  return out;
}

// The exported models at `a` and `b` have bitwise equal parameters.
void ExpectSameParams(const std::string& a_path, const std::string& b_path) {
  auto a = LoadParams(a_path);
  auto b = LoadParams(b_path);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(torch::equal(t, b[name]))
        << name << " differs by " << (t - b[name]).abs().max().item<double>();
  }
}

int CountLines(const RankGroup& g, int rank, const std::string& prefix) {
  return static_cast<int>(g.LinesWithPrefix(rank, prefix).size());
}

std::vector<std::string> EpochEnds(const RankGroup& g, int rank) {
  return g.LinesWithPrefix(rank, "metric kind=epoch_end");
}

TEST_F(RankProcessTest, ClassicExampleTrainsOnTwoRanksAndExportsTorchScript) {
  const std::string ckpt = dir_ + "/ckpt";
  auto g = RankGroup::Start(dir_, 2, Classic(ckpt));
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE((*g)->Wait(absl::Seconds(60))) << (*g)->Describe();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ((*g)->exit_code(r), 0) << (*g)->Describe();
    EXPECT_EQ(CountLines(**g, r, "ready"), 1);
    EXPECT_EQ(CountLines(**g, r, "error"), 0);
    // 300 samples per rank / 30 = 10 steps per epoch; a metric every 5.
    auto train = (*g)->LinesWithPrefix(r, "metric kind=train");
    EXPECT_EQ(train.size(), 4u);
    auto ends = EpochEnds(**g, r);
    ASSERT_EQ(ends.size(), 2u);
    EXPECT_EQ(MetricField(ends[0], "epoch"), "0");
    EXPECT_EQ(MetricField(ends[1], "epoch"), "1");
    EXPECT_EQ(MetricField(ends[1], "steps_per_epoch"), "10");
    EXPECT_GT(std::stod(MetricField(train[0], "samples_per_sec")), 0);
    EXPECT_GT(std::stod(MetricField(train[0], "peak_memory_bytes")), 0);
    EXPECT_EQ(MetricField(train[0], "lr"), "0.01");
    EXPECT_GE(CountLines(**g, r, "progress "), 2);
  }
  EXPECT_EQ(CountLines(**g, 0, "rendezvous 127.0.0.1:"), 1);
  EXPECT_EQ(CountLines(**g, 1, "rendezvous"), 0);
  // Ready comes after the rendezvous line, metrics after ready (the
  // heartbeat thread's progress lines may come in between: its first beat
  // goes out at once).
  std::vector<std::string> order;
  for (const std::string& l : (*g)->lines(0)) {
    if (l.rfind("progress ", 0) != 0) order.push_back(l);
  }
  ASSERT_GE(order.size(), 2u);
  EXPECT_EQ(order[0].rfind("rendezvous ", 0), 0u);
  EXPECT_EQ(order[1], "ready");

  const std::string model = ckpt + "/test-job.model.pt";
  ASSERT_TRUE(std::filesystem::exists(model));
  EXPECT_EQ(ListCheckpoints(ckpt, "test-job").size(), 2u);
  // The exported model runs in Python.
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no Python torch to load the model with";
  }
  const std::string cmd = absl::StrCat("/usr/bin/python3 -c \"import torch; m=torch.jit.load('",
                                       model, "'); print(m(torch.randn(3,5)).shape)\" 2>&1");
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof buf, pipe) != nullptr) out += buf;
  EXPECT_EQ(pclose(pipe), 0) << out;
  EXPECT_THAT(out, HasSubstr("torch.Size([3, 2])"));
}

TEST_F(RankProcessTest, TwoRanksOfBatchBEqualOneRankOfBatch2B) {
  auto base = Classic("");
  base["model.hidden"] = "8";
  base["training.epochs"] = "3";
  base["checkpoint.every_epochs"] = "0";

  auto two = base;
  two["data.batch_size"] = "15";
  two["run.checkpoint_dir"] = dir_ + "/two";
  auto one = base;
  one["data.batch_size"] = "30";
  one["run.checkpoint_dir"] = dir_ + "/one";

  auto g2 = RankGroup::Start(dir_, 2, two);
  ASSERT_TRUE(g2.ok()) << g2.status();
  ASSERT_TRUE((*g2)->Wait(absl::Seconds(60))) << (*g2)->Describe();
  ASSERT_EQ((*g2)->exit_code(0), 0) << (*g2)->Describe();
  ASSERT_EQ((*g2)->exit_code(1), 0) << (*g2)->Describe();

  std::filesystem::create_directories(dir_ + "/single");
  auto g1 = RankGroup::Start(dir_ + "/single", 1, one);
  ASSERT_TRUE(g1.ok()) << g1.status();
  ASSERT_TRUE((*g1)->Wait(absl::Seconds(60))) << (*g1)->Describe();
  ASSERT_EQ((*g1)->exit_code(0), 0) << (*g1)->Describe();
  // Same number of optimizer steps: 20 per epoch both ways.
  EXPECT_EQ(MetricField(EpochEnds(**g1, 0).back(), "steps_per_epoch"), "20");
  EXPECT_EQ(MetricField(EpochEnds(**g2, 0).back(), "steps_per_epoch"), "20");

  auto a = LoadParams(dir_ + "/two/test-job.model.pt");
  auto b = LoadParams(dir_ + "/one/test-job.model.pt");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), 4u);  // layers_0_weight/bias, layers_2_weight/bias (names from the export)
  for (const auto& [name, t] : b) {
    ASSERT_TRUE(a.count(name)) << name;
    const double diff = (a[name] - t).abs().max().item<double>();
    const double scale = t.abs().max().item<double>();
    EXPECT_LE(diff / scale, 1e-5) << name << ": max abs diff " << diff;
  }
  // And training moved the parameters away from their start (the runs are
  // not trivially equal).
  EXPECT_GT(std::stod(MetricField(EpochEnds(**g1, 0).back(), "loss")), 0);
}

TEST_F(RankProcessTest, ResumeAfterKillIsBitwiseEqualToAnUninterruptedRun) {
  auto base = SmallSgd();
  base["training.optimizer.lr"] = "0.05";
  base["training.lr_schedule.name"] = "cosine";
  base["training.lr_schedule.warmup_steps"] = "5";

  auto full = base;
  full["run.checkpoint_dir"] = dir_ + "/full";
  ASSERT_NO_FATAL_FAILURE(RunToSuccess("a", full));

  const std::string ckpt = dir_ + "/resumed";
  auto slow = base;
  slow["run.checkpoint_dir"] = ckpt;
  slow["run.debug.step_sleep_ms"] = "25";  // ~0.5 s per epoch: room to kill in epoch 2
  {
    std::filesystem::create_directories(dir_ + "/b");
    auto g = RankGroup::Start(dir_ + "/b", 2, slow);
    ASSERT_TRUE(g.ok()) << g.status();
    // After the second epoch's end (checkpoint written before the metric),
    // SIGKILL both, as the daemon does after a peer failure.
    ASSERT_TRUE((*g)->WaitForLine(
        [](int rank, const std::string& line) {
          return rank == 0 && line.rfind("metric kind=epoch_end", 0) == 0 &&
                 MetricField(line, "epoch") == "1";
        },
        absl::Seconds(60)))
        << (*g)->Describe();
    (*g)->Signal(SIGKILL);
    (*g)->Wait(absl::Seconds(10));
    EXPECT_EQ((*g)->exit_code(0), -SIGKILL);
    EXPECT_EQ((*g)->exit_code(1), -SIGKILL);
  }
  ASSERT_FALSE(std::filesystem::exists(ckpt + "/test-job.model.pt"));
  ASSERT_FALSE(ListCheckpoints(ckpt, "test-job").empty());
  const std::string latest = LatestCheckpoint(ckpt, "test-job");
  EXPECT_EQ(latest.substr(ckpt.size()).rfind("/test-job.ckpt-epoch-00000", 0), 0u);
  // A torn temporary file and another job's newer checkpoint are never picked.
  { std::ofstream(ckpt + "/test-job.ckpt-epoch-000003.pt.tmp.1") << "torn"; }
  { std::ofstream(CheckpointPath(ckpt, "another-job", 3)) << "foreign"; }

  std::unique_ptr<RankGroup> g;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess("c", ResumeFrom(base, ckpt, latest), &g));
  auto ends = EpochEnds(*g, 0);
  ASSERT_FALSE(ends.empty());
  EXPECT_NE(MetricField(ends.front(), "epoch"), "0");  // resumed, not restarted
  EXPECT_EQ(MetricField(ends.back(), "epoch"), "3");
  EXPECT_THAT(g->log(0), HasSubstr("resumed from"));
  EXPECT_THAT(g->log(1), HasSubstr("resumed from"));
  ExpectSameParams(dir_ + "/full/test-job.model.pt", ckpt + "/test-job.model.pt");
}

// The global step a rank's "preempted ... (global step N)" line names; -1
// without one.
int64_t PreemptedStep(const std::string& log) {
  const std::string key = "(global step ";
  const size_t at = log.find("preempted ");
  if (at == std::string::npos) return -1;
  const size_t k = log.find(key, at);
  return k == std::string::npos ? -1 : std::stoll(log.substr(k + key.size()));
}

// A preemption as the daemon makes it (the preemption file, then SIGTERM):
// both ranks stop at one agreed step, the writer checkpoints there, and
// resuming from that checkpoint gives bitwise the parameters of a run
// without the preemption.
TEST_F(RankProcessTest, PreemptionStopsBothRanksAtOneStepWithACheckpointThatResumesExactly) {
  auto base = SmallSgd();
  base["checkpoint.every_epochs"] = "0";
  base["checkpoint.every_steps"] = "0";

  auto full = base;
  full["run.checkpoint_dir"] = dir_ + "/full";
  ASSERT_NO_FATAL_FAILURE(RunToSuccess("a", full));

  const std::string ckpt = dir_ + "/preempted";
  const std::string marker = dir_ + "/rank.preempted";
  auto slow = base;
  slow["run.checkpoint_dir"] = ckpt;
  slow["run.debug.step_sleep_ms"] = "20";
  slow["run.preempt_file"] = marker;
  {
    std::filesystem::create_directories(dir_ + "/b");
    auto g = RankGroup::Start(dir_ + "/b", 2, slow);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE((*g)->WaitForLine(
        [](int rank, const std::string& line) {
          return rank == 1 && line.rfind("metric kind=train", 0) == 0 &&
                 MetricField(line, "epoch") == "1";
        },
        absl::Seconds(60)))
        << (*g)->Describe();
    std::ofstream(marker).close();
    (*g)->Signal(SIGTERM);
    ASSERT_TRUE((*g)->Wait(absl::Seconds(30))) << (*g)->Describe();
    for (int r = 0; r < 2; ++r) EXPECT_EQ((*g)->exit_code(r), 128 + SIGTERM) << (*g)->Describe();
    const int64_t step = PreemptedStep((*g)->log(0));
    EXPECT_EQ(PreemptedStep((*g)->log(1)), step) << "both ranks stop at the agreed step";
    EXPECT_GT(step, 20);
    EXPECT_EQ(step % kPreemptAgreeEverySteps, 0) << step;
    EXPECT_THAT((*g)->log(0) + (*g)->log(1), HasSubstr("checkpoint written"));
  }
  const std::string latest = LatestCheckpoint(ckpt, "test-job");
  ASSERT_FALSE(latest.empty()) << "the preemption wrote the only checkpoint";

  std::unique_ptr<RankGroup> g;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess("c", ResumeFrom(base, ckpt, latest), &g));
  EXPECT_THAT(g->log(0), HasSubstr("resumed from"));
  ExpectSameParams(dir_ + "/full/test-job.model.pt", ckpt + "/test-job.model.pt");
}

TEST_F(RankProcessTest, MissingDataFileIsADataErrorNamingTheFile) {
  auto c = Classic(dir_ + "/ckpt");
  c["data.train.format"] = "idx";
  c["data.train.images"] = dir_ + "/no-such-images.gz";
  c["data.train.labels"] = dir_ + "/no-such-labels.gz";
  auto g = RankGroup::Start(dir_, 2, c);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE((*g)->Wait(absl::Seconds(30))) << (*g)->Describe();
  EXPECT_EQ((*g)->started(), 1);  // rank 0 failed before its rendezvous
  EXPECT_EQ((*g)->exit_code(0), 2);
  auto errors = (*g)->LinesWithPrefix(0, "error ");
  ASSERT_EQ(errors.size(), 1u) << (*g)->Describe();
  EXPECT_THAT(errors[0], HasSubstr("error data "));  // FAILURE_KIND_DATA: not restarted
  EXPECT_THAT(errors[0], HasSubstr("data.train.images"));
  EXPECT_THAT(errors[0], HasSubstr("no-such-images.gz"));
  EXPECT_EQ(CountLines(**g, 0, "ready"), 0);
}

TEST_F(RankProcessTest, BadKeyIsAConfigErrorNamingTheKey) {
  auto c = Classic(dir_ + "/ckpt");
  c["training.optimizer.name"] = "lamb";
  auto g = RankGroup::Start(dir_, 1, c);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE((*g)->Wait(absl::Seconds(30))) << (*g)->Describe();
  EXPECT_EQ((*g)->exit_code(0), 2);
  auto errors = (*g)->LinesWithPrefix(0, "error config training.optimizer.name");
  EXPECT_EQ(errors.size(), 1u) << (*g)->Describe();
}

TEST_F(RankProcessTest, LabelsThatDoNotFitTheModelAreAConfigError) {
  auto c = Classic(dir_ + "/ckpt");
  c["data.train.classes"] = "5";  // labels 0..4 for a 2-class model
  auto g = RankGroup::Start(dir_, 2, c);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE((*g)->Wait(absl::Seconds(60))) << (*g)->Describe();
  EXPECT_EQ((*g)->exit_code(0), 2) << (*g)->Describe();
  EXPECT_EQ(CountLines(**g, 0, "error config"), 1) << (*g)->Describe();
}

TEST_F(RankProcessTest, PeerDeathIsACollectiveError) {
  auto c = Classic(dir_ + "/ckpt");
  c["training.epochs"] = "50";
  c["run.debug.step_sleep_ms"] = "10";
  auto g = RankGroup::Start(dir_, 2, c);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE((*g)->WaitForLine(
      [](int rank, const std::string& line) { return rank == 1 && line.rfind("metric ", 0) == 0; },
      absl::Seconds(60)))
      << (*g)->Describe();
  (*g)->SignalRank(1, SIGKILL);
  ASSERT_TRUE((*g)->Wait(absl::Seconds(40))) << (*g)->Describe();
  EXPECT_EQ((*g)->exit_code(1), -SIGKILL);
  EXPECT_EQ((*g)->exit_code(0), 3) << (*g)->Describe();
  EXPECT_EQ(CountLines(**g, 0, "error collective"), 1) << (*g)->Describe();
}

TEST_F(RankProcessTest, SigtermStopsBothRanksNonZero) {
  auto c = Classic(dir_ + "/ckpt");
  c["training.epochs"] = "50";
  c["run.debug.step_sleep_ms"] = "10";
  auto g = RankGroup::Start(dir_, 2, c);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE((*g)->WaitForLine(
      [](int rank, const std::string& line) { return rank == 1 && line.rfind("metric ", 0) == 0; },
      absl::Seconds(60)))
      << (*g)->Describe();
  (*g)->Signal(SIGTERM);
  ASSERT_TRUE((*g)->Wait(absl::Seconds(30))) << (*g)->Describe();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ((*g)->exit_code(r), 128 + SIGTERM) << (*g)->Describe();
    EXPECT_EQ(CountLines(**g, r, "error exit stopped"), 1) << (*g)->Describe();
  }
}

// A learnable CSV task: label = (x0 - x1 + 0.5 x2 > 0).
void WriteLearnableCsv(const std::string& path, int rows, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::ofstream out(path);
  out << "a,b,c,d,e,label\n";
  for (int i = 0; i < rows; ++i) {
    float x[5];
    for (float& v : x) v = normal(rng);
    out << x[0] << "," << x[1] << "," << x[2] << "," << x[3] << "," << x[4] << ","
        << (x[0] - x[1] + 0.5f * x[2] > 0 ? 1 : 0) << "\n";
  }
}

TEST_F(RankProcessTest, Bf16AutocastTrainsAndLossDecreases) {
  WriteLearnableCsv(dir_ + "/train.csv", 480, 1);
  WriteLearnableCsv(dir_ + "/eval.csv", 200, 2);
  auto c = Classic(dir_ + "/ckpt");
  c["data.train.format"] = "csv";
  c["data.train.path"] = dir_ + "/train.csv";
  c["data.train.label_column"] = "label";
  c["data.train.header"] = "true";
  c["data.eval.format"] = "csv";
  c["data.eval.path"] = dir_ + "/eval.csv";
  c["data.eval.label_column"] = "";
  c["data.eval.header"] = "true";
  c["model.hidden"] = "16";
  c["data.batch_size"] = "16";
  c["training.epochs"] = "4";
  c["training.optimizer.lr"] = "0.02";
  c["training.amp.enabled"] = "true";
  c["training.amp.dtype"] = "bf16";
  auto g = RankGroup::Start(dir_, 2, c);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE((*g)->Wait(absl::Seconds(60))) << (*g)->Describe();
  ASSERT_EQ((*g)->exit_code(0), 0) << (*g)->Describe();
  ASSERT_EQ((*g)->exit_code(1), 0) << (*g)->Describe();
  auto ends = EpochEnds(**g, 0);
  ASSERT_EQ(ends.size(), 4u);
  const double first = std::stod(MetricField(ends.front(), "loss"));
  const double last = std::stod(MetricField(ends.back(), "loss"));
  EXPECT_LT(last, 0.7 * first) << ends.front() << "\n" << ends.back();
  EXPECT_GT(std::stod(MetricField(ends.back(), "eval_accuracy")), 0.85) << ends.back();
  EXPECT_EQ(MetricField(ends.back(), "eval_samples"), "200");
  EXPECT_EQ(MetricField(ends.back(), "loss_scale"), "0");  // bf16: no loss scaling
  // Both ranks report the same (all-reduced) eval numbers.
  auto ends1 = EpochEnds(**g, 1);
  ASSERT_EQ(ends1.size(), 4u);
  EXPECT_EQ(MetricField(ends.back(), "eval_loss"), MetricField(ends1.back(), "eval_loss"));
}

// The parameter checksums a rank logs after each epoch ("parameters
// crc32:... at global step N"), in order.
std::vector<std::string> ParameterChecksums(const RankGroup& g, int rank) {
  std::vector<std::string> out;
  const std::vector<std::string> lines = absl::StrSplit(g.log(rank), '\n');
  for (const std::string& line : lines) {
    const size_t at = line.find("parameters crc32:");
    if (at != std::string::npos) out.push_back(line.substr(at));
  }
  return out;
}

// ddp.comm_hook from the rank config to the bucketer: with each hook the
// ranks stay byte-identical, the 16-bit rounding (PowerSGD's low-rank
// gradients, from ddp.powersgd.start_iter 10 on) changes the parameters,
// and the final eval loss stays within 5% (PowerSGD: 10%) of the run
// without a hook.
TEST_F(RankProcessTest, CommHooksKeepReplicasIdenticalAndLossCloseToNoHook) {
  WriteLearnableCsv(dir_ + "/train.csv", 480, 1);
  WriteLearnableCsv(dir_ + "/eval.csv", 200, 2);
  std::map<std::string, std::pair<std::string, double>> result;  // hook -> (checksum, eval loss)
  for (const char* hook : {"none", "fp16_compress", "bf16_compress", "powersgd"}) {
    SCOPED_TRACE(hook);
    auto c = Classic(dir_ + "/ckpt-" + hook);
    c["data.train.format"] = "csv";
    c["data.train.path"] = dir_ + "/train.csv";
    c["data.train.label_column"] = "label";
    c["data.train.header"] = "true";
    c["data.eval.format"] = "csv";
    c["data.eval.path"] = dir_ + "/eval.csv";
    c["data.eval.label_column"] = "";
    c["data.eval.header"] = "true";
    c["model.hidden"] = "16";
    c["data.batch_size"] = "16";
    c["training.epochs"] = "4";
    c["training.optimizer.lr"] = "0.02";
    c["ddp.comm_hook"] = hook;
    c["ddp.powersgd.start_iter"] = "10";
    std::filesystem::create_directories(dir_ + "/" + hook);
    auto g = RankGroup::Start(dir_ + "/" + hook, 2, c);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE((*g)->Wait(absl::Seconds(60))) << (*g)->Describe();
    ASSERT_EQ((*g)->exit_code(0), 0) << (*g)->Describe();
    ASSERT_EQ((*g)->exit_code(1), 0) << (*g)->Describe();
    const auto sums0 = ParameterChecksums(**g, 0);
    ASSERT_EQ(sums0.size(), 4u) << (*g)->Describe();
    EXPECT_EQ(sums0, ParameterChecksums(**g, 1)) << "replicas differ";
    auto ends = EpochEnds(**g, 0);
    ASSERT_EQ(ends.size(), 4u);
    if (std::string(hook) == "powersgd") {
      EXPECT_THAT((*g)->log(0), HasSubstr("gradient tensors compressed at rank 1"));
    }
    result[hook] = {sums0.back(), std::stod(MetricField(ends.back(), "eval_loss"))};
  }
  const double ref = result["none"].second;
  for (const char* hook : {"fp16_compress", "bf16_compress", "powersgd"}) {
    const double bound = std::string(hook) == "powersgd" ? 0.10 : 0.05;
    EXPECT_NE(result[hook].first, result["none"].first) << hook << " changed nothing";
    EXPECT_LE(std::abs(result[hook].second - ref), bound * ref)
        << hook << ": eval loss " << result[hook].second << " vs " << ref << " without a hook";
    std::cout << hook << ": eval loss " << result[hook].second << ", no hook " << ref << "\n";
  }
}

// Numerical health: rank 0's loss turns NaN at step 13; the gradient
// all-reduce spreads it, so both ranks stop at that step and say so.
TEST_F(RankProcessTest, NanLossOnOneRankFailsEveryRankAtTheSameStep) {
  rankproto::FlatConfig c = Classic(dir_ + "/ckpt");
  c["health.debug_nan_at_step"] = "13";  // epoch 1, after the epoch-0 checkpoint
  auto g = RankGroup::Start(dir_, 2, c);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE((*g)->Wait(absl::Seconds(60))) << (*g)->Describe();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ((*g)->exit_code(r), 1) << (*g)->Describe();
    auto errors = (*g)->LinesWithPrefix(r, "error ");
    ASSERT_EQ(errors.size(), 1u) << (*g)->Describe();
    EXPECT_THAT(errors[0], HasSubstr("error nan:13 NaN/Inf gradients at step 13 (epoch 1)"));
  }
  EXPECT_THAT((*g)->log(0), HasSubstr("health.debug_nan_at_step: a NaN loss at step 13"));
}

// The rollback's second half: with run.skip_steps the same run passes over
// step 13 (the hook's step: it never fires) and finishes with finite weights.
TEST_F(RankProcessTest, SkippedStepIsPassedOverAndTrainingFinishes) {
  const std::string ckpt = dir_ + "/ckpt";
  rankproto::FlatConfig c = Classic(ckpt);
  c["health.debug_nan_at_step"] = "13";
  c["run.skip_steps"] = "13";
  auto g = RankGroup::Start(dir_, 2, c);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE((*g)->Wait(absl::Seconds(60))) << (*g)->Describe();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ((*g)->exit_code(r), 0) << (*g)->Describe();
    EXPECT_THAT((*g)->log(r),
                HasSubstr("skipping step 13 (epoch 1): rolled back after a NaN there"));
    EXPECT_THAT((*g)->log(r), HasSubstr("done: 2 epochs, 20 steps, 1 skipped"));
  }
  for (const auto& [name, p] : LoadParams(ckpt + "/test-job.model.pt")) {
    EXPECT_TRUE(at::isfinite(p).all().item<bool>()) << name;
  }
}

TEST_F(RankProcessTest, BadSkipStepsAreAConfigErrorNamingTheKey) {
  rankproto::FlatConfig c = Classic(dir_ + "/ckpt");
  c["run.skip_steps"] = "3,x";
  auto g = RankGroup::Start(dir_, 1, c);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE((*g)->Wait(absl::Seconds(60))) << (*g)->Describe();
  EXPECT_EQ((*g)->exit_code(0), 2);
  auto errors = (*g)->LinesWithPrefix(0, "error ");
  ASSERT_EQ(errors.size(), 1u) << (*g)->Describe();
  EXPECT_THAT(errors[0], HasSubstr("error config run.skip_steps: 'x' is not a step number"));
}

// A memory hog under a memory limit: a batch of 8192 x 4096 floats (128 MiB
// per copy) with the address space capped 64 MiB above what the rank maps
// after loading (RLIMIT_AS, the run.debug.address_space_limit_mb test hook).
TEST_F(RankProcessTest, BatchTooLargeForTheMemoryLimitIsOutOfMemory) {
  rankproto::FlatConfig c = Classic(dir_ + "/ckpt");
  c["model.input_dim"] = "4096";
  c["data.train.size"] = "4096";
  c["data.train.length"] = "8192";
  c["data.batch_size"] = "8192";
  c["run.debug.address_space_limit_mb"] = "64";
  auto g = RankGroup::Start(dir_, 1, c);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE((*g)->Wait(absl::Seconds(60))) << (*g)->Describe();
  EXPECT_EQ((*g)->exit_code(0), 1) << (*g)->Describe();
  auto errors = (*g)->LinesWithPrefix(0, "error ");
  ASSERT_EQ(errors.size(), 1u) << (*g)->Describe();
  EXPECT_THAT(errors[0], HasSubstr("error out_of_memory rank 0 ran out of memory (peak resident"));
  // Whichever allocation hits the cap first names itself: LibTorch's
  // allocator (the batch) or, on a loaded machine, another one (std::bad_alloc).
  EXPECT_THAT(errors[0], ::testing::AnyOf(HasSubstr("DefaultCPUAllocator: can't allocate memory"),
                                          HasSubstr("std::bad_alloc")));
  EXPECT_THAT(errors[0], HasSubstr("; lower data.batch_size"));
  EXPECT_THAT(errors[0], ::testing::Not(HasSubstr("frame #"))) << "one line, no c10 backtrace";
}

}  // namespace
}  // namespace trainctl::trainer
