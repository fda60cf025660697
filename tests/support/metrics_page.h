// The coordinator's Prometheus page in end-to-end tests: fetched over HTTP
// from the address the coordinator logs (start it with
// --http_listen=127.0.0.1:0), and one sample's value read from it. For
// tests that link ${TRAINCTL_HTTPLIB}.
//
// Not thread-safe: use from the test's thread.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>  // CPPHTTPLIB_OPENSSL_SUPPORT comes with the target (common/CMakeLists.txt)

#include <cmath>
#include <string>

#include "absl/strings/numbers.h"
#include "tests/support/cluster.h"

namespace trainctl::testing {

// The coordinator's /metrics page, as `token` ("" and a test failure when
// it cannot be read).
inline std::string CoordinatorMetricsPage(Cluster& cluster, const std::string& token) {
  const std::string log = cluster.coordinator()->ReadLog();
  const std::string mark = "metrics on http://";
  const size_t at = log.find(mark);
  if (at == std::string::npos) {
    ADD_FAILURE() << "no metrics address in the coordinator's log";
    return "";
  }
  const size_t from = at + mark.size();
  httplib::Client http(log.substr(from, log.find('/', from) - from));
  http.set_connection_timeout(5);
  auto r = http.Get("/metrics", httplib::Headers{{"Authorization", "Bearer " + token}});
  if (!r || r->status != 200) {
    ADD_FAILURE() << "GET /metrics failed";
    return "";
  }
  return r->body;
}

// One sample's value (`series`: name and labels as the page writes them);
// NaN when the page has no such sample.
inline double PromSample(const std::string& page, const std::string& series) {
  const std::string key = "\n" + series + " ";
  const size_t at = page.find(key);
  double v = 0;
  if (at == std::string::npos ||
      !absl::SimpleAtod(
          page.substr(at + key.size(), page.find('\n', at + key.size()) - at - key.size()), &v)) {
    return std::nan("");
  }
  return v;
}

}  // namespace trainctl::testing
