// The trainer's loss (cross-entropy or MSE, in fp32), the up-front check of
// the datasets' targets against the loss, and sharded evaluation (rank r
// evaluates eval samples r, r + W, ...; the sums are all-reduced).
// Threading: the training thread.
#include <torch/nn/functional/loss.h>
#include <torch/torch.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/dist/tensor_collectives.h"
#include "worker/trainer/autocast.h"
#include "worker/trainer/trainer_impl.h"

namespace trainctl::trainer {
namespace {

namespace F = torch::nn::functional;
using trainer_internal::Collective;
using trainer_internal::Config;
using trainer_internal::LossName;

// Adds one eval batch's summed loss (and, for classification, its correct
// predictions) to the sums. Throws what LibTorch throws.
void AddEvalBatch(LossKind loss, const at::Tensor& logits, at::Tensor y, at::Tensor& loss_sum,
                  at::Tensor& correct) {
  if (loss == LossKind::kCrossEntropy) {
    loss_sum.add_(F::cross_entropy(logits, y, F::CrossEntropyFuncOptions().reduction(torch::kSum))
                      .to(at::kDouble));
    correct.add_(logits.argmax(1).eq(y).sum().to(at::kDouble));
    return;
  }
  if (y.dim() == 1 && logits.dim() == 2 && logits.size(1) == 1) y = y.unsqueeze(1);
  at::Tensor per = F::mse_loss(logits, y, F::MSELossFuncOptions().reduction(torch::kNone));
  loss_sum.add_(per.reshape({logits.size(0), -1}).mean(1).sum().to(at::kDouble));
}

}  // namespace

absl::Status Trainer::Impl::CheckTargets() const {
  for (const auto& [name, ds] :
       {std::make_pair("data.train", train), std::make_pair("data.eval", eval)}) {
    if (ds == nullptr) continue;
    if (ds->size() == 0) return Config(absl::StrCat(name, ": the dataset is empty"));
    auto ex = ds->Get(0);
    if (!ex.ok()) return Config(absl::StrCat(name, ": ", ex.status().message()));
    const at::Tensor& t = ex->target;
    if (opt().loss == LossKind::kCrossEntropy && (t.is_floating_point() || t.dim() != 0)) {
      return Config(
          absl::StrCat("training.loss: cross_entropy needs one integer class per sample, but ",
                       name, " has ", c10::toString(t.scalar_type()), " targets of shape ",
                       c10::str(t.sizes()), " (use mse for regression targets)"));
    }
    if (opt().loss == LossKind::kMse && !t.is_floating_point()) {
      return Config(absl::StrCat("training.loss: mse needs float targets, but ", name, " has ",
                                 c10::toString(t.scalar_type()),
                                 " class labels (use cross_entropy)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> Trainer::Impl::Loss(const at::Tensor& output,
                                               const at::Tensor& target) const {
  at::Tensor out = output.scalar_type() == at::kFloat ? output : output.to(at::kFloat);
  try {
    if (opt().loss == LossKind::kCrossEntropy) return F::cross_entropy(out, target);
    at::Tensor y = target;
    if (y.dim() == 1 && out.dim() == 2 && out.size(1) == 1) y = y.unsqueeze(1);
    if (!out.sizes().equals(y.sizes())) {
      return Config(absl::StrCat("training.loss: mse: the model's output has shape ",
                                 c10::str(out.sizes()), " but the targets have shape ",
                                 c10::str(y.sizes())));
    }
    return F::mse_loss(out, y);
  } catch (const std::exception& e) {
    return Config(absl::StrCat("training.loss: ", LossName(opt().loss),
                               " failed on the model's output of shape ", c10::str(out.sizes()),
                               ": ", trainer_internal::FirstLine(e.what())));
  }
}

absl::StatusOr<std::array<double, 3>> Trainer::Impl::Evaluate() {
  const TrainingOptions& o = opt();
  if (comm != nullptr && o.ddp.broadcast_buffers) {
    std::vector<at::Tensor> buffers;
    for (auto& [name, t] : model->NamedBuffers()) buffers.push_back(t);
    if (!buffers.empty()) {
      TRAINCTL_RETURN_IF_ERROR(
          Collective(dist::BroadcastCoalesced(*comm, buffers, 0), "broadcasting buffers for eval"));
    }
  }
  std::vector<int64_t> indices;
  for (int64_t i = setup.rank; i < eval->size(); i += setup.world_size) indices.push_back(i);
  engine::DataLoaderOptions lo;
  lo.batch_size = o.data.batch_size;
  lo.num_workers = o.data.num_workers;
  lo.pin_memory = pin_memory();
  TRAINCTL_ASSIGN_OR_RETURN(auto loader, engine::DataLoader::Create(eval, std::move(indices), lo));

  model->SetTraining(false);
  const auto dopts = at::TensorOptions().dtype(at::kDouble).device(setup.device);
  at::Tensor loss_sum = at::zeros({}, dopts), correct = at::zeros({}, dopts);
  int64_t samples = 0;
  {
    torch::NoGradGuard no_grad;
    while (true) {
      TRAINCTL_ASSIGN_OR_RETURN(std::optional<engine::Example> batch, loader->Next());
      if (!batch.has_value()) break;
      at::Tensor x = batch->input.to(setup.device, lo.pin_memory);
      at::Tensor y = batch->target.to(setup.device, lo.pin_memory);
      absl::StatusOr<at::Tensor> out;
      {
        AutocastGuard autocast(o.amp.enabled, setup.device.type(), AmpDtype());
        out = model->Forward(x);
      }
      if (!out.ok()) {
        model->SetTraining(true);
        return Config(absl::StrCat("data.eval: ", out.status().message()));
      }
      try {
        AddEvalBatch(o.loss, out->to(at::kFloat), y, loss_sum, correct);
      } catch (const std::exception& e) {
        model->SetTraining(true);
        return Config(absl::StrCat("data.eval: ", LossName(o.loss),
                                   " failed: ", trainer_internal::FirstLine(e.what())));
      }
      samples += x.size(0);
    }
  }
  model->SetTraining(true);
  at::Tensor sums =
      at::stack({loss_sum, correct, at::full({}, static_cast<double>(samples), dopts)});
  if (comm != nullptr) {
    TRAINCTL_RETURN_IF_ERROR(
        Collective(dist::AllReduceSum(*comm, sums)->Wait(), "all-reducing eval metrics"));
  }
  at::Tensor cpu = sums.cpu();
  return std::array<double, 3>{cpu[0].item<double>(), cpu[1].item<double>(), cpu[2].item<double>()};
}

}  // namespace trainctl::trainer
