// PowerSGD's state across a checkpoint and resume (issue #49): the
// "powersgd" entry of a checkpoint file, and real trainctl-rank processes
// on loopback (Gloo) that checkpoint while PowerSGD is compressing, are
// stopped (SIGKILL, or a preemption), and resume: the result is bitwise the
// uninterrupted run's on both ranks; without the state it is not; at
// another world size the error feedback starts at zero and the log says so.
// The bucketer's part (save, restore, mismatches) is
// worker/dist/powersgd_state_test.cc.
#include <signal.h>
#include <torch/optim/sgd.h>
#include <torch/script.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/model.h"
#include "worker/trainer/checkpoint.h"
#include "worker/trainer/powersgd_checkpoint.h"
#include "worker/trainer/rank_process_test_support.h"
#include "worker/trainer/trainer.h"

namespace trainctl::trainer {
namespace {

using ::testing::HasSubstr;
using testing::MetricField;
using testing::RankGroup;

// ---------------------------------------------------------------------------
// The "powersgd" entry, in process.

dist::PowerSgdState SampleState() {
  dist::PowerSgdState s;
  s.iter = 42;
  s.rng = "1 2 3";
  s.layout = "bucket 10: 2x5@1";
  s.world_size = 2;
  s.has_q = true;
  s.q = {torch::arange(5, torch::kFloat)};
  s.errors = {{torch::full({10}, 1.5F)}, {torch::full({10}, -2.5F)}};
  return s;
}

// `state` written into an archive and read back for `rank`.
PowerSgdCheckpointRead RoundTrip(const dist::PowerSgdState* state, int rank) {
  torch::serialize::OutputArchive out;
  out.write("something_else", c10::IValue(int64_t{7}));
  if (state != nullptr) WritePowerSgdState(out, *state);
  std::ostringstream bytes;
  out.save_to(bytes);
  const std::string b = bytes.str();
  torch::serialize::InputArchive in;
  in.load_from(b.data(), b.size());
  PowerSgdCheckpointRead read;
  read.rank = rank;
  ReadPowerSgdState(in, &read);
  return read;
}

TEST(PowerSgdCheckpointTest, EachRankReadsItsOwnErrorAndTheSharedState) {
  const dist::PowerSgdState s = SampleState();
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    PowerSgdCheckpointRead r = RoundTrip(&s, rank);
    ASSERT_TRUE(r.state.has_value()) << r.unreadable;
    EXPECT_EQ(r.unreadable, "");
    EXPECT_EQ(r.state->iter, 42);
    EXPECT_EQ(r.state->rng, "1 2 3");
    EXPECT_EQ(r.state->layout, s.layout);
    EXPECT_EQ(r.state->world_size, 2);
    EXPECT_TRUE(r.state->has_q);
    ASSERT_EQ(r.state->q.size(), 1u);
    EXPECT_TRUE(torch::equal(r.state->q[0], s.q[0]));
    ASSERT_EQ(r.state->errors.size(), 2u);
    ASSERT_EQ(r.state->errors[rank].size(), 1u);
    EXPECT_TRUE(torch::equal(r.state->errors[rank][0], s.errors[rank][0]));
    EXPECT_TRUE(r.state->errors[1 - rank].empty()) << "another rank's error was read";
  }
  // A rank outside the saving world gets the shared part and no error.
  PowerSgdCheckpointRead r = RoundTrip(&s, 3);
  ASSERT_TRUE(r.state.has_value());
  for (const auto& row : r.state->errors) EXPECT_TRUE(row.empty());
}

TEST(PowerSgdCheckpointTest, AbsentOrMalformedEntryIsReportedNeverThrown) {
  PowerSgdCheckpointRead absent = RoundTrip(nullptr, 0);
  EXPECT_FALSE(absent.state.has_value());
  EXPECT_EQ(absent.unreadable, "");

  dist::PowerSgdState no_errors = SampleState();
  no_errors.errors.clear();
  PowerSgdCheckpointRead r = RoundTrip(&no_errors, 0);
  ASSERT_TRUE(r.state.has_value());
  EXPECT_TRUE(r.state->errors.empty());

  // Rank 1's row is missing although the entry says every row follows.
  dist::PowerSgdState torn = SampleState();
  torn.errors[1].clear();
  PowerSgdCheckpointRead t = RoundTrip(&torn, 1);
  EXPECT_FALSE(t.state.has_value());
  EXPECT_THAT(t.unreadable, HasSubstr("unreadable"));
  EXPECT_TRUE(RoundTrip(&torn, 0).state.has_value());

  dist::PowerSgdState negative = SampleState();
  negative.world_size = 0;
  PowerSgdCheckpointRead n = RoundTrip(&negative, 0);
  EXPECT_FALSE(n.state.has_value());
  EXPECT_THAT(n.unreadable, HasSubstr("world size"));
}

// ---------------------------------------------------------------------------
// Real rank processes.

class PowerSgdResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("powersgd_resume");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  // The classic example with a hidden layer of 8 (its 8x5 weight is
  // compressed at rank 1; the rest travels whole), SGD with momentum, two
  // epochs of 20 steps on two ranks; PowerSGD from step 3, with error
  // feedback and warm start (the defaults).
  rankproto::FlatConfig Base(const std::string& ckpt) const {
    return testing::ResolvedJobConfig({
        {"name", "powersgd-resume"},
        {"model.name", "mlp"},
        {"model.input_dim", "5"},
        {"model.hidden", "8"},
        {"model.classes", "2"},
        {"data.train.format", "synthetic"},
        {"data.train.length", "600"},
        {"data.train.size", "5"},
        {"data.train.classes", "2"},
        {"data.train.seed", "0"},
        {"data.batch_size", "15"},
        {"data.shuffle", "true"},
        {"data.seed", "0"},
        {"data.num_workers", "0"},
        {"training.epochs", "2"},
        {"training.loss", "cross_entropy"},
        {"training.optimizer.name", "sgd"},
        {"training.optimizer.lr", "0.05"},
        {"training.optimizer.momentum", "0.9"},
        {"ddp.comm_hook", "powersgd"},
        {"ddp.powersgd.start_iter", "3"},
        {"ddp.powersgd.rank", "1"},
        {"checkpoint.every_epochs", "1"},
        {"checkpoint.keep", "100"},
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

  static rankproto::FlatConfig ResumeFrom(rankproto::FlatConfig c, const std::string& path) {
    c["run.resume_from"] = path;
    c["run.resume_job_id"] = "test-job";
    c["run.attempt"] = "2";
    return c;
  }

  // Runs `config` on `world` ranks (working dir dir_/sub) to the end.
  void RunToSuccess(const std::string& sub, const rankproto::FlatConfig& config,
                    std::unique_ptr<RankGroup>* out, int world = 2) {
    std::filesystem::create_directories(dir_ + "/" + sub);
    auto g = RankGroup::Start(dir_ + "/" + sub, world, config);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE((*g)->Wait(absl::Seconds(90))) << (*g)->Describe();
    for (int r = 0; r < world; ++r) ASSERT_EQ((*g)->exit_code(r), 0) << (*g)->Describe();
    *out = std::move(*g);
  }

  // The uninterrupted run (once per test); its final parameter checksum.
  void RunFull() {
    ASSERT_NO_FATAL_FAILURE(RunToSuccess("full", Base(dir_ + "/full"), &full_));
    full_sums_ = Checksums(*full_, 0);
    ASSERT_EQ(full_sums_.size(), 2u) << full_->Describe();
    EXPECT_EQ(Checksums(*full_, 1), full_sums_);
    EXPECT_THAT(full_->log(0), HasSubstr("gradient tensors compressed at rank 1"));
  }

  // The parameter checksums a rank logs after each epoch.
  static std::vector<std::string> Checksums(const RankGroup& g, int rank) {
    std::vector<std::string> out;
    const std::vector<std::string> lines = absl::StrSplit(g.log(rank), '\n');
    for (const std::string& line : lines) {
      const size_t at = line.find("parameters crc32:");
      if (at != std::string::npos) out.push_back(line.substr(at));
    }
    return out;
  }

  // The final model's parameters are the same bytes as the full run's.
  void ExpectFullRunsModel(const std::string& model_path) {
    auto a = LoadParams(dir_ + "/full/test-job.model.pt");
    auto b = LoadParams(model_path);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_FALSE(a.empty());
    for (const auto& [name, t] : a) {
      ASSERT_TRUE(b.count(name)) << name;
      EXPECT_EQ(t.sizes(), b[name].sizes());
      EXPECT_EQ(std::memcmp(t.data_ptr(), b[name].data_ptr(), t.nbytes()), 0) << name;
    }
  }

  static std::map<std::string, at::Tensor> LoadParams(const std::string& path) {
    std::map<std::string, at::Tensor> out;
    torch::jit::Module m = torch::jit::load(path);
    for (const auto& p : m.named_parameters()) {
      out[p.name] = p.value.detach().contiguous().clone();
    }
    return out;
  }

  std::string dir_;
  std::unique_ptr<RankGroup> full_;
  std::vector<std::string> full_sums_;
};

// Copies the checkpoint at `from` to `dir` without its PowerSGD state (a
// checkpoint as an older trainctl wrote it), through the checkpoint API;
// `read` gets the state rank `rank` found in it. Returns the new path.
std::string WithoutPowerSgd(const std::string& from, const std::string& dir, int rank,
                            PowerSgdCheckpointRead* read) {
  engine::ModelOptions mo;
  mo.name = "mlp";
  mo.mlp.hidden_sizes = {8};
  auto model = engine::CreateModel(mo);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return "";
  torch::optim::SGD optimizer((*model)->Parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto bytes = ReadCheckpointBytes(from, "");
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return "";
  read->rank = rank;
  auto position =
      LoadCheckpoint(*bytes, from, {}, **model, optimizer, c10::Device(c10::kCPU), read);
  EXPECT_TRUE(position.ok()) << position.status();
  if (!position.ok()) return "";
  CheckpointManifest manifest;
  manifest.job_id = "test-job";
  manifest.attempt = 1;
  auto written = WriteCheckpoint(dir, 0, manifest, *position, **model, optimizer);
  EXPECT_TRUE(written.ok()) << written.status();
  return written.ok() ? written->path : "";
}

// A checkpoint at step 13 (PowerSGD compressing since step 3), both ranks
// SIGKILLed after it, resumed to step 40: bitwise the uninterrupted run, on
// both ranks. The same checkpoint without its PowerSGD state resumes to
// other parameters; at world size 1 it resumes with the error at zero.
TEST_F(PowerSgdResumeTest, KilledAndResumedFromAStepCheckpointIsBitwiseTheUninterruptedRun) {
  ASSERT_NO_FATAL_FAILURE(RunFull());

  const std::string ckpt = dir_ + "/killed";
  auto slow = Base(ckpt);
  slow["checkpoint.every_steps"] = "13";
  slow["run.debug.step_sleep_ms"] = "25";
  std::string path;
  {
    std::filesystem::create_directories(dir_ + "/b");
    auto g = RankGroup::Start(dir_ + "/b", 2, slow);
    ASSERT_TRUE(g.ok()) << g.status();
    // "checkpoint <epochs> <global step> <bytes> <checksum> <consumed> <path>"
    ASSERT_TRUE((*g)->WaitForLine(
        [&path](int rank, const std::string& line) {
          std::vector<std::string> w = absl::StrSplit(line, ' ');
          if (rank != 0 || w.size() != 7 || w[0] != "checkpoint" || w[2] != "13") return false;
          path = w[6];
          return true;
        },
        absl::Seconds(60)))
        << (*g)->Describe();
    (*g)->Signal(SIGKILL);
    (*g)->Wait(absl::Seconds(10));
    EXPECT_EQ((*g)->exit_code(0), -SIGKILL);
  }
  ASSERT_FALSE(std::filesystem::exists(ckpt + "/test-job.model.pt")) << "killed too late";

  // The file holds PowerSGD's state: the count, Q, and each rank's own
  // error (they differ: each rank compressed its own gradients).
  PowerSgdCheckpointRead r0, r1;
  const std::string stripped = WithoutPowerSgd(path, dir_ + "/stripped", 0, &r0);
  WithoutPowerSgd(path, dir_ + "/stripped1", 1, &r1);
  ASSERT_TRUE(r0.state.has_value() && r1.state.has_value()) << r0.unreadable << r1.unreadable;
  EXPECT_EQ(r0.state->iter, 13);
  EXPECT_EQ(r0.state->world_size, 2);
  EXPECT_TRUE(r0.state->has_q);
  ASSERT_FALSE(r0.state->errors.at(0).empty());
  ASSERT_FALSE(r1.state->errors.at(1).empty());
  EXPECT_FALSE(torch::equal(r0.state->errors[0][0], r1.state->errors[1][0]));
  EXPECT_TRUE(torch::equal(r0.state->q[0], r1.state->q[0]));

  std::unique_ptr<RankGroup> g;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess("c", ResumeFrom(Base(ckpt), path), &g));
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(g->log(r),
                HasSubstr("powersgd: resumed at step 13 (warm-up over), Q restored with this "
                          "rank's error feedback"));
  }
  const auto sums = Checksums(*g, 0);
  ASSERT_FALSE(sums.empty());
  EXPECT_EQ(sums, Checksums(*g, 1)) << "replicas differ";
  EXPECT_EQ(sums.back(), full_sums_.back());
  ExpectFullRunsModel(ckpt + "/test-job.model.pt");

  // Without the state: the run goes on, says why, and ends elsewhere.
  std::unique_ptr<RankGroup> old;
  auto from_old = ResumeFrom(Base(dir_ + "/stripped"), stripped);
  ASSERT_NO_FATAL_FAILURE(RunToSuccess("d", from_old, &old));
  EXPECT_THAT(old->log(0), HasSubstr("powersgd: the checkpoint holds no PowerSGD state"));
  EXPECT_THAT(old->log(0), HasSubstr("warm-up of 3 plain steps runs again"));
  const auto old_sums = Checksums(*old, 0);
  ASSERT_FALSE(old_sums.empty());
  EXPECT_EQ(old_sums, Checksums(*old, 1));
  EXPECT_NE(old_sums.back(), full_sums_.back()) << "the state made no difference";

  // One rank: the count and Q carry over, the two ranks' errors cannot.
  std::unique_ptr<RankGroup> one;
  auto single = ResumeFrom(Base(dir_ + "/single"), path);
  ASSERT_NO_FATAL_FAILURE(RunToSuccess("e", single, &one, /*world=*/1));
  EXPECT_THAT(one->log(0), HasSubstr("powersgd: resumed at step 13 (warm-up over), Q restored; "
                                     "the error feedback was saved by 2 ranks, this attempt "
                                     "has 1: it starts at zero"));
}

// The preemption path: both ranks agree on a step, gather PowerSGD's state
// there, the writer saves it, and the resume is bitwise the uninterrupted
// run.
TEST_F(PowerSgdResumeTest, PreemptionCheckpointCarriesTheStateAndResumesExactly) {
  ASSERT_NO_FATAL_FAILURE(RunFull());
  const std::string ckpt = dir_ + "/preempted";
  const std::string marker = dir_ + "/rank.preempted";
  auto slow = Base(ckpt);
  slow["checkpoint.every_epochs"] = "0";
  slow["run.debug.step_sleep_ms"] = "20";
  slow["run.preempt_file"] = marker;
  {
    std::filesystem::create_directories(dir_ + "/b");
    auto g = RankGroup::Start(dir_ + "/b", 2, slow);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE((*g)->WaitForLine(
        [](int rank, const std::string& line) {
          return rank == 1 && absl::StartsWith(line, "metric kind=train") &&
                 MetricField(line, "step") == "5";
        },
        absl::Seconds(60)))
        << (*g)->Describe();
    std::ofstream(marker).close();
    (*g)->Signal(SIGTERM);
    ASSERT_TRUE((*g)->Wait(absl::Seconds(30))) << (*g)->Describe();
    for (int r = 0; r < 2; ++r) EXPECT_EQ((*g)->exit_code(r), 128 + SIGTERM) << (*g)->Describe();
    EXPECT_THAT((*g)->log(0), HasSubstr("checkpoint written"));
    EXPECT_THAT((*g)->log(1), HasSubstr("preempted"));
  }
  const std::string latest = LatestCheckpoint(ckpt, "test-job");
  ASSERT_FALSE(latest.empty()) << "the preemption wrote the only checkpoint";
  PowerSgdCheckpointRead read;
  WithoutPowerSgd(latest, dir_ + "/unused", 1, &read);
  ASSERT_TRUE(read.state.has_value()) << read.unreadable;
  EXPECT_GT(read.state->iter, 3);
  ASSERT_FALSE(read.state->errors.at(1).empty());

  std::unique_ptr<RankGroup> g;
  ASSERT_NO_FATAL_FAILURE(RunToSuccess("c", ResumeFrom(Base(ckpt), latest), &g));
  EXPECT_THAT(g->log(1), HasSubstr("Q restored with this rank's error feedback"));
  const auto sums = Checksums(*g, 0);
  ASSERT_FALSE(sums.empty());
  EXPECT_EQ(sums, Checksums(*g, 1));
  EXPECT_EQ(sums.back(), full_sums_.back());
  ExpectFullRunsModel(ckpt + "/test-job.model.pt");
}

}  // namespace
}  // namespace trainctl::trainer
