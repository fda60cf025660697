// Long test (LABELS long): the examples/fashion-mnist-cnn.yaml job — a small
// CNN with batch norm on the real Fashion-MNIST, 2 ranks over Gloo, Adam,
// cosine schedule with warm-up, evaluated on the 10k test images after every
// epoch — must reach >= 0.90 test accuracy. Minutes on two CPU cores.
#include <chrono>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/trainer/rank_process_test_support.h"

namespace trainctl::trainer {
namespace {

using testing::MetricField;
using testing::RankGroup;

constexpr char kData[] = "/usr/share/datasets/fashion-mnist";

TEST(FashionMnistTrainTest, CnnReaches90PercentTestAccuracyOnTwoRanks) {
  if (!std::filesystem::exists(absl::StrCat(kData, "/train-images-idx3-ubyte.gz"))) {
    GTEST_SKIP() << "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)";
  }
  const std::string dir = testing::MakeTempDir("fashion_mnist");
  rankproto::FlatConfig c = testing::ResolvedJobConfig({
      {"name", "fashion-mnist-cnn"},
      {"model.name", "cnn"},
      {"model.classes", "10"},
      {"model.batch_norm", "true"},
      {"model.conv1_channels", "32"},
      {"model.conv2_channels", "64"},
      {"model.hidden", "128"},
      {"model.image_size", "28"},
      {"data.train.format", "idx"},
      {"data.train.images", absl::StrCat(kData, "/train-images-idx3-ubyte.gz")},
      {"data.train.labels", absl::StrCat(kData, "/train-labels-idx1-ubyte.gz")},
      {"data.eval.format", "idx"},
      {"data.eval.images", absl::StrCat(kData, "/t10k-images-idx3-ubyte.gz")},
      {"data.eval.labels", absl::StrCat(kData, "/t10k-labels-idx1-ubyte.gz")},
      {"data.batch_size", "64"},
      {"data.shuffle", "true"},
      {"data.seed", "0"},
      {"data.drop_last", "false"},
      {"data.num_workers", "2"},
      {"data.pin_memory", "true"},
      {"training.epochs", "3"},
      {"training.loss", "cross_entropy"},
      {"training.optimizer.name", "adam"},
      {"training.optimizer.lr", "0.001"},
      {"training.optimizer.weight_decay", "0"},
      {"training.lr_schedule.name", "cosine"},
      {"training.lr_schedule.warmup_steps", "100"},
      {"training.grad_accumulation", "1"},
      {"training.max_grad_norm", "0"},
      {"training.amp.enabled", "false"},
      {"ddp.bucket_cap_mb", "25"},
      {"ddp.broadcast_buffers", "true"},
      {"ddp.find_unused_parameters", "false"},
      {"ddp.comm_hook", "none"},
      {"checkpoint.every_epochs", "1"},
      {"checkpoint.keep", "2"},
      {"metrics.every_steps", "20"},
      {"run.device", "cpu"},
      {"run.backend", "gloo"},
      {"run.advertise_host", "127.0.0.1"},
      {"run.timeout_s", "300"},
      {"run.checkpoint_dir", dir + "/ckpt"},
  });
  const auto start = std::chrono::steady_clock::now();
  auto g = RankGroup::Start(dir, 2, c, absl::Seconds(120));
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE((*g)->Wait(absl::Minutes(50))) << (*g)->Describe();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ((*g)->exit_code(0), 0) << (*g)->Describe();
  ASSERT_EQ((*g)->exit_code(1), 0) << (*g)->Describe();
  auto ends = (*g)->LinesWithPrefix(0, "metric kind=epoch_end");
  ASSERT_EQ(ends.size(), 3u);
  for (const auto& e : ends) std::cout << e << "\n";
  std::cout << "rank 0 log:\n" << (*g)->log(0) << "\ntrained in " << secs << " s\n";
  EXPECT_EQ(MetricField(ends.back(), "eval_samples"), "10000");
  EXPECT_GE(std::stod(MetricField(ends.back(), "eval_accuracy")), 0.90) << ends.back();
  EXPECT_TRUE(std::filesystem::exists(dir + "/ckpt/model.pt"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trainctl::trainer
