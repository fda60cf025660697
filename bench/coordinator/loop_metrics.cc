#include "bench/coordinator/loop_metrics.h"

#include <httplib.h>  // CPPHTTPLIB_OPENSSL_SUPPORT comes with the target (common/CMakeLists.txt)

#include <cmath>
#include <iostream>
#include <limits>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/coordinator/bench_support.h"

ABSL_FLAG(std::string, metrics_address, "",
          "the coordinator's --http-listen address (HOST:PORT): its loop histograms are read at "
          "the start and end of the steady window");

namespace trainctl::bench {
namespace {

// The value of label `name` in a label set `{a="x",b="y"}`; "" when absent.
std::string Label(absl::string_view labels, absl::string_view name) {
  const std::string key = absl::StrCat(name, "=\"");
  const size_t at = labels.find(key);
  if (at == absl::string_view::npos) return "";
  const size_t from = at + key.size();
  const size_t to = labels.find('"', from);
  return to == absl::string_view::npos ? "" : std::string(labels.substr(from, to - from));
}

}  // namespace

LoopHists ParseLoopHists(const std::string& page) {
  LoopHists out;
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    std::string what;
    if (absl::StartsWith(line, "trainctl_loop_task_wait_seconds_bucket{")) {
      what = "wait";
    } else if (absl::StartsWith(line, "trainctl_loop_task_run_seconds_bucket{")) {
      what = "run";
    } else {
      continue;
    }
    const size_t open = line.find('{'), close = line.find('}');
    if (close == absl::string_view::npos) continue;
    const absl::string_view labels = line.substr(open, close - open + 1);
    const std::string kind = Label(labels, "kind"), le = Label(labels, "le");
    double bound = 0, count = 0;
    if (le == "+Inf") {
      bound = std::numeric_limits<double>::infinity();
    } else if (!absl::SimpleAtod(le, &bound)) {
      continue;
    }
    if (kind.empty() ||
        !absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(close + 1)), &count))
      continue;
    out[absl::StrCat(kind, ".", what)].emplace_back(bound, count);
  }
  return out;
}

LoopHists SnapLoopHists() {
  const std::string address = absl::GetFlag(FLAGS_metrics_address);
  if (address.empty()) return {};
  httplib::Client http("http://" + address);
  http.set_connection_timeout(5);
  http.set_read_timeout(10);
  auto r = http.Get("/metrics", httplib::Headers{{"Authorization", "Bearer " + g_admin_token}});
  if (!r || r->status != 200) {
    static bool said = false;
    if (!said) std::cerr << "loop histograms: GET http://" << address << "/metrics failed\n";
    said = true;
    return {};
  }
  return ParseLoopHists(r->body);
}

void ReportLoopHists(const LoopHists& a, const LoopHists& b) {
  for (const auto& [name, after] : b) {
    auto before = a.find(name);
    if (before == a.end() || before->second.size() != after.size()) continue;
    std::vector<std::pair<double, double>> added;
    for (size_t i = 0; i < after.size(); ++i) {
      added.emplace_back(after[i].first, after[i].second - before->second[i].second);
    }
    const double n = added.empty() ? 0 : added.back().second;
    Put(absl::StrCat("loop.", name, ".n"), static_cast<int64_t>(n));
    for (const auto& [q, key] :
         {std::pair<double, const char*>{0.5, "p50_ms"}, {0.99, "p99_ms"}, {0.999, "p999_ms"}}) {
      double v = -1;
      for (const auto& [bound, count] : added) {
        if (n > 0 && count >= q * n) {
          v = std::isinf(bound) ? -1 : bound * 1e3;
          break;
        }
      }
      Put(absl::StrCat("loop.", name, ".", key), v);
    }
  }
}

}  // namespace trainctl::bench
