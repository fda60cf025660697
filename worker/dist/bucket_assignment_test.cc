#include "worker/dist/bucket_assignment.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace trainctl::dist {
namespace {

using ::testing::ElementsAre;

std::vector<BucketTensorInfo> Floats(const std::vector<size_t>& numels,
                                     const std::string& group = "f32") {
  std::vector<BucketTensorInfo> out;
  for (size_t n : numels) out.push_back({n * 4, group});
  return out;
}

// Expected values come from PyTorch 1.13:
//   dist._compute_bucket_assignment_by_size([torch.empty(n) for n in ...], limits)
TEST(BucketAssignmentTest, MatchesPyTorchForOneType) {
  auto b = ComputeBucketAssignment(Floats({100000, 300000, 10, 200000, 50000, 250000, 7}),
                                   {1 << 20, 2 << 20});
  ASSERT_EQ(b.size(), 2u);
  EXPECT_THAT(b[0].indices, ElementsAre(0, 1));
  EXPECT_EQ(b[0].size_limit, 1u << 20);
  EXPECT_THAT(b[1].indices, ElementsAre(2, 3, 4, 5, 6));
  EXPECT_EQ(b[1].size_limit, 2u << 20);
}

TEST(BucketAssignmentTest, MatchesPyTorchForMixedTypes) {
  // [f32 100000, f64 10, f32 300000, f64 200000, f32 5], limits [400000, 1 MiB]
  // -> ([[0], [1, 3], [2], [4]], [400000, 400000, 1048576, 1048576])
  std::vector<BucketTensorInfo> t = {
      {400000, "f32"}, {80, "f64"}, {1200000, "f32"}, {1600000, "f64"}, {20, "f32"}};
  auto b = ComputeBucketAssignment(t, {400000, 1 << 20});
  ASSERT_EQ(b.size(), 4u);
  EXPECT_THAT(b[0].indices, ElementsAre(0));
  EXPECT_THAT(b[1].indices, ElementsAre(1, 3));
  EXPECT_THAT(b[2].indices, ElementsAre(2));
  EXPECT_THAT(b[3].indices, ElementsAre(4));
  EXPECT_EQ(b[0].size_limit, 400000u);
  EXPECT_EQ(b[1].size_limit, 400000u);
  EXPECT_EQ(b[2].size_limit, 1u << 20);
  EXPECT_EQ(b[3].size_limit, 1u << 20);
}

TEST(BucketAssignmentTest, EveryTensorInExactlyOneBucket) {
  auto b = ComputeBucketAssignment(Floats({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}), {8, 16});
  std::vector<int> seen(10, 0);
  for (const auto& bucket : b) {
    for (size_t i : bucket.indices) ++seen[i];
  }
  EXPECT_THAT(seen, ::testing::Each(1));
  // First bucket closes as soon as it reaches 8 bytes: tensors 0 (4 B) and 1 (8 B).
  EXPECT_THAT(b[0].indices, ElementsAre(0, 1));
}

TEST(BucketAssignmentTest, EmptyInputs) {
  EXPECT_TRUE(ComputeBucketAssignment({}, {1 << 20}).empty());
  EXPECT_TRUE(ComputeBucketAssignment(Floats({1}), {}).empty());
}

}  // namespace
}  // namespace trainctl::dist
