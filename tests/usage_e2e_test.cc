// Accounting end to end (issue #48, docs/operator.md "Billing from trainctl
// usage"): a real coordinator and a real worker daemon (loopback, free
// ports) run a command job that keeps a CPU busy; `trainctl usage --by
// attempt -o csv` then has its billing record, with a wall time within 1 s
// of the rank's lifetime as the rank itself measured it, and, where this
// host lets the worker make cgroups (root, cgroup v1 or v2), the rank's CPU
// time and peak memory from its cgroup. A cancelled job whose rank takes its
// time to stop is charged until it exited, not until the cancel.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/cli/cli.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "worker/daemon/cgroup_limits.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
using trainctl::testing::Cluster;

v1::JobSpec Spec(const std::string& yaml) {
  ParsedJobSpec p = ParseJobSpecYaml(yaml, "job.yaml");
  EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
  return p.spec;
}

// Why the worker cannot give ranks cgroups here ("" when it can): the
// daemon runs as this user, so it can when a probe cgroup can be made,
// joined and removed (as resources_e2e_test checks).
std::string CgroupsUnusable() {
  if (::geteuid() != 0) return "needs root to create cgroups";
  worker::CgroupLimits cg = worker::CgroupLimits::DetectHere("/sys/fs/cgroup");
  if (!cg.available()) return absl::StrCat("no writable cgroups: ", cg.unavailable_reason());
  v1::ResourceSpec r;
  r.set_memory(64 << 20);
  r.set_cpus(1);
  absl::StatusOr<worker::RankCgroup> g = cg.Create(absl::StrCat("usage-probe-", ::getpid()), r);
  if (!g.ok()) return absl::StrCat("cannot create a cgroup: ", g.status().message());
  const pid_t child = ::fork();
  if (child == 0) {
    for (int fd : g->procs_fds()) {
      if (::write(fd, "0", 1) != 1) ::_exit(1);
    }
    ::_exit(0);
  }
  int status = 0;
  const bool joined = child > 0 && ::waitpid(child, &status, 0) == child && WIFEXITED(status) &&
                      WEXITSTATUS(status) == 0;
  g->CloseProcsFds();
  if (absl::Status s = g->Remove(); !s.ok()) return std::string(s.message());
  if (!joined) return "a process cannot join a rank cgroup here";
  return "";
}

struct CliResult {
  int code;
  std::string out;
  std::string err;
};

CliResult RunTrainctl(const Cluster& cluster, std::vector<std::string> args) {
  cli::CliEnvironment env;
  const std::string address = cluster.address();
  const std::string token = cluster.admin_token();
  env.getenv = [address, token](const std::string& name) -> std::optional<std::string> {
    if (name == "TRAINCTL_COORDINATOR") return address;
    if (name == "TRAINCTL_TOKEN") return token;
    if (name == "HOME" || name == "XDG_CONFIG_HOME")
      return std::string("/nonexistent-trainctl-home");
    return std::nullopt;
  };
  std::vector<const char*> argv = {"trainctl"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  int code = cli::RunCli(static_cast<int>(argv.size()), argv.data(), out, err, env);
  return {code, out.str(), err.str()};
}

// The CSV's rows as column name -> value (no field here holds a comma).
std::vector<std::map<std::string, std::string>> ParseCsv(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  std::vector<std::map<std::string, std::string>> rows;
  if (lines.empty()) return rows;
  const std::vector<std::string> head = absl::StrSplit(lines[0], ',');
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> cells = absl::StrSplit(lines[i], ',');
    std::map<std::string, std::string> row;
    for (size_t c = 0; c < head.size() && c < cells.size(); ++c) row[head[c]] = cells[c];
    rows.push_back(std::move(row));
  }
  return rows;
}

double Number(const std::string& s) {
  double v = -1;
  EXPECT_TRUE(absl::SimpleAtod(absl::StripAsciiWhitespace(s), &v)) << "'" << s << "'";
  return v;
}

double ReadSeconds(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return Number(s);
}

