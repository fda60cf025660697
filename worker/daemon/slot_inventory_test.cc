#include "worker/daemon/slot_inventory.h"

#include <gtest/gtest.h>

namespace trainctl::worker {
namespace {

TEST(SlotInventoryTest, CpuWhenNoGpu) {
  auto s = ChooseSlots("", 0, {});
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->size(), 1u);
  EXPECT_EQ((*s)[0].kind(), v1::Slot::KIND_CPU);
  EXPECT_EQ(ChooseSlots("", 3, {})->size(), 3u);
  EXPECT_EQ(ChooseSlots("none", 2, {{0, "H200", 1}})->size(), 2u);
}

TEST(SlotInventoryTest, GpusAllOrListed) {
  std::vector<GpuInfo> gpus{{0, "NVIDIA H200", 141LL << 30}, {1, "NVIDIA H200", 141LL << 30}};
  auto all = ChooseSlots("", 0, gpus);
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[1].kind(), v1::Slot::KIND_GPU);
  EXPECT_EQ((*all)[1].name(), "NVIDIA H200");
  auto one = ChooseSlots("1", 0, gpus);
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].index(), 1);
  EXPECT_EQ(ChooseSlots("2", 0, gpus).status().message(),
            "--gpus: GPU 2 is not visible (2 visible)");
  EXPECT_EQ(ChooseSlots("0,0", 0, gpus).status().message(), "--gpus: GPU 0 listed twice");
  EXPECT_EQ(ChooseSlots("x", 0, gpus).status().message(),
            "--gpus: expected all, none or indices like 0,1; got 'x'");
  EXPECT_EQ(ChooseSlots("all", 0, {}).status().message(), "--gpus: no GPU is visible on this host");
  EXPECT_EQ(ChooseSlots("", -1, {}).status().message(), "--slots: must be in [0, 1024], got -1");
}

TEST(SlotInventoryTest, DiscoveryNeverFailsWithoutADriver) {
  // This machine has no NVIDIA driver: an empty list, no crash.
  std::vector<GpuInfo> g = DiscoverGpus();
  for (const GpuInfo& x : g) EXPECT_GE(x.index, 0);
}

}  // namespace
}  // namespace trainctl::worker
