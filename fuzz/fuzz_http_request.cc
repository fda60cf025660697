// The dashboard's request parsing (common/http_request.h): what an
// anonymous client controls on the coordinator's HTTP port — a URL-encoded
// form or query, a Cookie header, integer parameters and the sign-in's
// `next=`. The first byte picks nothing; the input is used whole by every
// parser, and the properties checked are the security ones: a redirect
// target is always a path on this server, and encoding round-trips.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/http_request.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

// What SafeRedirectPath promises of anything it returns.
void CheckSameOrigin(const std::string& to) {
  Check(!to.empty() && to[0] == '/');
  Check(to.size() == 1 || (to[1] != '/' && to[1] != '\\'));
  for (char c : to) {
    const auto u = static_cast<unsigned char>(c);
    Check(u > 0x20 && u < 0x7f && c != '\\');
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  namespace http = trainctl::http;

  CheckSameOrigin(http::SafeRedirectPath(in));
  for (const auto& [key, value] : http::ParseUrlEncoded(in)) {
    // The login form's `next`, as the server reads it.
    if (key == "next") CheckSameOrigin(http::SafeRedirectPath(value));
    // Whatever a field decodes to encodes back to itself.
    const auto again = http::ParseUrlEncoded("v=" + http::UrlEncode(value));
    Check(again.size() == 1 && again.begin()->second == value);
    if (auto n = http::ParseNonNegativeInt(value)) Check(*n >= 0);
  }
  const std::string cookie = http::CookieValue(in, "trainctl_token");
  Check(cookie.size() <= in.size());
  const std::string encoded = http::UrlEncode(in);
  Check(encoded.find_first_of("?&=#\\ \r\n") == std::string::npos);
  return 0;
}
