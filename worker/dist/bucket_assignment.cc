#include "worker/dist/bucket_assignment.h"

#include <algorithm>
#include <map>

namespace trainctl::dist {

std::vector<BucketSpec> ComputeBucketAssignment(const std::vector<BucketTensorInfo>& tensors,
                                                const std::vector<size_t>& size_limits) {
  struct Open {
    std::vector<size_t> indices;
    size_t bytes = 0;
    size_t limit_index = 0;  // into size_limits, advanced per closed bucket
  };
  std::vector<BucketSpec> result;
  if (size_limits.empty()) return result;
  std::map<std::string, Open> open;
  for (size_t i = 0; i < tensors.size(); ++i) {
    Open& b = open[tensors[i].group];
    b.indices.push_back(i);
    b.bytes += tensors[i].bytes;
    const size_t limit = size_limits[b.limit_index];
    if (b.bytes >= limit) {
      result.push_back(BucketSpec{std::move(b.indices), limit});
      b.indices.clear();
      b.bytes = 0;
      if (b.limit_index + 1 < size_limits.size()) ++b.limit_index;
    }
  }
  for (auto& [group, b] : open) {
    if (!b.indices.empty()) {
      result.push_back(BucketSpec{std::move(b.indices), size_limits[b.limit_index]});
    }
  }
  std::sort(result.begin(), result.end(), [](const BucketSpec& a, const BucketSpec& b) {
    return a.indices.front() < b.indices.front();
  });
  return result;
}

}  // namespace trainctl::dist
