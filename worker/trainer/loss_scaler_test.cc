#include "worker/trainer/loss_scaler.h"

#include <torch/torch.h>

#include <limits>

#include "gtest/gtest.h"

namespace trainctl::trainer {
namespace {

TEST(LossScalerTest, GradScalerDefaults) {
  LossScaler s;
  EXPECT_TRUE(s.enabled());
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  at::Tensor loss = torch::tensor(2.0f);
  EXPECT_FLOAT_EQ(s.Scale(loss).item<float>(), 131072.0f);
}

TEST(LossScalerTest, UnscalesFiniteGradients) {
  LossScaler s;
  at::Tensor g1 = torch::full({3}, 65536.0f);
  at::Tensor g2 = torch::full({2, 2}, -131072.0f);
  EXPECT_FALSE(s.Unscale({g1, g2, at::Tensor()}));
  EXPECT_TRUE(torch::allclose(g1, torch::ones({3})));
  EXPECT_TRUE(torch::allclose(g2, torch::full({2, 2}, -2.0f)));
}

TEST(LossScalerTest, InjectedInfSkipsAndBacksOff) {
  LossScaler s;
  at::Tensor g = torch::ones({4});
  g[2] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(s.Unscale({torch::ones({2}), g}));
  s.Update(/*found_inf=*/true);
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.growth_tracker(), 0);

  at::Tensor n = torch::ones({4});
  n[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(s.Unscale({n}));
  s.Update(true);
  EXPECT_EQ(s.scale(), 16384.0);
}

TEST(LossScalerTest, GrowsAfterIntervalOfCleanStepsAndResetsOnInf) {
  LossScalerOptions o;
  o.growth_interval = 3;
  LossScaler s(o);
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.growth_tracker(), 2);
  s.Update(false);
  EXPECT_EQ(s.scale(), 131072.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  // An inf in the middle restarts the count.
  s.Update(false);
  s.Update(false);
  s.Update(true);
  EXPECT_EQ(s.scale(), 65536.0);
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale(), 65536.0);
  s.Update(false);
  EXPECT_EQ(s.scale(), 131072.0);
}

TEST(LossScalerTest, DefaultGrowthIntervalIs2000) {
  LossScaler s;
  for (int i = 0; i < 1999; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 65536.0);
  s.Update(false);
  EXPECT_EQ(s.scale(), 131072.0);
}

TEST(LossScalerTest, DisabledScalerIsIdentity) {
  LossScalerOptions o;
  o.enabled = false;
  LossScaler s(o);
  EXPECT_EQ(s.scale(), 1.0);
  at::Tensor loss = torch::tensor(3.0f);
  EXPECT_FLOAT_EQ(s.Scale(loss).item<float>(), 3.0f);
  at::Tensor g = torch::full({2}, 5.0f);
  EXPECT_FALSE(s.Unscale({g}));
  EXPECT_TRUE(torch::equal(g, torch::full({2}, 5.0f)));
  s.Update(true);
  EXPECT_EQ(s.scale(), 1.0);
}

TEST(LossScalerTest, RestoreContinuesFromCheckpointedState) {
  LossScalerOptions o;
  o.growth_interval = 2;
  LossScaler s(o);
  s.Restore(1024.0, 1);
  s.Update(false);
  EXPECT_EQ(s.scale(), 2048.0);
}

}  // namespace
}  // namespace trainctl::trainer
