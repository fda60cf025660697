#include "coordinator/peer_address.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace trainctl::coordinator {
namespace {

using ::testing::HasSubstr;

TEST(PeerIpTest, ReadsEveryFormGrpcNamesAPeerIn) {
  EXPECT_EQ(PeerIp("ipv4:10.0.0.5:4242"), "10.0.0.5");
  EXPECT_EQ(PeerIp("ipv6:[::1]:4242"), "::1");
  EXPECT_EQ(PeerIp("ipv6:%5B::1%5D:4242"), "::1");
  EXPECT_EQ(PeerIp("ipv6:[::ffff:10.1.2.3]:80"), "10.1.2.3") << "an IPv4 client on a dual-stack socket";
  EXPECT_EQ(PeerIp("unix:/tmp/sock"), "");
  EXPECT_EQ(PeerIp(""), "");
}

TEST(HostOfTest, StripsThePortOnly) {
  EXPECT_EQ(HostOf("node-1:29500"), "node-1");
  EXPECT_EQ(HostOf("node-1"), "node-1");
  EXPECT_EQ(HostOf("[fe80::1]:29500"), "fe80::1");
  EXPECT_EQ(HostOf("fe80::1"), "fe80::1") << "a bare IPv6 address has no port to strip";
}

v1::RendezvousInfo Gloo(const std::string& store, const std::string& master = "") {
  v1::RendezvousInfo info;
  info.set_gloo_store_address(store);
  if (!master.empty()) info.set_master_addr(master);
  return info;
}

TEST(CheckRendezvousHostsTest, AcceptsOnlyTheWorkersOwnHosts) {
  const std::vector<std::string> own = {"10.0.0.5", "Node-A"};
  EXPECT_TRUE(CheckRendezvousHosts(Gloo("10.0.0.5:29500"), own).ok());
  EXPECT_TRUE(CheckRendezvousHosts(Gloo("node-a:29500", "NODE-A"), own).ok()) << "host names ignore case";
  EXPECT_TRUE(CheckRendezvousHosts(v1::RendezvousInfo(), own).ok()) << "a report that names no host";

  absl::Status store = CheckRendezvousHosts(Gloo("10.9.9.9:29500"), own);
  EXPECT_EQ(store.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(store.message(), HasSubstr("rendezvous.info.gloo_store_address: host '10.9.9.9'"));
  EXPECT_THAT(store.message(), HasSubstr("10.0.0.5, Node-A"));

  absl::Status master = CheckRendezvousHosts(Gloo("10.0.0.5:1", "evil:29500"), own);
  EXPECT_EQ(master.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(master.message(), HasSubstr("rendezvous.info.master_addr: host 'evil'"));
}

}  // namespace
}  // namespace trainctl::coordinator