// The attempt `attempt` of `job` in `trainctl usage --by attempt -o csv`,
// once its record is final (state not running/stopping), or empty.
std::map<std::string, std::string> WaitAttemptRow(const Cluster& cluster, const std::string& job,
                                                  int attempt) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::map<std::string, std::string> found;
  while (absl::Now() < deadline) {
    CliResult r = RunTrainctl(cluster, {"usage", "--by", "attempt", "-o", "csv"});
    EXPECT_EQ(r.code, 0) << r.err;
    for (const auto& row : ParseCsv(r.out)) {
      if (row.count("job_id") == 0 || row.at("job_id") != job ||
          row.at("attempt") != absl::StrCat(attempt)) {
        continue;
      }
      found = row;
    }
    if (!found.empty() && !found["end"].empty()) return found;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return found;
}

TEST(UsageE2ETest, AnAttemptsBillingRecordHasItsRanksLifetimeAndCgroupFigures) {
  const std::string no_cgroups = CgroupsUnusable();
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(), "/bin/false");
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.StartWorker("w0", 2, false, {"--allow_commands"}));
  ASSERT_TRUE(cluster.WaitWorkers(1));

  // The rank stamps its own start and end (wall clock, as the coordinator
  // stamps the record) around 2 s of busy CPU and 64 MiB touched.
  const std::string start = cluster.dir() + "/rank-start";
  const std::string end = cluster.dir() + "/rank-end";
  const std::string resources = no_cgroups.empty() ? "resources: {cpus: 1, memory: 512Mi}\n" : "";
  const std::string script = cluster.dir() + "/busy.py";
  std::ofstream(script)
      << "import time\nb = bytearray(64 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
         "t = time.time()\nwhile time.time() - t < 2: sum(range(1000))\n";
  const std::string id = cluster.Submit(Spec(absl::StrCat(
      "name: busy\ndevice: cpu\n", resources,
      "restart: {max_restarts: 0}\ncommand:\n  argv: [/bin/sh, -c, '", "date +%s.%N > ", start,
      "; /usr/bin/python3 ", script, "; date +%s.%N > ", end, "']\n")));
  v1::Job job = cluster.WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(90));
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.DebugString();

  std::map<std::string, std::string> row = WaitAttemptRow(cluster, id, 1);
  ASSERT_FALSE(row.empty()) << "no usage row for " << id;
  ASSERT_FALSE(row["end"].empty()) << "the record is final once the rank exited";
  const double lifetime = ReadSeconds(end) - ReadSeconds(start);
  ASSERT_GT(lifetime, 1.9);
  const double wall = Number(row["wall_seconds"]);
  EXPECT_GE(wall, lifetime) << "the slots were held at least while the rank lived";
  EXPECT_LE(wall, lifetime + 1.0) << "placement, start-up and the exit report add under a second";
  EXPECT_EQ(row["kind"], "cpu");
  EXPECT_EQ(row["slots"], "1");
  EXPECT_EQ(row["queue"], "default");
  EXPECT_EQ(row["state"], "succeeded");
  EXPECT_NEAR(Number(row["slot_seconds"]), wall, 1e-3);
  EXPECT_EQ(Number(row["gpu_seconds"]), 0);
  if (!no_cgroups.empty()) {
    EXPECT_EQ(row["cpu_seconds"], "") << "no cgroup: unknown";
    EXPECT_EQ(row["ranks_measured"], "0");
    GTEST_SKIP() << "the cgroup figures need cgroups: " << no_cgroups;
  }
  EXPECT_EQ(row["cpus_per_rank"], "1");
  EXPECT_EQ(row["memory_limit_bytes"], absl::StrCat(512 << 20));
  EXPECT_EQ(row["ranks_measured"], "1");
  EXPECT_GT(Number(row["cpu_seconds"]), 1.0) << "2 s of a busy loop under a 1-CPU quota";
  EXPECT_LE(Number(row["cpu_seconds"]), wall + 0.5);
  EXPECT_GT(Number(row["peak_memory_bytes"]), 64 << 20) << "the 64 MiB it touched";

  // The job's own row sums its one attempt.
  CliResult by_job = RunTrainctl(cluster, {"usage", "--by", "job", "-o", "csv"});
  ASSERT_EQ(by_job.code, 0) << by_job.err;
  bool seen = false;
  for (const auto& r : ParseCsv(by_job.out)) {
    if (r.at("job_id") != id) continue;
    seen = true;
    EXPECT_NEAR(Number(r.at("wall_seconds")), wall, 1e-2);
    EXPECT_NEAR(Number(r.at("cpu_seconds")), Number(row["cpu_seconds"]), 1e-2);
  }
  EXPECT_TRUE(seen) << by_job.out;
}

