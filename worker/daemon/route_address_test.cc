#include "worker/daemon/route_address.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace trainctl::worker {
namespace {

using ::testing::HasSubstr;

TEST(RouteSourceAddressTest, ALoopbackCoordinatorIsReachedFromLoopback) {
  absl::StatusOr<std::string> ip = RouteSourceAddress("127.0.0.1:7070");
  ASSERT_TRUE(ip.ok()) << ip.status();
  EXPECT_EQ(*ip, "127.0.0.1");
  ip = RouteSourceAddress("localhost:7070");
  ASSERT_TRUE(ip.ok()) << ip.status();
  EXPECT_EQ(*ip, "127.0.0.1") << "IPv4 first, whatever order the resolver gives";
  ip = RouteSourceAddress("127.0.0.1");
  ASSERT_TRUE(ip.ok()) << "no port: the default one" << ip.status();
  EXPECT_EQ(*ip, "127.0.0.1");
}

TEST(RouteSourceAddressTest, AnIPv6LiteralInBrackets) {
  absl::StatusOr<std::string> ip = RouteSourceAddress("[::1]:7070");
  if (!ip.ok() && ip.status().code() == absl::StatusCode::kUnavailable) {
    GTEST_SKIP() << "this host has no IPv6 loopback: " << ip.status();
  }
  ASSERT_TRUE(ip.ok()) << ip.status();
  EXPECT_EQ(*ip, "::1");
}

TEST(RouteSourceAddressTest, AnUnknownHostSaysSo) {
  absl::StatusOr<std::string> ip = RouteSourceAddress("no-such-host.invalid:7070");
  ASSERT_FALSE(ip.ok());
  EXPECT_EQ(ip.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ip.status().message(), HasSubstr("no-such-host.invalid"));
  EXPECT_EQ(RouteSourceAddress("[::1:7070").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainctl::worker
