#include "worker/trainer/loss_scaler.h"

#include <ATen/ATen.h>

#include "worker/torch_compat.h"

namespace trainctl::trainer {

LossScaler::LossScaler(const LossScalerOptions& options)
    : options_(options), scale_(options.init_scale) {}

at::Tensor LossScaler::Scale(const at::Tensor& loss) const {
  if (!options_.enabled) return loss;
  return loss * scale_;
}

bool LossScaler::Unscale(const std::vector<at::Tensor>& grads) const {
  torch_compat::NoGradGuard no_grad;
  const double inv = 1.0 / scale();
  std::vector<at::Tensor> defined;
  for (const at::Tensor& g : grads) {
    if (g.defined()) defined.push_back(g);
  }
  if (defined.empty()) return false;
  if (defined[0].is_cuda()) {
    // The fused kernel PyTorch's GradScaler uses (CUDA only in 1.13).
    at::Tensor found_inf = at::zeros({1}, defined[0].options().dtype(at::kFloat));
    at::Tensor inv_scale = at::full({1}, inv, defined[0].options().dtype(at::kFloat));
    at::_amp_foreach_non_finite_check_and_unscale_(defined, found_inf, inv_scale);
    return found_inf.item<float>() != 0.0f;
  }
  bool found_inf = false;
  for (at::Tensor& g : defined) {
    if (inv != 1.0) g.mul_(inv);
    if (!found_inf && !at::isfinite(g).all().item<bool>()) found_inf = true;
  }
  return found_inf;
}

void LossScaler::Update(bool found_inf) {
  if (!options_.enabled) return;
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
}

void LossScaler::Restore(double scale, int64_t growth_tracker) {
  scale_ = scale;
  growth_tracker_ = growth_tracker;
}

}  // namespace trainctl::trainer
