#include "worker/engine/data_loader.h"

#include <torch/cuda.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "worker/engine/engine_errors.h"

namespace trainctl::engine {

absl::StatusOr<std::unique_ptr<DataLoader>> DataLoader::Create(
    std::shared_ptr<const Dataset> dataset, std::vector<int64_t> indices,
    const DataLoaderOptions& options) {
  if (dataset == nullptr) return absl::InvalidArgumentError("data loader needs a dataset");
  TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("batch_size", options.batch_size, 1));
  TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("num_workers", options.num_workers, 0));
  TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("prefetch_factor", options.prefetch_factor, 1));
  const int64_t n = dataset->size();
  for (int64_t index : indices) {
    if (index < 0 || index >= n) {
      return absl::OutOfRangeError(
          absl::StrCat("data loader index ", index, " outside the dataset's [0, ", n, ")"));
    }
  }
  std::unique_ptr<DataLoader> loader(
      new DataLoader(std::move(dataset), std::move(indices), options));
  const int workers =
      static_cast<int>(std::min<int64_t>(options.num_workers, loader->num_batches_));
  loader->workers_.reserve(static_cast<size_t>(workers));
  for (int i = 0; i < workers; ++i) {
    loader->workers_.emplace_back([raw = loader.get()] { raw->WorkerLoop(); });
  }
  return loader;
}

namespace {
int64_t CountBatches(int64_t samples, int64_t batch_size, bool drop_last) {
  return drop_last ? samples / batch_size : (samples + batch_size - 1) / batch_size;
}
}  // namespace

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, std::vector<int64_t> indices,
                       const DataLoaderOptions& options)
    : dataset_(std::move(dataset)),
      indices_(std::move(indices)),
      options_(options),
      num_batches_(CountBatches(static_cast<int64_t>(indices_.size()), options.batch_size,
                                options.drop_last)),
      max_in_flight_(static_cast<int64_t>(std::max(options.num_workers, 1)) *
                     options.prefetch_factor),
      pin_(options.pin_memory && torch::cuda::is_available()) {}

DataLoader::~DataLoader() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

absl::StatusOr<Example> DataLoader::BuildBatch(int64_t b) const {
  const int64_t begin = b * options_.batch_size;
  const int64_t end =
      std::min<int64_t>(begin + options_.batch_size, static_cast<int64_t>(indices_.size()));
  try {
    absl::StatusOr<Example> batch = dataset_->GetBatch(
        absl::MakeConstSpan(indices_.data() + begin, static_cast<size_t>(end - begin)));
    if (batch.ok() && pin_) {
      batch->input = batch->input.pin_memory();
      batch->target = batch->target.pin_memory();
    }
    return batch;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("building batch ", b, " failed: ", e.what()));
  }
}

void DataLoader::WorkerLoop() {
  while (true) {
    int64_t b;
    {
      absl::MutexLock lock(&mu_);
      auto can_claim = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || next_to_claim_ >= num_batches_ ||
               next_to_claim_ < next_to_deliver_ + max_in_flight_;
      };
      mu_.Await(absl::Condition(&can_claim));
      if (stopping_ || next_to_claim_ >= num_batches_) return;
      b = next_to_claim_++;
    }
    absl::StatusOr<Example> batch = BuildBatch(b);
    absl::MutexLock lock(&mu_);
    ready_.emplace(b, std::move(batch));
  }
}

absl::StatusOr<std::optional<Example>> DataLoader::Next() {
  if (workers_.empty()) {
    int64_t b;
    {
      absl::MutexLock lock(&mu_);
      if (next_to_deliver_ >= num_batches_) return std::optional<Example>();
      b = next_to_deliver_++;
    }
    absl::StatusOr<Example> batch = BuildBatch(b);
    if (!batch.ok()) return batch.status();
    return std::optional<Example>(*std::move(batch));
  }
  absl::MutexLock lock(&mu_);
  if (next_to_deliver_ >= num_batches_) return std::optional<Example>();
  const int64_t b = next_to_deliver_;
  auto is_ready = [this, b]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ready_.count(b) > 0; };
  mu_.Await(absl::Condition(&is_ready));
  auto it = ready_.find(b);
  absl::StatusOr<Example> batch = std::move(it->second);
  ready_.erase(it);
  ++next_to_deliver_;  // frees one prefetch slot; Await re-evaluates workers' conditions
  if (!batch.ok()) return batch.status();
  return std::optional<Example>(*std::move(batch));
}

}  // namespace trainctl::engine
