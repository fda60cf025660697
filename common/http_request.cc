#include "common/http_request.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace trainctl::http {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string Decode(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '+') {
      out += ' ';
    } else if (c == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      out += static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2]));
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::multimap<std::string, std::string> ParseUrlEncoded(absl::string_view text) {
  std::multimap<std::string, std::string> out;
  for (absl::string_view pair : absl::StrSplit(text, '&', absl::SkipEmpty())) {
    const size_t eq = pair.find('=');
    if (eq == absl::string_view::npos) {
      out.emplace(Decode(pair), "");
    } else {
      out.emplace(Decode(pair.substr(0, eq)), Decode(pair.substr(eq + 1)));
    }
  }
  return out;
}

std::string UrlEncode(absl::string_view text) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (absl::ascii_isalnum(u) || c == '-' || c == '.' || c == '_' || c == '~' || c == '/') {
      out += c;
    } else {
      out += '%';
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  return out;
}

std::string CookieValue(absl::string_view header, absl::string_view name) {
  if (name.empty()) return "";
  for (absl::string_view part : absl::StrSplit(header, ';')) {
    part = absl::StripAsciiWhitespace(part);
    if (absl::ConsumePrefix(&part, name) && absl::ConsumePrefix(&part, "="))
      return std::string(part);
  }
  return "";
}

std::optional<int64_t> ParseNonNegativeInt(absl::string_view text) {
  if (text.empty() || text.size() > 19) return std::nullopt;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v < 0) return std::nullopt;
  return v;
}

std::string SafeRedirectPath(absl::string_view next) {
  if (next.empty() || next.size() > 2048 || next[0] != '/') return "/";
  if (next.size() > 1 && (next[1] == '/' || next[1] == '\\')) return "/";
  for (char c : next) {
    const auto u = static_cast<unsigned char>(c);
    // Control characters, space and DEL; and '\' anywhere (some parsers
    // normalise it to '/'), non-ASCII bytes (send them percent-encoded).
    if (u <= 0x20 || u >= 0x7f || c == '\\') return "/";
  }
  return std::string(next);
}

}  // namespace trainctl::http
