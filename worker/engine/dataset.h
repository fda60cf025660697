// Dataset: what the training engine trains on — (input, target) examples by
// index — plus the in-memory TensorDataset every built-in format loads into
// and the seeded synthetic dataset of the classic DDP example.
//
// Callers: the rank process builds one Dataset per split from the job spec
// (via the loaders here and in idx_dataset.h, csv_dataset.h,
// tensor_file_dataset.h) and hands it to DataLoader, which gathers batches
// with GetBatch. Every loader reads the whole dataset up front into two
// contiguous CPU tensors, so batching is one index_select per tensor and no
// I/O happens during training.
//
// Threading: a Dataset is immutable after construction; Get/GetBatch are
// const and safe to call from several DataLoader workers at once.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace trainctl::engine {

// One example, or a batch of them (leading dimension = batch).
struct Example {
  at::Tensor input;
  at::Tensor target;
};

class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual int64_t size() const = 0;

  // The example at `index`; OutOfRange when index is outside [0, size()).
  virtual absl::StatusOr<Example> Get(int64_t index) const = 0;

  // The examples at `indices`, stacked along a new leading dimension.
  // The default stacks Get(); TensorDataset gathers with index_select.
  virtual absl::StatusOr<Example> GetBatch(absl::Span<const int64_t> indices) const;
};

// Inputs and targets held as two contiguous CPU tensors whose first
// dimension is the example index.
class TensorDataset final : public Dataset {
 public:
  // InvalidArgument when a tensor is undefined, 0-dimensional, or the two
  // first dimensions differ. Makes both tensors contiguous.
  static absl::StatusOr<std::unique_ptr<TensorDataset>> Create(at::Tensor inputs,
                                                               at::Tensor targets);

  int64_t size() const override;
  absl::StatusOr<Example> Get(int64_t index) const override;
  absl::StatusOr<Example> GetBatch(absl::Span<const int64_t> indices) const override;

  const at::Tensor& inputs() const { return inputs_; }
  const at::Tensor& targets() const { return targets_; }

 private:
  TensorDataset(at::Tensor inputs, at::Tensor targets);

  at::Tensor inputs_;   // contiguous, size(0) == targets_.size(0)
  at::Tensor targets_;  // contiguous
};

// The classic DDP example's RandomDataset: `length` samples of `size`
// standard-normal features, reproducible from `seed`. Equivalent Python:
//   g = torch.Generator(); g.manual_seed(seed)
//   inputs = torch.randn(length, size, generator=g)
//   targets = torch.randint(0, classes, (length,), generator=g)       # classification
//   targets = torch.randn(length, target_dim, generator=g)           # regression
enum class SyntheticTask {
  kClassification,  // int64 targets in [0, classes), shape [length]
  kRegression,      // float32 targets, shape [length, target_dim]
};

struct SyntheticDataOptions {
  int64_t length = 100;  // number of samples, >= 0
  int64_t size = 5;      // features per sample, >= 1
  uint64_t seed = 0;
  SyntheticTask task = SyntheticTask::kClassification;
  int64_t classes = 2;     // classification only, >= 1
  int64_t target_dim = 2;  // regression only, >= 1
};

// InvalidArgument naming the field for out-of-range options.
absl::StatusOr<std::unique_ptr<TensorDataset>> MakeSyntheticDataset(
    const SyntheticDataOptions& options);

}  // namespace trainctl::engine
