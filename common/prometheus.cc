#include "common/prometheus.h"

#include <cmath>

#include <cstdio>
#include <cstdlib>
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainctl {
namespace {

bool ValidName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

// A bad name is a programming error (names are literals in the code).
void RequireName(const std::string& name) {
  if (ValidName(name)) return;
  std::fprintf(stderr, "bad Prometheus metric or label name '%s'\n", name.c_str());
  std::abort();
}

}  // namespace

std::string PromEscape(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string PromNumber(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15)
    return absl::StrCat(static_cast<int64_t>(value));
  // The shortest of %.15g and %.17g that reads back as the same double.
  std::string shorter = absl::StrFormat("%.15g", value);
  return std::strtod(shorter.c_str(), nullptr) == value ? shorter : absl::StrFormat("%.17g", value);
}

void PromWriter::Family(const std::string& name, const std::string& type, const std::string& help) {
  RequireName(name);
  std::string h;
  for (char c : help) h += c == '\n' ? ' ' : c;
  absl::StrAppend(&out_, "# HELP ", name, " ", h, "\n# TYPE ", name, " ", type, "\n");
}

void PromWriter::Sample(const std::string& name, const PromLabels& labels, double value) {
  RequireName(name);
  out_ += name;
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      RequireName(labels[i].first);
      absl::StrAppend(&out_, i ? "," : "", labels[i].first, "=\"", PromEscape(labels[i].second),
                      "\"");
    }
    out_ += '}';
  }
  absl::StrAppend(&out_, " ", PromNumber(value), "\n");
}

void LatencyHistogram::Observe(absl::Duration d) {
  const double s = absl::ToDoubleSeconds(d);
  size_t i = 0;
  while (i < kBounds.size() && s > kBounds[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(absl::ToInt64Nanoseconds(d), std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

void LatencyHistogram::Write(PromWriter& w, const std::string& name,
                             const PromLabels& labels) const {
  int64_t cumulative = 0;
  for (size_t i = 0; i <= kBounds.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    PromLabels l = labels;
    l.emplace_back("le", i < kBounds.size() ? PromNumber(kBounds[i]) : "+Inf");
    w.Sample(name + "_bucket", l, static_cast<double>(cumulative));
  }
  w.Sample(name + "_sum", labels,
           static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9);
  // The count matches the +Inf bucket read above (a concurrent Observe may
  // land between the reads; Prometheus tolerates that skew).
  w.Sample(name + "_count", labels, static_cast<double>(cumulative));
}

}  // namespace trainctl
