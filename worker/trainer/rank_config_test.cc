#include "worker/trainer/rank_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl::trainer {
namespace {

using ::testing::HasSubstr;

rankproto::FlatConfig Classic() {
  return {
      {"model.name", "mlp"},          {"model.input_dim", "5"},
      {"model.hidden", ""},           {"model.classes", "2"},
      {"data.train.format", "synthetic"}, {"data.train.length", "3000"},
      {"data.train.size", "5"},       {"data.train.classes", "2"},
      {"data.train.seed", "0"},       {"data.batch_size", "30"},
      {"data.shuffle", "true"},       {"data.seed", "0"},
      {"training.epochs", "3"},       {"training.loss", "cross_entropy"},
      {"training.optimizer.name", "adam"}, {"training.optimizer.lr", "0.001"},
      {"run.rank", "1"},              {"run.world_size", "2"},
      {"run.device", "cpu"},          {"run.backend", "gloo"},
      {"run.store_address", "127.0.0.1:1234"}, {"run.checkpoint_dir", "/tmp/x"},
      {"run.store_secret", "0123456789abcdef0123456789abcdef"},
  };
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
  f["data.train.format"] = "idx";
  f["data.train.images"] = "/a";
  f["data.train.labels"] = "/b";
  f["data.eval.format"] = "csv";
  f["data.eval.path"] = "/c.csv";
  f["data.eval.label_column"] = "y";
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
}

}  // namespace
}  // namespace trainctl::trainer
