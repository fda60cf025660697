#include "coordinator/auth/sign_in_codes.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

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

TEST(SignInCodesTest, OneTokensCodesEvictOnlyItsOwnOldest) {
  FakeClock clock;
  SignInCodes codes(&clock);
  const std::string other = codes.Create("victim");
  clock.Advance(absl::Milliseconds(1));
  const std::string own_oldest = codes.Create("flooder");
  clock.Advance(absl::Milliseconds(1));
  std::string newest;
  // #45 item 6: 1,024 codes made by one viewer evicted everyone's links.
  for (size_t i = 0; i < SignInCodes::kMaxCodes; ++i) {
    newest = codes.Create("flooder");
    clock.Advance(absl::Microseconds(1));
  }
  EXPECT_TRUE(absl::IsNotFound(codes.Redeem(own_oldest).status())) << "its own oldest made room";
  EXPECT_TRUE(codes.Redeem(newest).ok());
  absl::StatusOr<std::string> kept = codes.Redeem(other);
  ASSERT_TRUE(kept.ok()) << "another token's link survives the flood: " << kept.status();
  EXPECT_EQ(*kept, "victim");
}

TEST(SignInCodesTest, AFullTableDropsTheOldestOfTheTokenWithTheMost) {
  FakeClock clock;
  SignInCodes codes(&clock);
  std::vector<std::string> singles;
  for (size_t i = 0; i < SignInCodes::kMaxCodes / SignInCodes::kMaxPerToken; ++i) {
    for (size_t j = 0; j < SignInCodes::kMaxPerToken - 1; ++j) {
      codes.Create("many-" + std::to_string(i));
      clock.Advance(absl::Microseconds(1));
    }
  }
  // The table holds 64 tokens x 15 codes = 960: 64 single codes fill it.
  for (int i = 0; i < 64; ++i) {
    singles.push_back(codes.Create("one-" + std::to_string(i)));
    clock.Advance(absl::Microseconds(1));
  }
  const std::string late = codes.Create("late");
  EXPECT_TRUE(codes.Redeem(late).ok());
  for (const std::string& c : singles)
    EXPECT_TRUE(codes.Redeem(c).ok()) << "a token's only link stays";
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
