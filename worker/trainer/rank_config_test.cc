#include "worker/trainer/rank_config.h"

#include "common/jobspec/job_spec.h"
#include "common/jobspec/spec_bounds.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl::trainer {
namespace {

using ::testing::HasSubstr;

// What the worker writes for a job: every key of the resolved spec (the
// minimal job, common/jobspec/testdata/resolved_defaults.conf, kept equal to
// ResolveJobSpecDefaults by job_defaults_test) and the run keys.
rankproto::FlatConfig ResolvedJob() {
  const char* src = std::getenv("TRAINCTL_SOURCE_DIR");
  auto c = rankproto::ReadConfigFile(
      absl::StrCat(src != nullptr ? src : ".", "/common/jobspec/testdata/resolved_defaults.conf"));
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : rankproto::FlatConfig{};
}

rankproto::FlatConfig Classic() {
  rankproto::FlatConfig c = ResolvedJob();
  for (const auto& [k, v] : rankproto::FlatConfig{
           {"data.train.length", "3000"},
           {"data.batch_size", "30"},
           {"training.epochs", "3"},
           {"run.job_id", "j-1"},
           {"run.attempt", "1"},
           {"run.rank", "1"},
           {"run.local_rank", "1"},
           {"run.world_size", "2"},
           {"run.local_world_size", "2"},
           {"run.device", "cpu"},
           {"run.backend", "gloo"},
           {"run.store_address", "127.0.0.1:1234"},
           {"run.checkpoint_dir", "/tmp/x"},
           {"run.work_dir", "/tmp/w"},
           {"run.status_fd", "3"},
           {"run.timeout_s", "120"},
           {"run.advertise_host", "127.0.0.1"},
           {"run.store_secret", "0123456789abcdef0123456789abcdef"},
       }) {
    c[k] = v;
  }
  return c;
}

TEST(RankConfigTest, ParsesTheClassicExample) {
  auto c = ParseRankConfig(Classic());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.name, "mlp");
  EXPECT_EQ(c->model.mlp.input_dim, 5);
  EXPECT_TRUE(c->model.mlp.hidden_sizes.empty());
  EXPECT_EQ(c->model.mlp.output_dim, 2);
  EXPECT_EQ(c->train.format, DatasetSpec::Format::kSynthetic);
  EXPECT_EQ(c->train.length, 3000);
  EXPECT_FALSE(c->eval.has_value());
  EXPECT_EQ(c->training.data.batch_size, 30);
  EXPECT_EQ(c->training.epochs, 3);
  EXPECT_EQ(c->training.optimizer.kind, OptimizerKind::kAdam);
  EXPECT_EQ(c->training.checkpoint.dir, "/tmp/x");
  EXPECT_EQ(c->training.checkpoint.keep, 2);
  EXPECT_EQ(c->run.rank, 1);
  EXPECT_EQ(c->run.world_size, 2);
  EXPECT_EQ(c->run.backend, "gloo");
  EXPECT_EQ(c->run.num_threads, 1);
}

TEST(RankConfigTest, ParsesCnnIdxEvalAndSchedules) {
  auto f = Classic();
  f["model.name"] = "cnn";
  f["model.classes"] = "10";
  f["model.batch_norm"] = "true";
  f["model.hidden"] = "64";
  f["model.conv1_channels"] = "32";
  f["model.conv2_channels"] = "64";
  f["model.image_size"] = "28";
  f["data.train.format"] = "idx";
  f["data.train.images"] = "/a";
  f["data.train.labels"] = "/b";
  f["data.eval.format"] = "csv";
  f["data.eval.path"] = "/c.csv";
  f["data.eval.label_column"] = "y";
  f["data.eval.header"] = "true";
  f["training.lr_schedule.name"] = "cosine";
  f["training.lr_schedule.warmup_steps"] = "100";
  f["training.amp.enabled"] = "true";
  f["training.amp.dtype"] = "bf16";
  auto c = ParseRankConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.cnn.classes, 10);
  EXPECT_EQ(c->model.cnn.hidden, 64);
  EXPECT_TRUE(c->model.cnn.batch_norm);
  EXPECT_EQ(c->train.images, "/a");
  ASSERT_TRUE(c->eval.has_value());
  EXPECT_EQ(c->eval->format, DatasetSpec::Format::kCsv);
  EXPECT_EQ(c->eval->label_column, "y");
  EXPECT_EQ(c->training.lr_schedule.kind, ScheduleKind::kCosine);
  EXPECT_EQ(c->training.lr_schedule.warmup_steps, 100);
  EXPECT_TRUE(c->training.amp.enabled);
}

void ExpectError(rankproto::FlatConfig f, const std::string& key, const std::string& why) {
  auto c = ParseRankConfig(f);
  ASSERT_FALSE(c.ok()) << key;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(key));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(why));
}

