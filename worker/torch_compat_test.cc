// worker/torch_compat.h behaves the same on every LibTorch it builds against
// (1.13 on Debian 12, 2.6 on Debian 13; scripts/test-libtorch2.sh runs this
// there too).
#include "worker/torch_compat.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>

#include <string>

#include <gtest/gtest.h>

namespace trainctl::torch_compat {
namespace {

TEST(TorchCompatTest, VersionMacroMatchesTorchVersion) {
  EXPECT_TRUE(TRAINCTL_TORCH_AT_LEAST(TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR));
  EXPECT_FALSE(TRAINCTL_TORCH_AT_LEAST(TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR + 1));
  EXPECT_FALSE(TRAINCTL_TORCH_AT_LEAST(TORCH_VERSION_MAJOR + 1, 0));
  EXPECT_TRUE(TRAINCTL_TORCH_AT_LEAST(1, 13));  // the oldest one built
  const std::string v = TORCH_VERSION;
  EXPECT_EQ(v.substr(0, v.find('.', v.find('.') + 1)),
            std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR));
}

TEST(TorchCompatTest, NoGradGuardTurnsAutogradOffForItsScope) {
  ASSERT_TRUE(c10::GradMode::is_enabled());
  at::Tensor w = at::ones({2}).set_requires_grad(true);
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(c10::GradMode::is_enabled());
    EXPECT_FALSE((w * 2).requires_grad());
  }
  EXPECT_TRUE(c10::GradMode::is_enabled());
  EXPECT_TRUE((w * 2).requires_grad());
}

TEST(TorchCompatTest, AutocastStateRoundTripsPerDevice) {
  const c10::DeviceType cpu = c10::DeviceType::CPU;
  const c10::DeviceType cuda = c10::DeviceType::CUDA;  // thread-local state; no GPU needed
  // torch.autocast's defaults: off, bf16 on CPU, fp16 on CUDA.
  EXPECT_FALSE(IsAutocastEnabled(cpu));
  EXPECT_FALSE(IsAutocastEnabled(cuda));
  EXPECT_EQ(GetAutocastDtype(cpu), at::kBFloat16);
  EXPECT_EQ(GetAutocastDtype(cuda), at::kHalf);
  SetAutocastEnabled(cpu, true);
  EXPECT_TRUE(IsAutocastEnabled(cpu));
  EXPECT_FALSE(IsAutocastEnabled(cuda));  // per device
  SetAutocastDtype(cuda, at::kBFloat16);  // (1.13's CPU autocast takes bf16 only)
  EXPECT_EQ(GetAutocastDtype(cuda), at::kBFloat16);
  EXPECT_EQ(GetAutocastDtype(cpu), at::kBFloat16);
  SetAutocastEnabled(cpu, false);
  SetAutocastDtype(cuda, at::kHalf);
  EXPECT_FALSE(IsAutocastEnabled(cpu));
  EXPECT_EQ(GetAutocastDtype(cuda), at::kHalf);
}

// The same tensor, zeroed, on every LibTorch (2.x's zero_grad() would drop it).
TEST(TorchCompatTest, ZeroGradInPlaceKeepsTheGradientTensor) {
  at::Tensor w = at::ones({3}).set_requires_grad(true);
  torch::optim::Adam adam({w}, torch::optim::AdamOptions(0.1));
  (w * w).sum().backward();
  const void* before = w.grad().data_ptr();
  ZeroGradInPlace(adam);
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().data_ptr(), before);
  EXPECT_TRUE(at::equal(w.grad(), at::zeros({3})));
  (w * w).sum().backward();  // accumulates into the same tensor
  EXPECT_EQ(w.grad().data_ptr(), before);
  EXPECT_TRUE(at::equal(w.grad(), at::full({3}, 2.0)));
}

}  // namespace
}  // namespace trainctl::torch_compat
