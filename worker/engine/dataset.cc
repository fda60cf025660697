#include "worker/engine/dataset.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>

#include <exception>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/engine/engine_errors.h"

namespace trainctl::engine {

absl::StatusOr<Example> Dataset::GetBatch(absl::Span<const int64_t> indices) const {
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> targets;
  inputs.reserve(indices.size());
  targets.reserve(indices.size());
  for (int64_t index : indices) {
    TRAINCTL_ASSIGN_OR_RETURN(Example e, Get(index));
    inputs.push_back(std::move(e.input));
    targets.push_back(std::move(e.target));
  }
  if (inputs.empty()) return absl::InvalidArgumentError("GetBatch: empty index list");
  try {
    return Example{at::stack(inputs), at::stack(targets)};
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("GetBatch: cannot stack examples: ", e.what()));
  }
}

absl::StatusOr<std::unique_ptr<TensorDataset>> TensorDataset::Create(at::Tensor inputs,
                                                                     at::Tensor targets) {
  if (!inputs.defined() || !targets.defined()) {
    return absl::InvalidArgumentError("dataset inputs and targets must both be tensors");
  }
  if (inputs.dim() == 0 || targets.dim() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset inputs and targets need a leading example dimension, got shapes ",
                     c10::str(inputs.sizes()), " and ", c10::str(targets.sizes())));
  }
  if (inputs.size(0) != targets.size(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset has ", inputs.size(0), " inputs but ", targets.size(0), " targets"));
  }
  return std::unique_ptr<TensorDataset>(
      new TensorDataset(inputs.cpu().contiguous(), targets.cpu().contiguous()));
}

TensorDataset::TensorDataset(at::Tensor inputs, at::Tensor targets)
    : inputs_(std::move(inputs)), targets_(std::move(targets)) {}

int64_t TensorDataset::size() const { return inputs_.size(0); }

absl::StatusOr<Example> TensorDataset::Get(int64_t index) const {
  if (index < 0 || index >= size()) {
    return absl::OutOfRangeError(
        absl::StrCat("dataset index ", index, " outside [0, ", size(), ")"));
  }
  return Example{inputs_[index], targets_[index]};
}

absl::StatusOr<Example> TensorDataset::GetBatch(absl::Span<const int64_t> indices) const {
  const int64_t n = size();
  for (int64_t index : indices) {
    if (index < 0 || index >= n) {
      return absl::OutOfRangeError(absl::StrCat("dataset index ", index, " outside [0, ", n, ")"));
    }
  }
  // from_blob does not copy; index_select copies into fresh contiguous tensors.
  at::Tensor idx = at::from_blob(const_cast<int64_t*>(indices.data()),
                                 {static_cast<int64_t>(indices.size())}, at::kLong);
  return Example{inputs_.index_select(0, idx), targets_.index_select(0, idx)};
}

absl::StatusOr<std::unique_ptr<TensorDataset>> MakeSyntheticDataset(
    const SyntheticDataOptions& options) {
  TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("synthetic length", options.length, 0));
  TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("synthetic size", options.size, 1));
  at::Generator gen = at::detail::createCPUGenerator(options.seed);
  at::Tensor inputs = at::randn({options.length, options.size}, gen);
  at::Tensor targets;
  switch (options.task) {
    case SyntheticTask::kClassification:
      TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("synthetic classes", options.classes, 1));
      targets = at::randint(0, options.classes, {options.length}, gen,
                            at::TensorOptions().dtype(at::kLong));
      break;
    case SyntheticTask::kRegression:
      TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("synthetic target_dim", options.target_dim, 1));
      targets = at::randn({options.length, options.target_dim}, gen);
      break;
  }
  return TensorDataset::Create(std::move(inputs), std::move(targets));
}

}  // namespace trainctl::engine
