// The coordinator's and a worker's /metrics scraped by a real Prometheus
// (Debian's `prometheus`, started here on loopback with a generated scrape
// config, scrape_interval 1s): a PromQL query over its HTTP API returns the
// running job's samples/s as the coordinator and the worker export it.
// Skipped (with the reason) where the prometheus binary is not installed.
#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "tests/support/source_dir.h"

namespace trainctl {
namespace {

using trainctl::testing::Cluster;
using trainctl::testing::Process;
using trainctl::testing::SourceDir;

const char* kPrometheus = "/usr/bin/prometheus";

// A port free right now (Prometheus cannot report a port 0 it picked).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(a.sin_port);
}

// "HOST:PORT" from a daemon's "metrics on http://HOST:PORT/metrics" line.
std::string MetricsAddress(Process* p, absl::Duration timeout = absl::Seconds(10)) {
  static const std::regex re("metrics on http://([^/\\s]+)/metrics");
  for (absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(20))) {
    std::smatch m;
    std::string log = p->ReadLog();
    if (std::regex_search(log, m, re)) return m[1];
  }
  return "";
}

// Values of an instant PromQL query's vector result, keyed by `label`.
std::map<std::string, double> Query(httplib::Client& prom, const std::string& promql,
                                    const std::string& label) {
  std::map<std::string, double> out;
  auto res = prom.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
  if (!res || res->status != 200) return out;
  google::protobuf::Struct doc;
  if (!google::protobuf::util::JsonStringToMessage(res->body, &doc).ok()) return out;
  const auto& result = doc.fields().at("data").struct_value().fields().at("result").list_value();
  for (const auto& v : result.values()) {
    const auto& f = v.struct_value().fields();
    std::string key = f.at("metric").struct_value().fields().count(label)
                          ? f.at("metric").struct_value().fields().at(label).string_value()
                          : "";
    out[key] = std::stod(f.at("value").list_value().values(1).string_value());
  }
  return out;
}

TEST(PrometheusE2ETest, RealPrometheusScrapesTheRunningJobsSamplesPerSecond) {
  if (access(kPrometheus, X_OK) != 0) {
    GTEST_SKIP() << kPrometheus
                 << " is not installed (Debian package `prometheus`, see scripts/install-deps.sh)";
  }
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.StartCoordinator({"--http_listen=127.0.0.1:0"}));
  ASSERT_TRUE(cluster.StartWorker("w0", 1, false, {"--http_listen=127.0.0.1:0"}));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  const std::string coord = MetricsAddress(cluster.coordinator());
  const std::string worker = MetricsAddress(cluster.worker("w0"));
  ASSERT_FALSE(coord.empty()) << cluster.coordinator()->ReadLog();
  ASSERT_FALSE(worker.empty()) << cluster.worker("w0")->ReadLog();

  // A chatty stand-in rank: a train window of 100 samples/s every 50 ms, for
  // far longer than the test waits (it is cancelled at the end).
  ParsedJobSpec p = ParseJobSpecYaml(
      "model: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n",
      "prom.yaml",
      {"name=prom-chatty", "world_size=1", "training.epochs=200", "restart.max_restarts=0"});
  ASSERT_TRUE(p.ok());
  const std::string id = cluster.Submit(p.spec);
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(cluster.WaitState(id, v1::JOB_STATE_RUNNING, absl::Seconds(20)).state(),
            v1::JOB_STATE_RUNNING);

  const std::string dir = cluster.dir() + "/prometheus";
  std::filesystem::create_directories(dir + "/data");
  // The coordinator's /metrics needs a viewer token: Prometheus sends it
  // from a file (docs/observability.md), as an operator would set it up.
  const std::string viewer = cluster.CreateToken(v1::ROLE_VIEWER, "prometheus");
  ASSERT_FALSE(viewer.empty());
  {
    std::ofstream(dir + "/viewer.token") << viewer << "\n";
    std::ofstream cfg(dir + "/prometheus.yml");
    cfg << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        << "scrape_configs:\n"
        << "  - job_name: trainctl-coordinator\n    static_configs: [{targets: ['" << coord
        << "']}]\n"
        << "    authorization: {credentials_file: " << dir << "/viewer.token}\n"
        << "  - job_name: trainctl-worker\n    static_configs: [{targets: ['" << worker << "']}]\n";
  }
  {
    // Without it: refused.
    httplib::Client anonymous(coord);
    auto r = anonymous.Get("/metrics");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
  }
  const int port = FreePort();
  ASSERT_GT(port, 0);
  Process prometheus({kPrometheus, "--config.file=" + dir + "/prometheus.yml",
                      "--storage.tsdb.path=" + dir + "/data",
                      absl::StrCat("--web.listen-address=127.0.0.1:", port), "--log.level=warn"},
                     dir + "/prometheus.log");
  ASSERT_TRUE(prometheus.Start());
  httplib::Client prom("127.0.0.1", port);
  prom.set_connection_timeout(1);

  std::map<std::string, double> job_rate, rank_rate;
  for (absl::Time deadline = absl::Now() + absl::Seconds(30); absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(250))) {
    job_rate = Query(prom, "trainctl_job_samples_per_second", "job_id");
    rank_rate = Query(prom, "trainctl_worker_rank_samples_per_second", "job_id");
    if (job_rate.count(id) && rank_rate.count(id)) break;
  }
  ASSERT_TRUE(job_rate.count(id)) << "Prometheus never returned the job's samples/s\n"
                                  << prometheus.ReadLog();
  EXPECT_DOUBLE_EQ(job_rate[id], 100) << "the stand-in rank reports 100 samples/s";
  ASSERT_TRUE(rank_rate.count(id)) << prometheus.ReadLog();
  EXPECT_DOUBLE_EQ(rank_rate[id], 100);
  // The other families are there too, scraped from both targets.
  EXPECT_EQ(Query(prom, "trainctl_jobs{state=\"running\"}", "state")["running"], 1);
  EXPECT_EQ(Query(prom, "trainctl_workers{state=\"alive\"}", "state")["alive"], 1);
  EXPECT_EQ(Query(prom, "trainctl_worker_ranks{state=\"running\"}", "state")["running"], 1);
  EXPECT_GT(
      Query(prom,
            "sum(trainctl_rpcs_total{method=\"trainctl.v1.JobService/SubmitJob\",code=\"OK\"})",
            "")[""],
      0);
  EXPECT_GT(Query(prom, "trainctl_db_commit_duration_seconds_count", "job")["trainctl-coordinator"],
            0);
  // The scheduler's series (issue #48: the job above took at least one
  // pass; no preemption yet, a sample of 0) and the event loop's histograms.
  EXPECT_GE(Query(prom, "trainctl_scheduler_pass_seconds_count", "job")["trainctl-coordinator"], 1);
  EXPECT_EQ(Query(prom, "trainctl_preemptions_total", "job").count("trainctl-coordinator"), 1u);
  EXPECT_GT(Query(prom, "trainctl_loop_task_run_seconds_count{kind=\"posted\"}",
                  "job")["trainctl-coordinator"],
            0);

  prometheus.Kill(SIGTERM);
  prometheus.Wait(absl::Seconds(10));
  grpc::ClientContext ctx;
  v1::CancelJobRequest cancel;
  cancel.set_job_id(id);
  v1::Job ignored;
  EXPECT_TRUE(cluster.jobs()->CancelJob(&ctx, cancel, &ignored).ok());
}

}  // namespace
}  // namespace trainctl
