#include "worker/engine/data_loader.h"

#include <ATen/Functions.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/dataset.h"
#include "worker/engine/distributed_sampler.h"

namespace trainctl::engine {
namespace {

std::shared_ptr<const Dataset> Arange(int64_t n) {
  // input row i = [i, i + 0.5], target i.
  at::Tensor x = at::arange(n, at::kFloat).unsqueeze(1).repeat({1, 2});
  x.select(1, 1).add_(0.5);
  auto ds = TensorDataset::Create(x, at::arange(n, at::kLong));
  EXPECT_TRUE(ds.ok());
  return std::shared_ptr<const Dataset>(std::move(*ds));
}

std::vector<std::vector<int64_t>> Drain(DataLoader& loader) {
  std::vector<std::vector<int64_t>> batches;
  while (true) {
    auto next = loader.Next();
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok() || !next->has_value()) break;
    const Example& b = **next;
    EXPECT_EQ(b.input.size(0), b.target.size(0));
    EXPECT_TRUE(b.input.select(1, 0).equal(b.target.to(at::kFloat)));
    at::Tensor t = b.target.contiguous();
    batches.emplace_back(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  }
  return batches;
}

std::unique_ptr<DataLoader> MustCreate(std::shared_ptr<const Dataset> ds, std::vector<int64_t> idx,
                                       const DataLoaderOptions& o) {
  auto loader = DataLoader::Create(std::move(ds), std::move(idx), o);
  EXPECT_TRUE(loader.ok()) << loader.status();
  return loader.ok() ? std::move(*loader) : nullptr;
}

TEST(DataLoaderTest, BatchesFollowIndexOrderAndDropLast) {
  auto ds = Arange(20);
  std::vector<int64_t> idx = {9, 3, 7, 1, 0, 19, 4};
  DataLoaderOptions o;
  o.batch_size = 3;
  auto loader = MustCreate(ds, idx, o);
  EXPECT_EQ(loader->num_batches(), 3);
  EXPECT_EQ(Drain(*loader), (std::vector<std::vector<int64_t>>{{9, 3, 7}, {1, 0, 19}, {4}}));
  auto again = loader->Next();  // stays exhausted
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());

  o.drop_last = true;
  loader = MustCreate(ds, idx, o);
  EXPECT_EQ(loader->num_batches(), 2);
  EXPECT_EQ(Drain(*loader), (std::vector<std::vector<int64_t>>{{9, 3, 7}, {1, 0, 19}}));

  loader = MustCreate(ds, {}, o);
  EXPECT_EQ(loader->num_batches(), 0);
  EXPECT_TRUE(Drain(*loader).empty());
}

TEST(DataLoaderTest, OrderIndependentOfNumWorkers) {
  auto ds = Arange(1000);
  auto sampler = DistributedSampler::Create({1000, 3, 1, true, 7, false});
  ASSERT_TRUE(sampler.ok());
  sampler->set_epoch(2);
  const std::vector<int64_t> idx = sampler->Indices();
  DataLoaderOptions o;
  o.batch_size = 7;
  const auto reference = Drain(*MustCreate(ds, idx, o));
  ASSERT_EQ(reference.size(), 48u);  // ceil(334 / 7)
  std::vector<int64_t> flat;
  for (const auto& b : reference) flat.insert(flat.end(), b.begin(), b.end());
  EXPECT_EQ(flat, idx);
  for (int workers : {1, 2, 3, 8}) {
    for (int prefetch : {1, 2, 5}) {
      o.num_workers = workers;
      o.prefetch_factor = prefetch;
      EXPECT_EQ(Drain(*MustCreate(ds, idx, o)), reference)
          << "workers=" << workers << " prefetch=" << prefetch;
    }
  }
}

// Counts GetBatch calls and can be slowed down, to observe prefetching.
class CountingDataset : public Dataset {
 public:
  explicit CountingDataset(std::shared_ptr<const Dataset> inner) : inner_(std::move(inner)) {}
  int64_t size() const override { return inner_->size(); }
  absl::StatusOr<Example> Get(int64_t i) const override { return inner_->Get(i); }
  absl::StatusOr<Example> GetBatch(absl::Span<const int64_t> idx) const override {
    calls.fetch_add(1);
    std::this_thread::sleep_for(delay);
    for (int64_t i : idx) {
      if (i == poison) return absl::DataLossError("poisoned example");
    }
    return inner_->GetBatch(idx);
  }
  mutable std::atomic<int> calls{0};
  std::chrono::milliseconds delay{0};
  int64_t poison = -1;

