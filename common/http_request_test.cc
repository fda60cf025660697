// The request parsing of the HTTP endpoints, with the inputs an attacker
// sends: open redirects in every spelling browsers accept, cookies that
// only end in the right name, escapes cut short, numbers out of range.
#include "common/http_request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace trainctl::http {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

TEST(SafeRedirectPathTest, KeepsPathsOnThisServer) {
  EXPECT_EQ(SafeRedirectPath("/"), "/");
  EXPECT_EQ(SafeRedirectPath("/jobs/mlp-1"), "/jobs/mlp-1");
  EXPECT_EQ(SafeRedirectPath("/jobs/a?x=1&y=%2F"), "/jobs/a?x=1&y=%2F");
}

TEST(SafeRedirectPathTest, RefusesEveryWayOffThisServer) {
  for (const char* bad :
       {"", "//evil.example", "/\\evil.example", "\\\\evil.example", "https://evil.example",
        "javascript:alert(1)", "evil.example", "/\t/evil.example", "/\n/evil.example", "/ /evil",
        "/x\r\nSet-Cookie: a=b", "/a\\b", "/\x7f", "/caf\xc3\xa9"}) {
    EXPECT_EQ(SafeRedirectPath(bad), "/") << "next=" << bad;
  }
  EXPECT_EQ(SafeRedirectPath("/" + std::string(3000, 'a')), "/") << "too long";
}

TEST(ParseUrlEncodedTest, DecodesPairs) {
  EXPECT_THAT(ParseUrlEncoded("token=a%2Bb+c&next=%2Fjobs%2F1&&flag"),
              ElementsAre(Pair("flag", ""), Pair("next", "/jobs/1"), Pair("token", "a+b c")));
  // Cut-short and invalid escapes stay as written.
  EXPECT_THAT(ParseUrlEncoded("a=%&b=%4&c=%zz&d=%41"),
              ElementsAre(Pair("a", "%"), Pair("b", "%4"), Pair("c", "%zz"), Pair("d", "A")));
  EXPECT_TRUE(ParseUrlEncoded("").empty());
}

TEST(UrlEncodeTest, RoundTripsThroughTheParser) {
  const std::string value = "/jobs/x?y=1&z=2 \\\r\n\x01\xff";
  const std::string encoded = UrlEncode(value);
  EXPECT_EQ(encoded.find_first_of("?&= \\\r\n"), std::string::npos) << encoded;
  EXPECT_THAT(ParseUrlEncoded("next=" + encoded), ElementsAre(Pair("next", value)));
}

TEST(CookieValueTest, MatchesTheExactName) {
  EXPECT_EQ(CookieValue("a=1; trainctl_token=s3cret; b=2", "trainctl_token"), "s3cret");
  EXPECT_EQ(CookieValue("xtrainctl_token=nope", "trainctl_token"), "");
  EXPECT_EQ(CookieValue("trainctl_tokenx=nope", "trainctl_token"), "");
  EXPECT_EQ(CookieValue("", "trainctl_token"), "");
  EXPECT_EQ(CookieValue("a=1", ""), "");
}

TEST(ParseNonNegativeIntTest, DigitsOnly) {
  EXPECT_EQ(ParseNonNegativeInt("0"), 0);
  EXPECT_EQ(ParseNonNegativeInt("9223372036854775807"), INT64_MAX);
  for (const char* bad :
       {"", "-1", "+1", " 1", "1 ", "0x10", "9223372036854775808", "99999999999999999999"}) {
    EXPECT_FALSE(ParseNonNegativeInt(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace trainctl::http
