// Loads the real Fashion-MNIST (Debian's copy under /usr/share/datasets) and
// runs one rank's epoch through the sampler and loader. Labelled "long";
// skipped where the dataset is not installed.
#include <ATen/Functions.h>

#include <filesystem>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "worker/engine/data_loader.h"
#include "worker/engine/distributed_sampler.h"
#include "worker/engine/idx_dataset.h"

namespace trainctl::engine {
namespace {

const std::string kDir = "/usr/share/datasets/fashion-mnist/";

TEST(FashionMnistTest, LoadsBothSplitsAndIteratesAnEpoch) {
  if (!std::filesystem::exists(kDir + "train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST not installed under " << kDir;
  }
  auto test = LoadIdxDataset(
      {kDir + "t10k-images-idx3-ubyte.gz", kDir + "t10k-labels-idx1-ubyte.gz", 10, 0});
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ((*test)->size(), 10000);
  auto train = LoadIdxDataset(
      {kDir + "train-images-idx3-ubyte.gz", kDir + "train-labels-idx1-ubyte.gz", 10, 0});
  ASSERT_TRUE(train.ok()) << train.status();
  const at::Tensor& x = (*train)->inputs();
  EXPECT_EQ(x.sizes(), (std::vector<int64_t>{60000, 1, 28, 28}));
  EXPECT_GE(x.min().item<float>(), 0.0f);
  EXPECT_LE(x.max().item<float>(), 1.0f);
  // Fashion-MNIST is balanced: 6000 training images per class.
  EXPECT_TRUE(at::bincount((*train)->targets()).equal(at::full({10}, 6000, at::kLong)));

  std::shared_ptr<const Dataset> ds(std::move(*train));
  auto sampler = DistributedSampler::Create({60000, 4, 3, true, 0, false});
  ASSERT_TRUE(sampler.ok());
  sampler->set_epoch(1);
  DataLoaderOptions o;
  o.batch_size = 64;
  o.num_workers = 2;
  auto loader = DataLoader::Create(ds, sampler->Indices(), o);
  ASSERT_TRUE(loader.ok());
  int64_t seen = 0;
  while (true) {
    auto b = (*loader)->Next();
    ASSERT_TRUE(b.ok()) << b.status();
    if (!b->has_value()) break;
    seen += (**b).input.size(0);
  }
  EXPECT_EQ(seen, 15000);
}

}  // namespace
}  // namespace trainctl::engine
