// The text exposition format as Prometheus parses it, and the HTTP endpoint
// serving it on a real socket.
#include "common/prometheus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/http_server.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;

TEST(PromWriterTest, FamiliesSamplesLabelsAndEscaping) {
  PromWriter w;
  w.Family("trainctl_jobs", "gauge", "Jobs by state.\nSecond line.");
  w.Sample("trainctl_jobs", {{"state", "running"}}, 3);
  w.Sample("trainctl_jobs", {{"state", "pending"}}, 0);
  w.Family("trainctl_job_loss", "gauge", "Loss.");
  w.Sample("trainctl_job_loss", {{"job_id", "a\"b\\c\nd"}}, 0.25);
  w.Sample("trainctl_up", {}, 1);
  EXPECT_EQ(w.Take(),
            "# HELP trainctl_jobs Jobs by state. Second line.\n"
            "# TYPE trainctl_jobs gauge\n"
            "trainctl_jobs{state=\"running\"} 3\n"
            "trainctl_jobs{state=\"pending\"} 0\n"
            "# HELP trainctl_job_loss Loss.\n"
            "# TYPE trainctl_job_loss gauge\n"
            "trainctl_job_loss{job_id=\"a\\\"b\\\\c\\nd\"} 0.25\n"
            "trainctl_up 1\n");
  EXPECT_EQ(PromNumber(NAN), "NaN");
  EXPECT_EQ(PromNumber(INFINITY), "+Inf");
  EXPECT_EQ(PromNumber(-INFINITY), "-Inf");
  EXPECT_EQ(PromNumber(1e20), "1e+20");
  EXPECT_EQ(PromNumber(-2), "-2");
}

TEST(PromWriterDeathTest, BadNameIsAProgrammingError) {
  PromWriter w;
  EXPECT_DEATH(w.Family("1bad", "gauge", "x"), "bad Prometheus");
  EXPECT_DEATH(w.Sample("ok", {{"bad-label", "v"}}, 1), "bad Prometheus");
}

TEST(LatencyHistogramTest, CumulativeBucketsSumAndCount) {
  LatencyHistogram h;
  h.Observe(absl::Microseconds(100));  // <= 0.5 ms
  h.Observe(absl::Milliseconds(3));    // <= 5 ms
  h.Observe(absl::Milliseconds(3));
  h.Observe(absl::Seconds(60));  // +Inf
  PromWriter w;
  w.Family("x_seconds", "histogram", "X.");
  h.Write(w, "x_seconds", {{"method", "Get"}});
  std::string text = w.Take();
  EXPECT_THAT(text, HasSubstr("x_seconds_bucket{method=\"Get\",le=\"0.0005\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("x_seconds_bucket{method=\"Get\",le=\"0.0025\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("x_seconds_bucket{method=\"Get\",le=\"0.005\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("x_seconds_bucket{method=\"Get\",le=\"10\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("x_seconds_bucket{method=\"Get\",le=\"+Inf\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("x_seconds_sum{method=\"Get\"} 60.0061\n"));
  EXPECT_THAT(text, HasSubstr("x_seconds_count{method=\"Get\"} 4\n"));
  EXPECT_EQ(h.count(), 4);
}

TEST(LatencyHistogramTest, ConcurrentObserversLoseNothing) {
  LatencyHistogram h;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) h.Observe(absl::Milliseconds(i % 20));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(h.count(), 40000);
}

TEST(HttpServerTest, ServesRegisteredPathsOnAFreePortAnd404Otherwise) {
  HttpServer server;
  int calls = 0;
  server.Handle("/metrics", [&] {
    ++calls;
    return HttpServer::Reply{200, "text/plain; version=0.0.4", "up 1\n"};
  });
  absl::StatusOr<std::string> bound = server.Start("127.0.0.1:0");
  ASSERT_TRUE(bound.ok()) << bound.status();
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(bound->substr(bound->rfind(':') + 1), &port));
  ASSERT_GT(port, 0);
  httplib::Client client("127.0.0.1", port);
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "up 1\n");
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4");
  auto missing = client.Get("/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(calls, 1);
  server.Stop();

  // Started and stopped at once: Stop never hangs.
  for (int i = 0; i < 20; ++i) {
    HttpServer quick;
    ASSERT_TRUE(quick.Start("127.0.0.1:0").ok());
  }

  HttpServer bad;
  EXPECT_EQ(bad.Start("no-port").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.Start("127.0.0.1:99999").status().message()),
              HasSubstr("--http-listen"));
}

}  // namespace
}  // namespace trainctl