TEST(UsageE2ETest, ACancelledRankIsChargedUntilItExited) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(), "/bin/false");
  // A stop grace well above the rank's 2 s: the cluster's own 2 s grace
  // raced the handler's write, and lost under load (a SIGKILL at 2 s).
  ASSERT_TRUE(cluster.StartCoordinator({"--stop_grace_s=30"}));
  ASSERT_TRUE(cluster.StartWorker("w0", 1, false, {"--allow_commands", "--stop_grace_s=30"}));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  // A rank that takes 2 s to stop after SIGTERM (a checkpoint on the way
  // out), well within the stop grace.
  const std::string started = cluster.dir() + "/started";
  const std::string end = cluster.dir() + "/rank-end";
  const std::string script = cluster.dir() + "/slow_stop.py";
  std::ofstream(script) << "import signal, sys, time\n"
                           "def stop(*_):\n"
                           "    time.sleep(2)\n"
                           "    open('"
                        << end
                        << "', 'w').write(repr(time.time()))\n"
                           "    sys.exit(0)\n"
                           "signal.signal(signal.SIGTERM, stop)\n"
                           "open('"
                        << started
                        << "', 'w').close()\n"
                           "while True: time.sleep(0.1)\n";
  const std::string id =
      cluster.Submit(Spec(absl::StrCat("name: slow-stop\ndevice: cpu\nrestart: {max_restarts: "
                                       "0}\ncommand:\n  argv: [/usr/bin/python3, ",
                                       script, "]\n")));
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!fs::exists(started) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(fs::exists(started)) << cluster.Get(id).DebugString();
  CliResult cancel = RunTrainctl(cluster, {"cancel", id});
  ASSERT_EQ(cancel.code, 0) << cancel.err;
  v1::Job job = cluster.WaitState(id, v1::JOB_STATE_CANCELLED, absl::Seconds(30));
  ASSERT_EQ(job.state(), v1::JOB_STATE_CANCELLED);
  const absl::Time decided = absl::FromUnixSeconds(job.attempts(0).end_time().seconds()) +
                             absl::Nanoseconds(job.attempts(0).end_time().nanos());

  std::map<std::string, std::string> row = WaitAttemptRow(cluster, id, 1);
  ASSERT_FALSE(row.empty() || row["end"].empty()) << "no final usage row for " << id;
  ASSERT_TRUE(fs::exists(end)) << "the rank ran its SIGTERM handler";
  const double exited = ReadSeconds(end);
  const double decided_s = absl::ToDoubleSeconds(decided - absl::UnixEpoch());
  EXPECT_GE(exited - decided_s, 1.9) << "the rank stopped 2 s after the cancel";
  EXPECT_EQ(row["state"], "cancelled");
  // The record's end is the rank's exit (as the coordinator received it),
  // so its wall time covers the 2 s grace.
  absl::Time record_end;
  std::string err;
  ASSERT_TRUE(absl::ParseTime("%Y-%m-%dT%H:%M:%E*SZ", row["end"], &record_end, &err))
      << row["end"] << ": " << err;
  const double end_s = absl::ToDoubleSeconds(record_end - absl::UnixEpoch());
  EXPECT_GE(end_s, exited - 0.05) << "ends when the rank exited, not at the cancel";
  EXPECT_LE(end_s, exited + 1.0);
  EXPECT_GE(end_s - decided_s, 1.9) << "the grace is charged";
}

}  // namespace
}  // namespace trainctl
