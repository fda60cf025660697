// Bucket assignment for DDP gradient synchronisation: which parameters share
// one flat all-reduce buffer. A pure function, the same algorithm as PyTorch's
// torch.distributed._compute_bucket_assignment_by_size (reducer.cpp), so the
// same parameter list gives the same buckets as in Python. Called by the
// GradientBucketer at construction.
//
// Threading: pure; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace trainctl::dist {

struct BucketTensorInfo {
  size_t bytes = 0;
  // Tensors only share a bucket when their group is equal (dtype + device).
  std::string group;
};

struct BucketSpec {
  // Positions in the input list, ascending.
  std::vector<size_t> indices;
  // The size limit that was in force while the bucket filled.
  size_t size_limit = 0;
};

// Walks `tensors` in order, appending each to the open bucket of its group; a
// bucket closes as soon as its size reaches the current limit, and each group
// then moves on to the next limit in `size_limits` (the last one repeats).
// Buckets come back ordered by their first tensor's position. PyTorch's DDP
// passes limits {_DEFAULT_FIRST_BUCKET_BYTES (1 MiB), bucket_cap}: the first
// bucket stays small so that communication starts early in backward.
// `size_limits` must not be empty.
std::vector<BucketSpec> ComputeBucketAssignment(const std::vector<BucketTensorInfo>& tensors,
                                                const std::vector<size_t>& size_limits);

}  // namespace trainctl::dist
