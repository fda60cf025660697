#include "worker/engine/distributed_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace trainctl::engine {

absl::StatusOr<DistributedSampler> DistributedSampler::Create(
    const DistributedSamplerOptions& options) {
  if (options.dataset_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler dataset_size must be >= 0, got ", options.dataset_size));
  }
  if (options.num_replicas < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler num_replicas must be >= 1, got ", options.num_replicas));
  }
  if (options.rank < 0 || options.rank >= options.num_replicas) {
    return absl::InvalidArgumentError(absl::StrCat("sampler rank must be in [0, ",
                                                   options.num_replicas, "), got ", options.rank));
  }
  return DistributedSampler(options);
}

DistributedSampler::DistributedSampler(const DistributedSamplerOptions& options)
    : options_(options) {
  const int64_t n = options.dataset_size;
  const int64_t r = options.num_replicas;
  if (options.drop_last && n % r != 0) {
    // Python: math.ceil((n - r) / r); n - r may be negative (then 0 samples).
    const int64_t m = n - r;
    num_samples_ = m <= 0 ? 0 : (m + r - 1) / r;
  } else {
    num_samples_ = (n + r - 1) / r;
  }
}

std::vector<int64_t> DistributedSampler::Indices() const {
  const int64_t n = options_.dataset_size;
  std::vector<int64_t> all;
  all.reserve(static_cast<size_t>(std::max(n, total_size())));
  if (options_.shuffle) {
    // Same generator (mt19937 CPU generator) and kernel as Python's
    // torch.randperm(n, generator=g) after g.manual_seed(seed + epoch).
    // createCPUGenerator exists in LibTorch 1.13 and 2.x.
    at::Generator gen =
        at::detail::createCPUGenerator(options_.seed + static_cast<uint64_t>(epoch_));
    at::Tensor perm = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong));
    const int64_t* p = perm.data_ptr<int64_t>();
    all.assign(p, p + n);
  } else {
    for (int64_t i = 0; i < n; ++i) all.push_back(i);
  }
  const int64_t total = total_size();
  if (!options_.drop_last) {
    // Pad cyclically: the list repeated as often as needed (padding may exceed n).
    for (int64_t i = n; i < total && n > 0; ++i) all.push_back(all[static_cast<size_t>(i % n)]);
  } else {
    all.resize(static_cast<size_t>(total));
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  if (n == 0) return mine;
  for (int64_t i = options_.rank; i < total; i += options_.num_replicas) {
    mine.push_back(all[static_cast<size_t>(i)]);
  }
  return mine;
}

}  // namespace trainctl::engine
