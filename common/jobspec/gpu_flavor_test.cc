#include "common/jobspec/gpu_flavor.h"

#include <string>

#include "gtest/gtest.h"

namespace trainctl {
namespace {

TEST(NormalizeGpuFlavor, DropsBrandFormFactorAndMemory) {
  EXPECT_EQ(NormalizeGpuFlavor("NVIDIA H100 80GB HBM3"), "h100");
  EXPECT_EQ(NormalizeGpuFlavor("NVIDIA H100 PCIe"), "h100");
  EXPECT_EQ(NormalizeGpuFlavor("NVIDIA H200"), "h200");
  EXPECT_EQ(NormalizeGpuFlavor("NVIDIA A100-SXM4-80GB"), "a100");
  EXPECT_EQ(NormalizeGpuFlavor("NVIDIA A100-PCIE-40GB"), "a100");
  EXPECT_EQ(NormalizeGpuFlavor("Tesla V100-SXM2-16GB"), "v100");
  EXPECT_EQ(NormalizeGpuFlavor("Tesla T4"), "t4");
  EXPECT_EQ(NormalizeGpuFlavor("NVIDIA L40S"), "l40s");
  EXPECT_EQ(NormalizeGpuFlavor("NVIDIA A10G"), "a10g");
  EXPECT_EQ(NormalizeGpuFlavor("NVIDIA GH200 480GB"), "gh200");
}

TEST(NormalizeGpuFlavor, RtxAndGtxKeepTheirModelNumber) {
  EXPECT_EQ(NormalizeGpuFlavor("NVIDIA GeForce RTX 4090"), "rtx4090");
  EXPECT_EQ(NormalizeGpuFlavor("NVIDIA GeForce GTX 1080 Ti"), "gtx1080");
  EXPECT_EQ(NormalizeGpuFlavor("Quadro RTX 8000"), "rtx8000");
  EXPECT_EQ(NormalizeGpuFlavor("NVIDIA RTX A6000"), "rtxa6000");
}

TEST(NormalizeGpuFlavor, NoModelWordGivesNoFlavor) {
  EXPECT_EQ(NormalizeGpuFlavor(""), "");
  EXPECT_EQ(NormalizeGpuFlavor("NVIDIA"), "");
  EXPECT_EQ(NormalizeGpuFlavor("  -- "), "");
}

TEST(NormalizeGpuFlavor, ResultIsAlwaysAValidNameOrEmpty) {
  for (const char* name :
       {"NVIDIA H100 80GB HBM3", "Weird/Name+Chars", ".hidden card", "GeForce RTX", "x"}) {
    const std::string flavor = NormalizeGpuFlavor(name);
    if (!flavor.empty()) {
      EXPECT_EQ(GpuFlavorProblem(flavor), "") << name << " -> " << flavor;
    }
  }
  EXPECT_EQ(NormalizeGpuFlavor("Weird/Name+Chars"), "weirdnamechars");
  EXPECT_EQ(NormalizeGpuFlavor("GeForce RTX"), "rtx");
  EXPECT_EQ(NormalizeGpuFlavor(std::string(200, 'a')).size(), kMaxGpuFlavorLength);
}

TEST(GpuFlavorProblem, NamesWhatIsWrong) {
  EXPECT_EQ(GpuFlavorProblem("h100"), "");
  EXPECT_EQ(GpuFlavorProblem("a100-80gb"), "");
  EXPECT_EQ(GpuFlavorProblem("mi300x_v1.2"), "");
  EXPECT_EQ(GpuFlavorProblem(""), "must not be empty");
  EXPECT_EQ(GpuFlavorProblem("-h100"), "must start with a lowercase letter or a digit");
  EXPECT_EQ(GpuFlavorProblem("H100"), "must start with a lowercase letter or a digit");
  EXPECT_NE(GpuFlavorProblem("h 100").find("only lowercase letters"), std::string::npos);
  EXPECT_EQ(GpuFlavorProblem(std::string(64, 'a')), "must be at most 63 characters");
}

}  // namespace
}  // namespace trainctl