 private:
  std::shared_ptr<const Dataset> inner_;
};

TEST(DataLoaderTest, PrefetchIsBounded) {
  auto ds = std::make_shared<CountingDataset>(Arange(100));
  std::vector<int64_t> idx(100);
  std::iota(idx.begin(), idx.end(), 0);
  DataLoaderOptions o;
  o.batch_size = 1;
  o.num_workers = 2;
  o.prefetch_factor = 3;
  // Waits (up to 10 s, for loaded CI machines) until `n` batches were built.
  auto wait_for_calls = [&](int n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (ds->calls.load() < n && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // would any overshoot?
  };
  auto loader = MustCreate(ds, idx, o);
  wait_for_calls(6);
  EXPECT_EQ(ds->calls.load(), 6);  // 2 workers x 3 batches, then they wait
  ASSERT_TRUE(loader->Next().ok());
  wait_for_calls(7);
  EXPECT_EQ(ds->calls.load(), 7);
}

TEST(DataLoaderTest, DestroyMidEpochStopsWorkers) {
  auto ds = std::make_shared<CountingDataset>(Arange(1000));
  ds->delay = std::chrono::milliseconds(5);
  std::vector<int64_t> idx(1000);
  std::iota(idx.begin(), idx.end(), 0);
  DataLoaderOptions o;
  o.batch_size = 2;
  o.num_workers = 4;
  auto start = std::chrono::steady_clock::now();
  {
    auto loader = MustCreate(ds, idx, o);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(loader->Next().ok());
  }  // destroyed with ~497 batches left
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_LE(ds->calls.load(), 3 + 4 * 2 + 4);
}

TEST(DataLoaderTest, BatchErrorsArriveInOrder) {
  auto ds = std::make_shared<CountingDataset>(Arange(10));
  ds->poison = 5;
  std::vector<int64_t> idx(10);
  std::iota(idx.begin(), idx.end(), 0);
  for (int workers : {0, 3}) {
    DataLoaderOptions o;
    o.batch_size = 2;
    o.num_workers = workers;
    auto loader = MustCreate(ds, idx, o);
    ASSERT_TRUE(loader->Next().ok());
    ASSERT_TRUE(loader->Next().ok());
    auto bad = loader->Next();  // batch {4, 5}
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << workers;
    auto after = loader->Next();
    ASSERT_TRUE(after.ok());
    EXPECT_EQ((**after).target[0].item<int64_t>(), 6);
  }
}

TEST(DataLoaderTest, PinMemoryIsNoOpWithoutCuda) {
  DataLoaderOptions o;
  o.batch_size = 4;
  o.pin_memory = true;
  o.num_workers = 1;
  auto loader = MustCreate(Arange(8), {0, 1, 2, 3, 4, 5, 6, 7}, o);
  auto b = loader->Next();
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(b->has_value());
  EXPECT_TRUE((**b).input.device().is_cpu());
  EXPECT_EQ((**b).input.size(0), 4);
}

TEST(DataLoaderTest, RejectsBadOptions) {
  auto ds = Arange(4);
  DataLoaderOptions o;
  o.batch_size = 0;
  EXPECT_THAT(std::string(DataLoader::Create(ds, {0}, o).status().message()),
              ::testing::HasSubstr("batch_size"));
  o.batch_size = 1;
  o.num_workers = -1;
  EXPECT_THAT(std::string(DataLoader::Create(ds, {0}, o).status().message()),
              ::testing::HasSubstr("num_workers"));
  o.num_workers = 0;
  o.prefetch_factor = 0;
  EXPECT_THAT(std::string(DataLoader::Create(ds, {0}, o).status().message()),
              ::testing::HasSubstr("prefetch_factor"));
  o.prefetch_factor = 2;
  EXPECT_EQ(DataLoader::Create(ds, {0, 4}, o).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(DataLoader::Create(nullptr, {0}, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainctl::engine
