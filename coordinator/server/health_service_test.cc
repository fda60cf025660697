#include "coordinator/server/health_service.h"

#include <gtest/gtest.h>

#include <string>

namespace trainctl::coordinator {
namespace {

TEST(HealthServiceTest, ParsesTheServiceNameAndSkipsUnknownFields) {
  std::string service = "stale";
  EXPECT_TRUE(HealthService::ParseRequest("", &service));
  EXPECT_EQ(service, "");
  // service = "trainctl.v1.JobService": tag 0x0a, length, bytes.
  const std::string name = "trainctl.v1.JobService";
  std::string bytes =
      std::string(1, '\x0a') + std::string(1, static_cast<char>(name.size())) + name;
  EXPECT_TRUE(HealthService::ParseRequest(bytes, &service));
  EXPECT_EQ(service, name);
  // An unknown varint field (2 = 150) before it is skipped.
  EXPECT_TRUE(HealthService::ParseRequest(std::string("\x10\x96\x01", 3) + bytes, &service));
  EXPECT_EQ(service, name);
}

TEST(HealthServiceTest, RefusesBytesThatDoNotParse) {
  std::string service;
  // A length past the end of the message.
  EXPECT_FALSE(HealthService::ParseRequest(std::string("\x0a\x05"
                                                       "ab",
                                                       4),
                                           &service));
  // Field 1 with the wrong wire type is skipped as unknown; a truncated varint is not.
  EXPECT_FALSE(HealthService::ParseRequest(std::string("\x08\x96", 2), &service));
}

TEST(HealthServiceTest, ResponsesAreOneEnumField) {
  EXPECT_EQ(HealthService::Response(1), std::string("\x08\x01", 2));
  EXPECT_EQ(HealthService::Response(2), std::string("\x08\x02", 2));
}

}  // namespace
}  // namespace trainctl::coordinator
