#include "worker/engine/distributed_sampler.h"

#include <algorithm>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/engine/engine_errors.h"

namespace trainctl::engine {

absl::StatusOr<DistributedSampler> DistributedSampler::Create(
    const DistributedSamplerOptions& options) {
  TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("sampler dataset_size", options.dataset_size, 0));
  TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("sampler num_replicas", options.num_replicas, 1));
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

namespace {

// The epoch's global order: randperm(n) from seed + epoch, or 0..n-1.
std::vector<int64_t> EpochOrder(int64_t n, bool shuffle, uint64_t seed) {
  std::vector<int64_t> all;
  if (shuffle) {
    // Same generator (mt19937 CPU generator) and kernel as Python's
    // torch.randperm(n, generator=g) after g.manual_seed(seed + epoch).
    // createCPUGenerator exists in LibTorch 1.13 and 2.x.
    at::Generator gen = at::detail::createCPUGenerator(seed);
    at::Tensor perm = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong));
    const int64_t* p = perm.data_ptr<int64_t>();
    all.assign(p, p + n);
  } else {
    all.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) all.push_back(i);
  }
  return all;
}

// PyTorch's split of `list` over the ranks: pad cyclically (or truncate with
// drop_last) to total, then take list[rank : total : replicas].
std::vector<int64_t> Stride(std::vector<int64_t> list, int64_t total, int64_t rank,
                            int64_t replicas, bool drop_last) {
  const int64_t n = static_cast<int64_t>(list.size());
  std::vector<int64_t> mine;
  if (n == 0) return mine;
  if (!drop_last) {
    // Pad cyclically: the list repeated as often as needed (padding may exceed n).
    for (int64_t i = n; i < total; ++i) list.push_back(list[static_cast<size_t>(i % n)]);
  } else {
    list.resize(static_cast<size_t>(total));
  }
  mine.reserve(static_cast<size_t>(total / replicas));
  for (int64_t i = rank; i < total; i += replicas) mine.push_back(list[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace

std::vector<int64_t> DistributedSampler::Indices() const {
  return Stride(EpochOrder(options_.dataset_size, options_.shuffle,
                           options_.seed + static_cast<uint64_t>(epoch_)),
                total_size(), options_.rank, options_.num_replicas, options_.drop_last);
}

std::vector<int64_t> DistributedSampler::RemainingIndices(int64_t consumed) const {
  const int64_t n = options_.dataset_size;
  consumed = std::clamp<int64_t>(consumed, 0, n);
  std::vector<int64_t> order =
      EpochOrder(n, options_.shuffle, options_.seed + static_cast<uint64_t>(epoch_));
  order.erase(order.begin(), order.begin() + consumed);
  const int64_t left = n - consumed, r = options_.num_replicas;
  const int64_t total = options_.drop_last ? left / r * r : (left + r - 1) / r * r;
  return Stride(std::move(order), total, options_.rank, r, options_.drop_last);
}

}  // namespace trainctl::engine