// elastic.keep_global_batch: fewer ranks accumulate more (or take smaller
// micro-batches) so that batch × accumulation × ranks stays the same.
TEST(RankConfigTest, KeepGlobalBatchBelowTheElasticMaximum) {
  auto plan = KeepGlobalBatch(32, 1, 4, 2);
  EXPECT_EQ(plan.batch_size, 32);
  EXPECT_EQ(plan.grad_accumulation, 2);
  EXPECT_TRUE(plan.exact);
  plan = KeepGlobalBatch(30, 1, 3, 2);  // 90 = 15 × 3 × 2
  EXPECT_EQ(plan.batch_size, 15);
  EXPECT_EQ(plan.grad_accumulation, 3);
  EXPECT_TRUE(plan.exact);
  plan = KeepGlobalBatch(7, 1, 3, 2);  // 21 is odd: no exact split over 2 ranks
  EXPECT_EQ(plan.batch_size, 7);
  EXPECT_EQ(plan.grad_accumulation, 2);
  EXPECT_FALSE(plan.exact);
  plan = KeepGlobalBatch(30, 2, 3, 3);  // at the maximum: unchanged
  EXPECT_EQ(plan.batch_size, 30);
  EXPECT_EQ(plan.grad_accumulation, 2);

  rankproto::FlatConfig c = Classic();
  c["world_size"] = "4";
  c["elastic.keep_global_batch"] = "true";  // 30 × 1 × 4 over 2 ranks
  auto rc = ParseRankConfig(c);
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(rc->training.data.batch_size, 30);
  EXPECT_EQ(rc->training.grad_accumulation, 2);
  c["elastic.keep_global_batch"] = "false";
  rc = ParseRankConfig(c);
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(rc->training.grad_accumulation, 1);
}

TEST(RankConfigTest, ErrorsNameTheKey) {
  auto f = Classic();
  f["model.name"] = "resnet";
  ExpectError(f, "model.name", "resnet");
  f = Classic();
  f["model.hidden"] = "64,x";
  ExpectError(f, "model.hidden", "'x'");
  f = Classic();
  f["training.loss"] = "l1";
  ExpectError(f, "training.loss", "cross_entropy, mse");
  f = Classic();
  f["training.optimizer.lr"] = "-1";
  ExpectError(f, "training.optimizer.lr", "> 0");
  f = Classic();
  f["data.batch_size"] = "0";
  ExpectError(f, "data.batch_size", "in [1, ");
  f = Classic();
  f["training.optimizer.momentum"] = "1.5";
  ExpectError(f, "training.optimizer.momentum", "[0, 1)");
  f = Classic();
  f["data.train.format"] = "parquet";
  ExpectError(f, "data.train.format", "parquet");
  f = Classic();
  f.erase("data.train.format");
  ExpectError(f, "data.train.format", "missing");
  f = Classic();
  f["run.rank"] = "2";
  ExpectError(f, "run.rank", "[0, 1]");
  f = Classic();
  f["run.store_address"] = "";
  ExpectError(f, "run.store_address", "rank 0");
  f = Classic();
  f.erase("run.store_secret");
  ExpectError(f, "run.store_secret", "missing");
  f["run.store_secret"] = "short";
  ExpectError(f, "run.store_secret", "16");
  f = Classic();
  f["run.store_port"] = "70000";
  ExpectError(f, "run.store_port", "65535");
  f = Classic();
  f["training.amp.enabled"] = "true";
  f["training.amp.dtype"] = "fp16";
  ExpectError(f, "training.amp.dtype", "cuda");
  f = Classic();
  f["training.lr_schedule.name"] = "step";
  ExpectError(f, "training.lr_schedule.step_size", "> 0");
  f = Classic();
  f["data.train.classes"] = "0";
  ExpectError(f, "data.train.classes", "cross_entropy");
  f = Classic();
  f["training.epochs"] = "three";
  ExpectError(f, "training.epochs", "not an integer");
  f = Classic();
  f["health.divergence.factor"] = "0.5";
  ExpectError(f, "health.divergence.factor", "0 (off) or > 1");
  f = Classic();
  f["ddp.comm_hook"] = "topk";
  ExpectError(f, "ddp.comm_hook", "expected one of none, fp16_compress, bf16_compress, powersgd");
  f = Classic();
  f["ddp.powersgd.min_compression_rate"] = "0.5";
  ExpectError(f, "ddp.powersgd.min_compression_rate", "must be >= 1");
  f = Classic();
  f["ddp.powersgd.rank"] = "0";
  ExpectError(f, "ddp.powersgd.rank", "must be in [1, 1024]");
  f = Classic();
  f["ddp.powersgd.warm_start"] = "maybe";
  ExpectError(f, "ddp.powersgd.warm_start", "");
  f = Classic();
  f["ddp.gradient_as_bucket_view"] = "maybe";
  ExpectError(f, "ddp.gradient_as_bucket_view", "");
}

