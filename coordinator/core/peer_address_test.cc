#include "coordinator/core/peer_address.h"
#include "common/auth/secret.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

namespace trainctl::coordinator {
namespace {

using ::testing::HasSubstr;

TEST(PeerIpTest, ReadsEveryFormGrpcNamesAPeerIn) {
  EXPECT_EQ(PeerIp("ipv4:10.0.0.5:4242"), "10.0.0.5");
  EXPECT_EQ(PeerIp("ipv6:[::1]:4242"), "::1");
  EXPECT_EQ(PeerIp("ipv6:%5B::1%5D:4242"), "::1");
  EXPECT_EQ(PeerIp("ipv6:[::ffff:10.1.2.3]:80"), "10.1.2.3")
      << "an IPv4 client on a dual-stack socket";
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
  EXPECT_TRUE(CheckRendezvousHosts(Gloo("node-a:29500", "NODE-A"), own).ok())
      << "host names ignore case";
  EXPECT_TRUE(CheckRendezvousHosts(v1::RendezvousInfo(), own).ok())
      << "a report that names no host";

  absl::Status store = CheckRendezvousHosts(Gloo("10.9.9.9:29500"), own);
  EXPECT_EQ(store.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(store.message(), HasSubstr("rendezvous.info.gloo_store_address: host '10.9.9.9'"));
  EXPECT_THAT(store.message(), HasSubstr("10.0.0.5, Node-A"));

  absl::Status master = CheckRendezvousHosts(Gloo("10.0.0.5:1", "evil:29500"), own);
  EXPECT_EQ(master.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(master.message(), HasSubstr("rendezvous.info.master_addr: host 'evil'"));
}

// A resolver from a table: what a host name maps to in each test.
HostResolver Table(std::map<std::string, std::vector<std::string>> names) {
  return [names = std::move(names)](
             const std::string& host) -> absl::StatusOr<std::vector<std::string>> {
    auto it = names.find(host);
    if (it == names.end()) return absl::NotFoundError("Name or service not known");
    return it->second;
  };
}

TEST(JudgeWorkerAddressTest, TheAddressItConnectsFromOrOneItsCredentialNames) {
  const HostResolver none = Table({});
  AddressVerdict v = JudgeWorkerAddress("10.0.0.5", "10.0.0.5", {}, none);
  EXPECT_TRUE(v.accepted);
  EXPECT_EQ(v.accepted_host, "10.0.0.5");
  EXPECT_TRUE(JudgeWorkerAddress("10.0.0.9", "10.0.0.5", {"10.0.0.9"}, none).accepted)
      << "its token's address";
  EXPECT_TRUE(JudgeWorkerAddress("Node-A", "10.0.0.5", {"node-a"}, none).accepted)
      << "a certificate's name";
}

TEST(JudgeWorkerAddressTest, AHostNameIsAcceptedWhenItResolvesToAnAddressOfItsOwn) {
  // The README's cluster: token workers without --address on the
  // coordinator's host advertise the host name, which Debian's /etc/hosts
  // maps to 127.0.1.1 while they connect from 127.0.0.1.
  AddressVerdict v = JudgeWorkerAddress("vm", "127.0.0.1", {}, Table({{"vm", {"127.0.1.1"}}}));
  EXPECT_TRUE(v.accepted) << v.refused;
  EXPECT_EQ(v.accepted_host, "vm");
  EXPECT_TRUE(
      JudgeWorkerAddress("gpu-7", "10.0.0.5", {}, Table({{"gpu-7", {"fe80::1", "10.0.0.5"}}}))
          .accepted);
  EXPECT_TRUE(JudgeWorkerAddress("::1", "127.0.0.1", {}, Table({})).accepted)
      << "both loopback: this host";
}

TEST(JudgeWorkerAddressTest, ARefusalSaysWhatItIsNotAndWhichFlagFixesIt) {
  AddressVerdict other =
      JudgeWorkerAddress("gpu-7", "10.0.0.5", {"10.0.0.6"}, Table({{"gpu-7", {"10.0.0.8"}}}));
  EXPECT_FALSE(other.accepted);
  EXPECT_THAT(other.refused, HasSubstr("'gpu-7' resolves to 10.0.0.8"));
  EXPECT_THAT(other.refused, HasSubstr("connects from (10.0.0.5)"));
  EXPECT_THAT(other.refused, HasSubstr("(10.0.0.6)"));
  EXPECT_THAT(other.refused, HasSubstr("--address"));

  AddressVerdict unknown = JudgeWorkerAddress("gpu-7:1", "10.0.0.5", {}, Table({}));
  EXPECT_FALSE(unknown.accepted);
  EXPECT_THAT(unknown.refused,
              HasSubstr("'gpu-7' does not resolve here (Name or service not known)"));

  AddressVerdict ip = JudgeWorkerAddress("6.6.6.6", "10.0.0.5", {}, Table({}));
  EXPECT_FALSE(ip.accepted)
      << "an IP address is never resolved, and a remote worker is not loopback";
  EXPECT_THAT(ip.refused, HasSubstr("'6.6.6.6' is not the address it connects from"));
  EXPECT_FALSE(JudgeWorkerAddress("127.0.0.1", "10.0.0.5", {}, Table({})).accepted)
      << "loopback from a remote peer is not its own";
  EXPECT_FALSE(JudgeWorkerAddress("", "10.0.0.5", {}, Table({})).accepted);
}

TEST(ResolveHostTest, TheSystemResolverAnswersForLocalhost) {
  absl::StatusOr<std::vector<std::string>> ips = ResolveHost("localhost", absl::Seconds(10));
  ASSERT_TRUE(ips.ok()) << ips.status();
  ASSERT_FALSE(ips->empty());
  EXPECT_TRUE(auth::IsLoopbackIp(ips->front())) << ips->front();
  EXPECT_FALSE(ResolveHost("no-such-host.invalid", absl::Seconds(10)).ok());
  EXPECT_TRUE(auth::IsLoopbackIp("127.0.1.1"));
  EXPECT_TRUE(auth::IsLoopbackIp("::1"));
  EXPECT_FALSE(auth::IsLoopbackIp("10.0.0.1"));
  EXPECT_FALSE(auth::IsLoopbackIp("localhost")) << "a name is not an address";
}

}  // namespace
}  // namespace trainctl::coordinator
