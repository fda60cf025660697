// Prometheus text exposition format (version 0.0.4), in small: what the
// coordinator's and the worker's /metrics pages are written with, plus a
// thread-safe latency histogram to feed them.
//
//   PromWriter w;
//   w.Family("trainctl_jobs", "gauge", "Jobs by state.");
//   w.Sample("trainctl_jobs", {{"state", "running"}}, 3);
//   std::string page = w.Take();
//
// Names must match [a-zA-Z_:][a-zA-Z0-9_:]* (checked: a bad one is a
// programming error); label values are escaped (\\, \", \n). Each family's
// HELP/TYPE comes once, before its samples.
//
// PromWriter: not thread-safe (one per page). LatencyHistogram: thread-safe
// (atomics), Observe never blocks.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace trainctl {

using PromLabels = std::vector<std::pair<std::string, std::string>>;

class PromWriter {
 public:
  // `type`: "gauge", "counter" or "histogram".
  void Family(const std::string& name, const std::string& type, const std::string& help);
  void Sample(const std::string& name, const PromLabels& labels, double value);
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// "a\"b" for a"b: a label value as the format quotes it (quotes not included).
std::string PromEscape(const std::string& value);
// 1.5, 3, +Inf, -Inf, NaN.
std::string PromNumber(double value);

// Counts durations into fixed buckets (seconds): 0.5 ms .. 10 s.
class LatencyHistogram {
 public:
  static constexpr std::array<double, 14> kBounds = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  void Observe(absl::Duration d);
  // Writes name_bucket{le=...} (cumulative), name_sum and name_count with
  // `labels` (the family header is the caller's).
  void Write(PromWriter& w, const std::string& name, const PromLabels& labels) const;
  int64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::array<std::atomic<int64_t>, kBounds.size() + 1> buckets_{};  // last: +Inf
  std::atomic<int64_t> count_{0};
  std::atomic<int64_t> sum_ns_{0};
};

}  // namespace trainctl
