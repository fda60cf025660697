// DistributedSampler: the per-rank index list of PyTorch's
// torch.utils.data.distributed.DistributedSampler, index for index.
//
// The rank process's training loop owns one per dataset split and calls
// set_epoch(e) before each epoch, then Indices() to feed the DataLoader. For
// the same (dataset size, num_replicas, rank, shuffle, seed, epoch, drop_last)
// the indices equal Python's `list(sampler)` (checked against goldens written
// by testdata/gen_sampler_golden.py), so a job moved from torchrun to trainctl
// sees the same samples in the same order on every rank.
//
// Algorithm (as in PyTorch): shuffle -> torch.randperm(n) from a CPU generator
// seeded seed + epoch, else 0..n-1; without drop_last pad by repeating the list
// cyclically up to total_size, with drop_last truncate to total_size; then
// take indices[rank : total_size : num_replicas]. LibTorch's own
// DistributedRandomSampler uses a different scheme and does not match.
//
// Threading: a plain value type; not thread-safe, used by one thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace trainctl::engine {

struct DistributedSamplerOptions {
  int64_t dataset_size = 0;  // >= 0
  int64_t num_replicas = 1;  // world size, >= 1
  int64_t rank = 0;          // in [0, num_replicas)
  bool shuffle = true;
  uint64_t seed = 0;  // shared by all ranks; the permutation uses seed + epoch
  bool drop_last = false;
};

class DistributedSampler {
 public:
  // InvalidArgument naming the field for a negative size, num_replicas < 1 or
  // a rank outside [0, num_replicas).
  static absl::StatusOr<DistributedSampler> Create(const DistributedSamplerOptions& options);

  // Selects the permutation of the coming epoch (PyTorch's set_epoch).
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  // Samples this rank sees per epoch (PyTorch's len(sampler)).
  int64_t num_samples() const { return num_samples_; }
  // num_samples() * num_replicas: the padded or truncated global length.
  int64_t total_size() const { return num_samples_ * options_.num_replicas; }

  // This rank's indices for the current epoch; size() == num_samples().
  std::vector<int64_t> Indices() const;

  // The rest of the current epoch after `consumed` positions of its global
  // order were trained on (possibly at another world size): the epoch's
  // order (the permutation of seed + epoch, unpadded) from position
  // `consumed` on, padded cyclically from its own start (or, with
  // drop_last, truncated) to a multiple of num_replicas, then strided by
  // rank — PyTorch's rule applied to what is left. Over all ranks, each
  // sample of the epoch is thus seen exactly once before and after a
  // change of world size, apart from the end-of-epoch padding. With
  // consumed == 0 this equals Indices(); consumed >= dataset_size leaves
  // nothing. At world size W with per-rank batch b, k steps consume k·b·W
  // positions (rank r took positions r, r+W, ...).
  std::vector<int64_t> RemainingIndices(int64_t consumed) const;

  const DistributedSamplerOptions& options() const { return options_; }

 private:
  explicit DistributedSampler(const DistributedSamplerOptions& options);

  DistributedSamplerOptions options_;
  int64_t num_samples_ = 0;
  int64_t epoch_ = 0;
};

}  // namespace trainctl::engine
