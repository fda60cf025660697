#include "worker/daemon/slot_inventory.h"

#include <gtest/gtest.h>

#include "common/jobspec/gpu_flavor.h"

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

TEST(SlotInventoryTest, GpuSlotsCarryAFlavorCpuSlotsNone) {
  std::vector<GpuInfo> gpus{{0, "NVIDIA H100 80GB HBM3", 80LL << 30},
                            {1, "NVIDIA A100-SXM4-80GB", 80LL << 30}};
  // Default: each GPU's name normalized.
  auto detected = ChooseSlots("", 0, gpus);
  ASSERT_TRUE(detected.ok()) << detected.status();
  EXPECT_EQ((*detected)[0].flavor(), "h100");
  EXPECT_EQ((*detected)[1].flavor(), "a100");
  // --gpu-flavor names every GPU slot's flavor.
  auto named = ChooseSlots("0", 0, gpus, "h100-sxm");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ((*named)[0].flavor(), "h100-sxm");
  EXPECT_EQ((*named)[0].name(), "NVIDIA H100 80GB HBM3");
  // CPU slots have none.
  EXPECT_EQ((*ChooseSlots("", 2, {}))[1].flavor(), "");
  EXPECT_EQ(ChooseSlots("none", 2, gpus, "h100").status().message(),
            "--gpu-flavor: this worker offers CPU slots (--gpus none), and CPU slots have no "
            "flavor; leave "
            "--gpu-flavor out");
  EXPECT_EQ(ChooseSlots("", 0, {}, "h100").status().message(),
            "--gpu-flavor: this worker offers CPU slots (no GPU is visible), and CPU slots have no "
            "flavor; "
            "leave --gpu-flavor out");
  EXPECT_EQ(
      ChooseSlots("", 2, gpus, "h100").status().message(),
      "--gpu-flavor: this worker offers CPU slots (--slots), and CPU slots have no flavor; leave "
      "--gpu-flavor out");
  EXPECT_EQ(ChooseSlots("", 0, gpus, "H100").status().message(),
            "--gpu-flavor: must start with a lowercase letter or a digit, got 'H100'");
}

TEST(SlotInventoryTest, DiscoveryNeverFailsWithoutADriver) {
  // This machine has no NVIDIA driver: an empty list, no crash.
  std::vector<GpuInfo> g = DiscoverGpus();
  for (const GpuInfo& x : g) EXPECT_GE(x.index, 0);
}

// On a GPU machine: every GPU NVML names gets a valid flavor by default
// (the names the normalization rule was written for are real ones).
TEST(SlotInventoryTest, DiscoveredGpusGetAValidFlavor) {
  std::vector<GpuInfo> gpus = DiscoverGpus();
  if (gpus.empty()) GTEST_SKIP() << "no GPU visible through NVML";
  auto slots = ChooseSlots("", 0, gpus);
  ASSERT_TRUE(slots.ok()) << slots.status();
  for (const v1::Slot& s : *slots) {
    EXPECT_FALSE(s.flavor().empty()) << s.name();
    EXPECT_EQ(trainctl::GpuFlavorProblem(s.flavor()), "") << s.name() << " -> " << s.flavor();
  }
}

}  // namespace
}  // namespace trainctl::worker