// ddp.gradient_as_bucket_view as resolved; a spec resolved before the field
// existed trained with the copies, and keeps them.
TEST(RankConfigTest, GradientAsBucketView) {
  for (const auto& [value, want] :
       std::vector<std::pair<std::string, bool>>{{"true", true}, {"false", false}, {"", false}}) {
    auto f = Classic();
    if (value.empty()) {
      ASSERT_EQ(f.erase("ddp.gradient_as_bucket_view"), 1u);
    } else {
      f["ddp.gradient_as_bucket_view"] = value;
    }
    auto c = ParseRankConfig(f);
    ASSERT_TRUE(c.ok()) << value << ": " << c.status();
    EXPECT_EQ(c->training.ddp.gradient_as_bucket_view, want) << value;
  }
}

TEST(RankConfigTest, CommHookNames) {
  for (const auto& [name, hook] : std::vector<std::pair<std::string, dist::CommHook>>{
           {"none", dist::CommHook::kNone},
           {"fp16_compress", dist::CommHook::kFp16Compress},
           {"bf16_compress", dist::CommHook::kBf16Compress},
           {"powersgd", dist::CommHook::kPowerSgd},
           // A spec resolved before the field existed.
           {"unspecified", dist::CommHook::kNone}}) {
    auto f = Classic();
    f["ddp.comm_hook"] = name;
    auto c = ParseRankConfig(f);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
    EXPECT_EQ(c->training.ddp.comm_hook, hook) << name;
  }
}

// The resolved spec's values come through unchanged: the rank has no
// defaults that could disagree with the job's (docs/job-yaml.md).
TEST(RankConfigTest, TakesEveryValueFromTheResolvedSpec) {
  auto c = ParseRankConfig(Classic());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->training.data.shuffle);
  EXPECT_TRUE(c->training.data.pin_memory);
  EXPECT_DOUBLE_EQ(c->training.optimizer.lr, 0.001);
  EXPECT_DOUBLE_EQ(c->training.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c->training.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(c->training.optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c->training.lr_schedule.gamma, 0.1);
  EXPECT_EQ(c->training.amp.dtype, AmpDtype::kBFloat16);
  EXPECT_DOUBLE_EQ(c->training.ddp.bucket_cap_mb, 25);
  EXPECT_TRUE(c->training.ddp.broadcast_buffers);
  EXPECT_EQ(c->training.ddp.comm_hook, dist::CommHook::kNone);
  EXPECT_TRUE(c->training.ddp.gradient_as_bucket_view);
  EXPECT_EQ(c->training.ddp.powersgd.rank, 1);
  EXPECT_EQ(c->training.ddp.powersgd.start_iter, 1000);
  EXPECT_DOUBLE_EQ(c->training.ddp.powersgd.min_compression_rate, 2);
  EXPECT_TRUE(c->training.ddp.powersgd.use_error_feedback);
  EXPECT_TRUE(c->training.ddp.powersgd.warm_start);
  EXPECT_EQ(c->training.checkpoint.every_epochs, 1);
  EXPECT_EQ(c->training.metrics_every_steps, 20);
  EXPECT_DOUBLE_EQ(c->training.health.min_loss_scale, 1e-4);
  EXPECT_EQ(c->training.health.max_skipped_steps, 50);
  EXPECT_DOUBLE_EQ(c->run.timeout_s, 120);
}

