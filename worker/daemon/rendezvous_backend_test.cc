#include "worker/daemon/rendezvous_backend.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/nccl_id.h"

namespace trainctl::worker {
namespace {

namespace rk = rankproto::run_keys;

// True when nobody else holds `port` (a bind without SO_REUSEADDR succeeds).
bool PortFree(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

TEST(RendezvousBackend, GlooReservesRankZerosStorePortAndReportsItOnce) {
  std::unique_ptr<RendezvousBackend> b = MakeRendezvousBackend(/*gpu=*/false, /*command=*/false);
  absl::StatusOr<std::optional<v1::RendezvousInfo>> made = b->Produce("10.0.0.7");
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_TRUE(made->has_value());
  const v1::RendezvousInfo& info = **made;
  ASSERT_GT(info.master_port(), 0);
  EXPECT_EQ(info.gloo_store_address(), absl::StrCat("10.0.0.7:", info.master_port()));
  EXPECT_EQ(info.master_addr(), "10.0.0.7");
  EXPECT_TRUE(info.nccl_unique_id().empty());
  // Held for rank 0's store until it listens.
  EXPECT_FALSE(PortFree(info.master_port()));
  EXPECT_FALSE(b->RankListening(info.gloo_store_address())->has_value());  // Already reported.
  EXPECT_TRUE(PortFree(info.master_port()));
}

TEST(RendezvousBackend, GlooRankZeroGetsItsPortTheOthersTheAddress) {
  std::unique_ptr<RendezvousBackend> b = MakeRendezvousBackend(false, false);
  v1::RendezvousInfo info;
  info.set_gloo_store_address("10.0.0.7:2345");
  info.set_master_addr("10.0.0.7");
  info.set_master_port(2345);
  rankproto::FlatConfig zero, other, self_chosen;
  b->ConfigureRank(info, /*rank_zero_here=*/true, zero);
  EXPECT_EQ(zero[rk::kStorePort], "2345");
  EXPECT_EQ(zero.count(rk::kStoreAddress), 0u);
  b->ConfigureRank(info, /*rank_zero_here=*/false, other);
  EXPECT_EQ(other[rk::kStoreAddress], "10.0.0.7:2345");
  EXPECT_EQ(other.count(rk::kNcclUniqueId), 0u);
  // Before any rendezvous (rank 0 picks its own port): an empty address.
  b->ConfigureRank(std::nullopt, true, self_chosen);
  EXPECT_EQ(self_chosen.at(rk::kStoreAddress), "");
}

TEST(RendezvousBackend, AStoreAddressRankZeroReportsIsReportedWhenNoneWasMade) {
  // The path a host that refuses a reservation takes: Produce is skipped
  // here, as it returned nullopt there.
  std::unique_ptr<RendezvousBackend> b = MakeRendezvousBackend(false, false);
  // An address without a valid port is refused, not reported with port 0.
  for (const char* bad : {"host-a", "host-a:", "host-a:x", "host-a:0", "host-a:70000"}) {
    EXPECT_EQ(b->RankListening(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  absl::StatusOr<std::optional<v1::RendezvousInfo>> got = b->RankListening("host-a:4567");
  ASSERT_TRUE(got.ok() && got->has_value());
  const v1::RendezvousInfo& info = **got;
  EXPECT_EQ(info.gloo_store_address(), "host-a:4567");
  EXPECT_EQ(info.master_addr(), "host-a");
  EXPECT_EQ(info.master_port(), 4567);
  EXPECT_FALSE(b->RankListening("host-a:4567")->has_value());
}

TEST(RendezvousBackend, CommandJobsGetAMasterPortOnCpuAndGpu) {
  for (bool gpu : {false, true}) {
    std::unique_ptr<RendezvousBackend> b = MakeRendezvousBackend(gpu, /*command=*/true);
    absl::StatusOr<std::optional<v1::RendezvousInfo>> made = b->Produce("127.0.0.1");
    ASSERT_TRUE(made.ok()) << made.status();
    ASSERT_TRUE(made->has_value());
    EXPECT_GT((*made)->master_port(), 0);
    EXPECT_TRUE((*made)->nccl_unique_id().empty());
    EXPECT_EQ(MasterEndpoint(*made, "ignored"),
              std::make_pair(std::string("127.0.0.1"), absl::StrCat((*made)->master_port())));
  }
}

TEST(RendezvousBackend, MasterEndpointBeforeARendezvousIsThisHostAndPortZero) {
  EXPECT_EQ(MasterEndpoint(std::nullopt, "10.1.2.3"),
            std::make_pair(std::string("10.1.2.3"), std::string("0")));
}

TEST(RendezvousBackend, NcclHandsEveryRankTheUniqueId) {
  std::unique_ptr<RendezvousBackend> b = MakeRendezvousBackend(/*gpu=*/true, /*command=*/false);
  v1::RendezvousInfo info;
  info.set_nccl_unique_id(std::string(kNcclUniqueIdBytes, '\x01'));
  info.set_master_addr("10.0.0.7");
  rankproto::FlatConfig zero, other;
  b->ConfigureRank(info, true, zero);
  EXPECT_EQ(zero[rk::kNcclUniqueId], absl::BytesToHexString(info.nccl_unique_id()));
  EXPECT_EQ(zero.count(rk::kStoreAddress), 0u);
  EXPECT_EQ(zero.count(rk::kStorePort), 0u);
  b->ConfigureRank(info, false, other);
  EXPECT_EQ(other[rk::kNcclUniqueId], zero[rk::kNcclUniqueId]);
  EXPECT_FALSE(b->RankListening("10.0.0.7:1")->has_value());
  absl::StatusOr<std::optional<v1::RendezvousInfo>> made = b->Produce("10.0.0.7");
  if (!made.ok()) GTEST_SKIP() << "no NCCL here: " << made.status();
  ASSERT_TRUE(made->has_value());
  EXPECT_EQ((*made)->nccl_unique_id().size(), kNcclUniqueIdBytes);
  EXPECT_EQ((*made)->master_addr(), "10.0.0.7");
}

}  // namespace
}  // namespace trainctl::worker
