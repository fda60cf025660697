// The --coordinator list parser and the rotation's order (the calls over
// real gRPC, with a stand-in standby: client/failover_test.cc).
#include "common/coordinator_failover.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace trainctl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseCoordinatorListTest, AcceptsOneOrSeveralEntries) {
  EXPECT_THAT(*ParseCoordinatorList("coord:7070", "--coordinator"), ElementsAre("coord:7070"));
  EXPECT_THAT(*ParseCoordinatorList("a:7070,b.example.com:7071", "--coordinator"),
              ElementsAre("a:7070", "b.example.com:7071"));
  EXPECT_THAT(*ParseCoordinatorList(" a:1 , 10.0.0.2:7070 ,[::1]:7070", "--coordinator"),
              ElementsAre("a:1", "10.0.0.2:7070", "[::1]:7070"));
  // gRPC targets with a scheme go to gRPC as they are.
  EXPECT_THAT(*ParseCoordinatorList("unix:/run/trainctl.sock,dns:///coord:7070", "--coordinator"),
              ElementsAre("unix:/run/trainctl.sock", "dns:///coord:7070"));
}

TEST(ParseCoordinatorListTest, NamesTheFlagAndTheBadEntry) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c :
       {Case{"", "--coordinator: empty"},
        Case{"a:7070,", "--coordinator: entry 2 of 'a:7070,' is empty"},
        Case{"a:7070,,b:7070", "entry 2 of"},
        Case{"coord", "--coordinator: 'coord': expected HOST:PORT (no port)"},
        Case{"a:7070,b:http", "--coordinator: 'b:http': port 'http' is not a number in 1..65535"},
        Case{"a:0", "port '0'"}, Case{"a:65536", "port '65536'"}, Case{":7070", "no host"},
        Case{"a b:7070", "'a b:7070'"}, Case{"::1:7070", "[brackets]"},
        Case{"[::1]7070", "expected [IPV6]:PORT"},
        Case{"a:7070,a:7070", "'a:7070' is listed twice"}}) {
    SCOPED_TRACE(c.text);
    absl::StatusOr<std::vector<std::string>> got = ParseCoordinatorList(c.text, "--coordinator");
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.says));
  }
  EXPECT_THAT(std::string(ParseCoordinatorList("x", "TRAINCTL_COORDINATOR").status().message()),
              HasSubstr("TRAINCTL_COORDINATOR: 'x'"));
}

TEST(CheckHostPortTest, AHintCannotNameAnotherKindOfTarget) {
  EXPECT_TRUE(CheckHostPort("coord-2.example.com:7070").ok());
  EXPECT_TRUE(CheckHostPort("[fe80::1]:7070").ok());
  EXPECT_FALSE(CheckHostPort("unix:/tmp/sock").ok());
  EXPECT_FALSE(CheckHostPort("dns:///evil:7070").ok());
  EXPECT_FALSE(CheckHostPort("evil").ok());
}

TEST(CoordinatorRotationTest, RoundRobinFollowsHintsAndRemembersTheActive) {
  // A list no other test uses: the process-wide memory starts empty for it.
  CoordinatorRotation r({"r1:1", "r2:2", "r3:3"});
  EXPECT_EQ(r.Current(), "r1:1");
  r.Unreachable("r1:1");
  EXPECT_EQ(r.Current(), "r2:2");
  r.Unreachable("r1:1");  // stale: r2 is current, nothing moves
  EXPECT_EQ(r.Current(), "r2:2");
  r.Unreachable("r2:2");
  r.Unreachable("r3:3");
  EXPECT_EQ(r.Current(), "r1:1") << "round robin";
  // A hint outside the list is dialled next; when it fails, the list goes on.
  r.Follow("elsewhere:9");
  EXPECT_EQ(r.Current(), "elsewhere:9");
  r.Unreachable("elsewhere:9");
  EXPECT_EQ(r.Current(), "r2:2");
  // A hint inside the list moves the list's position.
  r.Follow("r3:3");
  EXPECT_EQ(r.Current(), "r3:3");
  r.Answered("r3:3");
  EXPECT_EQ(RememberedActive("r1:1,r2:2,r3:3"), "r3:3");
  // A new rotation over the same list in this process starts at the active one.
  CoordinatorRotation again({"r1:1", "r2:2", "r3:3"});
  EXPECT_EQ(again.Current(), "r3:3");
  again.Answered("outside:4");
  CoordinatorRotation third({"r1:1", "r2:2", "r3:3"});
  EXPECT_EQ(third.Current(), "outside:4");
}

TEST(NextFailoverBackoffTest, ShortAndBounded) {
  absl::Duration b = absl::ZeroDuration();
  b = NextFailoverBackoff(b);
  EXPECT_EQ(b, absl::Milliseconds(50));
  for (int i = 0; i < 20; ++i) b = NextFailoverBackoff(b);
  EXPECT_EQ(b, absl::Seconds(1));
}

}  // namespace
}  // namespace trainctl
