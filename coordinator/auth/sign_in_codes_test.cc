#include "coordinator/auth/sign_in_codes.h"

#include <gtest/gtest.h>

#include <set>

namespace trainctl::coordinator {
namespace {

TEST(SignInCodesTest, ACodeSignsInOnceWithinItsMinute) {
  FakeClock clock;
  SignInCodes codes(&clock);
  const std::string a = codes.Create("tct_secret_a");
  const std::string b = codes.Create("tct_secret_b");
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
  absl::StatusOr<std::string> first = codes.Redeem(a);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, "tct_secret_a");
  EXPECT_TRUE(absl::IsNotFound(codes.Redeem(a).status())) << "single use";
  EXPECT_TRUE(absl::IsNotFound(codes.Redeem("").status()));
  std::string wrong = b;
  wrong[0] = wrong[0] == 'a' ? 'b' : 'a';
  EXPECT_TRUE(absl::IsNotFound(codes.Redeem(wrong).status()));
  clock.Advance(SignInCodes::kTtl);
  absl::StatusOr<std::string> late = codes.Redeem(b);
  EXPECT_TRUE(absl::IsNotFound(late.status()));
  EXPECT_NE(late.status().message().find("expired"), absl::string_view::npos) << late.status();
}

TEST(SignInCodesTest, OutstandingCodesAreBoundedOldestFirst) {
  FakeClock clock;
  SignInCodes codes(&clock);
  const std::string oldest = codes.Create("s0");
  clock.Advance(absl::Milliseconds(1));
  std::string newest;
  for (size_t i = 1; i < SignInCodes::kMaxCodes + 10; ++i) {
    newest = codes.Create("s");
    clock.Advance(absl::Microseconds(1));
  }
  EXPECT_TRUE(absl::IsNotFound(codes.Redeem(oldest).status())) << "the oldest made room";
  EXPECT_TRUE(codes.Redeem(newest).ok());
}

TEST(SignInCodesTest, TheEndpointIsUnsetUntilTheDashboardListens) {
  FakeClock clock;
  SignInCodes codes(&clock);
  EXPECT_EQ(codes.endpoint().port, 0);
  codes.SetEndpoint({8443, true});
  EXPECT_EQ(codes.endpoint().port, 8443);
  EXPECT_TRUE(codes.endpoint().https);
}

}  // namespace
}  // namespace trainctl::coordinator
