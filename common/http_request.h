// What the HTTP endpoints (the coordinator's dashboard, /metrics) read out
// of a request themselves, as pure functions: URL-encoded forms and query
// strings, cookies, integer parameters, and the `next=` path a sign-in
// returns to. Everything here takes bytes an anonymous client chose, so it
// is fuzzed (fuzz/fuzz_http_request.cc) and never throws, aborts or reads
// out of bounds.
//
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace trainctl::http {

// "a=1&b=x%20y+z" -> {a: "1", b: "x y z"}: '&'-separated pairs, '+' is a
// space, %XX decoded (a malformed escape stays as written); a pair without
// '=' has an empty value; empty pairs are skipped.
std::multimap<std::string, std::string> ParseUrlEncoded(absl::string_view text);

// Percent-encodes everything but unreserved characters (RFC 3986) and '/',
// so the result is safe in a query string and in a Location header.
std::string UrlEncode(absl::string_view text);

// The value of cookie `name` in a Cookie header ("a=1; b=2"); "" when absent.
// Only an exact name matches (a cookie "xname" is not "name").
std::string CookieValue(absl::string_view header, absl::string_view name);

// `text` as a non-negative decimal integer; nullopt for anything else
// (signs, spaces, overflow, empty).
std::optional<int64_t> ParseNonNegativeInt(absl::string_view text);

// Where a sign-in may send the browser: `next` when it is a path on this
// server ("/jobs/x?y=1"), else "/". Refused: anything not starting with a
// single '/' ("//evil.example", "/\evil.example" — browsers read '\' as '/'
// — "https://x", "javascript:"), control characters and whitespace (a URL
// parser drops tabs and newlines, turning "/\t/evil" into "//evil"; a CR LF
// would split the header), and more than 2048 bytes.
std::string SafeRedirectPath(absl::string_view next);

}  // namespace trainctl::http
