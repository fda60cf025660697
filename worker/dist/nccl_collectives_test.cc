// NCCL engine. The unique id needs no GPU; everything else is skipped where
// no CUDA device is visible (as c10d's own tests do) and runs on GPU machines.
#include "worker/dist/nccl_collectives.h"

#include <gtest/gtest.h>

#include <vector>

namespace trainctl::dist {
namespace {

bool HaveGpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

TEST(NcclUniqueIdTest, GeneratesDistinct128ByteIds) {
  auto a = GenerateNcclUniqueId();
  if (!a.ok()) GTEST_SKIP() << "ncclGetUniqueId unavailable here: " << a.status();
  auto b = GenerateNcclUniqueId();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->size(), kNcclUniqueIdBytes);
  EXPECT_NE(*a, *b);
}

TEST(NcclCollectivesTest, RejectsBadOptions) {
  NcclOptions o;
  o.unique_id = "short";
  EXPECT_EQ(CreateNcclCollectives(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.unique_id.assign(kNcclUniqueIdBytes, '\0');
  o.rank = 1;
  EXPECT_EQ(CreateNcclCollectives(o).status().code(), absl::StatusCode::kInvalidArgument);
}

class NcclGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
    auto id = GenerateNcclUniqueId();
    ASSERT_TRUE(id.ok()) << id.status();
    id_ = *id;
  }
  std::string id_;
};

TEST_F(NcclGpuTest, SingleRankAllReduceBroadcastBarrierAbort) {
  NcclOptions o;
  o.unique_id = id_;
  o.timeout = absl::Seconds(30);
  auto comm_or = CreateNcclCollectives(o);
  ASSERT_TRUE(comm_or.ok()) << comm_or.status();
  auto comm = *comm_or;
  cudaStream_t compute;
  ASSERT_EQ(cudaStreamCreate(&compute), cudaSuccess);
  comm->set_compute_stream(compute);

  const size_t n = 1 << 20;
  std::vector<float> host(n, 3.0f);
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, compute),
            cudaSuccess);
  CommBuffer b{dev, n, CommDataType::kFloat32, CommDevice::kCuda, nullptr};
  ASSERT_TRUE(comm->AllReduceSum(b)->Wait().ok());
  ASSERT_TRUE(comm->Broadcast(b, 0)->Wait().ok());
  ASSERT_EQ(cudaMemcpyAsync(host.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost, compute),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  EXPECT_EQ(host[0], 3.0f);
  EXPECT_EQ(host[n - 1], 3.0f);
  EXPECT_TRUE(comm->Barrier().ok());

  // Bad buffers are errors, not crashes.
  CommBuffer cpu{host.data(), n, CommDataType::kFloat32, CommDevice::kCuda, nullptr};
  EXPECT_EQ(comm->AllReduceSum(cpu)->Wait().code(), absl::StatusCode::kInvalidArgument);
  CommBuffer wrong_kind{dev, n, CommDataType::kFloat32, CommDevice::kCpu, nullptr};
  EXPECT_EQ(comm->AllReduceSum(wrong_kind)->Wait().code(), absl::StatusCode::kInvalidArgument);

  comm->Abort();
  EXPECT_EQ(comm->AllReduceSum(b)->Wait().code(), absl::StatusCode::kAborted);
  comm.reset();
  cudaFree(dev);
  cudaStreamDestroy(compute);
}

TEST_F(NcclGpuTest, InitTimesOutWhenAPeerNeverJoins) {
  NcclOptions o;
  o.unique_id = id_;
  o.world_size = 2;  // rank 1 never comes
  o.timeout = absl::Seconds(3);
  const absl::Time start = absl::Now();
  auto comm = CreateNcclCollectives(o);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

}  // namespace
}  // namespace trainctl::dist