// No key the rank reads has a fallback: each one missing is an error naming
// it. (The run keys rank_protocol.h marks optional are the exceptions.)
TEST(RankConfigTest, EveryKeyTheRankReadsIsRequired) {
  const std::vector<std::string> required = {"model.name",
                                             "model.input_dim",
                                             "model.classes",
                                             "model.hidden",
                                             "data.train.format",
                                             "data.train.length",
                                             "data.train.size",
                                             "data.train.classes",
                                             "data.train.target_dim",
                                             "data.train.seed",
                                             "data.batch_size",
                                             "data.shuffle",
                                             "data.seed",
                                             "data.drop_last",
                                             "data.num_workers",
                                             "data.pin_memory",
                                             "training.epochs",
                                             "training.loss",
                                             "training.optimizer.name",
                                             "training.optimizer.lr",
                                             "training.optimizer.weight_decay",
                                             "training.optimizer.momentum",
                                             "training.optimizer.beta1",
                                             "training.optimizer.beta2",
                                             "training.optimizer.eps",
                                             "training.lr_schedule.name",
                                             "training.lr_schedule.warmup_steps",
                                             "training.lr_schedule.step_size",
                                             "training.lr_schedule.gamma",
                                             "training.lr_schedule.min_lr",
                                             "training.grad_accumulation",
                                             "training.max_grad_norm",
                                             "training.amp.enabled",
                                             "training.amp.dtype",
                                             "ddp.bucket_cap_mb",
                                             "ddp.broadcast_buffers",
                                             "ddp.find_unused_parameters",
                                             "ddp.comm_hook",
                                             "checkpoint.every_epochs",
                                             "checkpoint.every_steps",
                                             "checkpoint.keep",
                                             "metrics.every_steps",
                                             "health.min_loss_scale",
                                             "health.max_skipped_steps",
                                             "health.debug_nan_at_step",
                                             "run.world_size",
                                             "run.rank",
                                             "run.local_rank",
                                             "run.local_world_size",
                                             "run.device",
                                             "run.backend",
                                             "run.advertise_host",
                                             "run.work_dir",
                                             "run.status_fd",
                                             "run.timeout_s"};
  for (const std::string& key : required) {
    auto f = Classic();
    ASSERT_EQ(f.erase(key), 1u) << key << " is not in the resolved spec's keys";
    ExpectError(f, key, "missing");
  }
  // checkpoint.dir is read when the worker gives no run.checkpoint_dir; a
  // cnn, csv or tensors config needs its own keys too.
  struct Case {
    rankproto::FlatConfig set;
    std::vector<std::string> erase;
    std::string missing;
  };
  for (const Case& c :
       std::vector<Case>{{{}, {"run.checkpoint_dir", "checkpoint.dir"}, "checkpoint.dir"},
                         {{{"model.name", "cnn"}}, {}, "model.batch_norm"},
                         {{{"data.train.format", "csv"}, {"data.train.path", "/a.csv"}},
                          {},
                          "data.train.label_column"},
                         {{{"data.train.format", "tensors"}, {"data.train.path", "/a.pt"}},
                          {},
                          "data.train.inputs_key"}}) {
    auto f = Classic();
    for (const auto& [k, v] : c.set) f[k] = v;
    for (const std::string& k : c.erase) f.erase(k);
    ExpectError(f, c.missing, "missing");
  }
}

// spec_bounds.h is the one table of integer ranges: the validator (at
// submit) and the rank's parser (at start) refuse the same values, so a job
// accepted at submit is never refused by its ranks for a range.
TEST(SpecBoundsTest, TheValidatorAndTheRanksParserAgreeOnEveryRow) {
  for (const spec_bounds::IntBound& b : spec_bounds::kIntBounds) {
    const std::string key(b.key);
    SCOPED_TRACE(key);
    const bool cnn = key == "model.conv1_channels" || key == "model.conv2_channels" ||
                     key == "model.hidden" || key == "model.image_size";
    const std::string yaml =
        cnn ? "name: j\nmodel: {name: cnn, classes: 10}\n"
              "data: {train: {format: synthetic, length: 100, size: 784, classes: 10}}\n"
            : "name: j\nmodel: {name: mlp, input_dim: 5, classes: 2}\n"
              "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n";
    auto names_key = [&](int64_t v) {
      std::vector<std::string> sets = {absl::StrCat(key, "=", v)};
      if (key == "training.lr_schedule.step_size") sets.push_back("training.lr_schedule.name=step");
      ParsedJobSpec p = ParseJobSpecYaml(yaml, "job.yaml", sets);
      for (const SpecError& e : p.errors) {
        if (e.field == key) return true;
      }
      return false;
    };
    rankproto::FlatConfig f = Classic();
    if (cnn) {
      f["model.name"] = "cnn";
      f["model.classes"] = "10";
      f["model.batch_norm"] = "false";
      f["model.hidden"] = "64";
      f["model.conv1_channels"] = "32";
      f["model.conv2_channels"] = "64";
      f["model.image_size"] = "28";
    }
    auto rank_refuses = [&](int64_t v) {
      rankproto::FlatConfig g = f;
      g[key] = absl::StrCat(v);
      absl::StatusOr<RankConfig> c = ParseRankConfig(g);
      return !c.ok() && absl::StrContains(c.status().message(), key);
    };
    EXPECT_TRUE(names_key(b.hi + 1)) << "the validator takes " << b.hi + 1;
    EXPECT_TRUE(rank_refuses(b.hi + 1)) << "the rank takes " << b.hi + 1;
    EXPECT_FALSE(names_key(b.hi)) << "the validator refuses " << b.hi;
    EXPECT_FALSE(rank_refuses(b.hi)) << "the rank refuses " << b.hi;
    if (b.lo > 0) {
      EXPECT_TRUE(names_key(b.lo - 1) || b.lo - 1 == 0) << "the validator takes " << b.lo - 1;
      EXPECT_TRUE(rank_refuses(b.lo - 1) || key == "training.lr_schedule.step_size")
          << "the rank takes " << b.lo - 1;
    }
  }
}

}  // namespace
}  // namespace trainctl::trainer
