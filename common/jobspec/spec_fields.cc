#include "common/jobspec/spec_fields.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::jobspec {

namespace {

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

bool IsValidUtf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
      cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += len;
  }
  return true;
}

const char* DiscriminatorKey(const Descriptor* d) {
  if (d == v1::ModelSpec::descriptor()) return "name";
  if (d == v1::DatasetSpec::descriptor()) return "format";
  return nullptr;
}

std::string DidYouMean(std::string_view got, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::string::npos;
  for (const std::string& c : candidates) {
    size_t d = EditDistance(absl::AsciiStrToLower(std::string(got)), c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  bool close = best_distance <= 2 || best_distance * 3 <= got.size() ||
               (!got.empty() && absl::StartsWith(best, absl::AsciiStrToLower(std::string(got))));
  if (best.empty() || !close || best_distance == 0) return "";
  return absl::StrCat("; did you mean '", best, "'?");
}

std::string EnumPrefix(const EnumDescriptor* e) {
  std::string zero = e->value(0)->name();
  return zero.substr(0, zero.size() - std::string("UNSPECIFIED").size());
}

std::vector<std::string> EnumChoices(const EnumDescriptor* e) {
  std::vector<std::string> out;
  for (int i = 1; i < e->value_count(); ++i) out.push_back(EnumValueName(e->value(i)));
  return out;
}

std::string Quote(std::string_view s) {
  if (s.size() > 40) return absl::StrCat("'", std::string(s.substr(0, 37)), "...'");
  return absl::StrCat("'", std::string(s), "'");
}

std::string FormatNumber(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrCat(static_cast<int64_t>(v));
  return absl::StrCat(v);
}

bool IsByteQuantityField(const FieldDescriptor* f) {
  return f->containing_type() == v1::ResourceSpec::descriptor() && f->name() == "memory";
}

std::optional<int64_t> ParseByteQuantity(std::string_view std_text) {
  // This abseil's string_view is its own type.
  const absl::string_view text(std_text.data(), std_text.size());
  static constexpr struct {
    const char* suffix;
    double factor;
  } kSuffixes[] = {{"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"Ti", 1099511627776.0},
                   {"k", 1e3},     {"K", 1e3},        {"M", 1e6},           {"G", 1e9},
                   {"T", 1e12}};
  absl::string_view number = text;
  double factor = 1;
  for (const auto& s : kSuffixes) {
    if (absl::EndsWith(text, s.suffix)) {
      number = text.substr(0, text.size() - absl::string_view(s.suffix).size());
      factor = s.factor;
      break;
    }
  }
  if (number.empty() || !std::all_of(number.begin(), number.end(),
                                     [](char c) { return (c >= '0' && c <= '9') || c == '.'; })) {
    return std::nullopt;
  }
  if (factor == 1 && number.find('.') == absl::string_view::npos) {
    int64_t v;
    if (!absl::SimpleAtoi(number, &v)) return std::nullopt;
    return v;
  }
  double v;
  if (!absl::SimpleAtod(number, &v) || !std::isfinite(v)) return std::nullopt;
  const double bytes = std::floor(v * factor);
  // 2^63 is the first double past INT64_MAX.
  if (bytes < 0 || bytes >= 9223372036854775808.0) return std::nullopt;
  return static_cast<int64_t>(bytes);
}

}  // namespace trainctl::jobspec
