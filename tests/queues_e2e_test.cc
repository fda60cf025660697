// Queues end to end (issue #26, docs/queues.md): a real coordinator process,
// no workers (jobs stay pending). An admin defines queues through the CLI and
// the client library; a submitter token bound to queue `a` lands there
// without naming it and is refused queue `b`; a queue with a pending job
// cannot be deleted; an update keeps the queue and changes its quota; queues
// survive a coordinator restart. A queue marked the default (issue #44)
// takes the jobs that name none, and one of them runs on a (scripted) worker.
// What a queue's job holds of each quota dimension shows in describe, list
// and /metrics.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/cli.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "tests/support/fake_worker.h"
#include "tests/support/metrics_page.h"
#include "trainctl/client.h"

namespace trainctl {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using trainctl::testing::Cluster;

v1::JobSpec Spec(const std::string& name) {
  ParsedJobSpec p = ParseJobSpecYaml(
      "model: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n",
      "queues.yaml", {"name=" + name, "world_size=1"});
  EXPECT_TRUE(p.ok());
  return p.spec;
}

struct CliResult {
  int code;
  std::string out;
  std::string err;
};

// Runs one trainctl command line in-process against the cluster, as `token`.
CliResult RunTrainctl(const Cluster& cluster, const std::string& token,
                      std::vector<std::string> args) {
  cli::CliEnvironment env;
  const std::string address = cluster.address();
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

// nullptr when it cannot connect (a test failure unless `may_fail`).
std::unique_ptr<Client> ClientAs(const Cluster& cluster, const std::string& token,
                                 bool may_fail = false) {
  ClientOptions options;
  options.address = cluster.address();
  options.token = token;
  options.timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(options);
  if (!may_fail) {
    EXPECT_TRUE(c.ok()) << c.status();
  }
  return c.ok() ? *std::move(c) : nullptr;
}

TEST(QueuesE2ETest, AdminDefinesQueuesTokensBindSubmittersDeleteWaitsForJobs) {
  Cluster cluster(testing::BuildDirOfThisTest(), "");
  ASSERT_TRUE(cluster.StartCoordinator());
  const std::string admin = cluster.admin_token();

  // Without queues every job is taken as before, in "default".
  std::unique_ptr<Client> as_admin = ClientAs(cluster, admin);
  ASSERT_NE(as_admin, nullptr);
  absl::StatusOr<v1::Job> before = as_admin->Submit(Spec("before-queues"));
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->spec().queue(), "default");
  ASSERT_TRUE(as_admin->Cancel(before->id(), "done").ok());
  CliResult none = RunTrainctl(cluster, admin, {"queue", "list"});
  EXPECT_EQ(none.code, 0) << none.err;
  EXPECT_THAT(none.out, HasSubstr("no queues"));

  // The admin defines two queues through the CLI.
  CliResult made = RunTrainctl(
      cluster, admin,
      {"queue", "create", "a", "--gpu", "4", "--cohort", "lab", "--default-priority", "7"});
  ASSERT_EQ(made.code, 0) << made.err;
  EXPECT_THAT(made.out, HasSubstr("queue a created"));
  made = RunTrainctl(cluster, admin, {"queue", "create", "b", "--max-job-size", "2"});
  ASSERT_EQ(made.code, 0) << made.err;
  CliResult again = RunTrainctl(cluster, admin, {"queue", "create", "b"});
  EXPECT_NE(again.code, 0);
  EXPECT_THAT(again.err, HasSubstr("already exists"));
  CliResult bad = RunTrainctl(cluster, admin, {"queue", "create", "c", "--gpu", "-3"});
  EXPECT_EQ(bad.code, 2) << "INVALID_ARGUMENT is a usage error";
  EXPECT_THAT(bad.err, HasSubstr("queue.nominal_gpu: must be -1 (unlimited) or >= 0, got -3"));

  // A submitter bound to queue a.
  CliResult tok = RunTrainctl(cluster, admin,
                              {"token", "create", "--role", "submitter", "--name", "team-a",
                               "--queues", "a", "-o", "json"});
  ASSERT_EQ(tok.code, 0) << tok.err;
  size_t at = tok.out.find("\"secret\"");
  ASSERT_NE(at, std::string::npos) << tok.out;
  at = tok.out.find('"', tok.out.find(':', at)) + 1;
  const std::string secret = tok.out.substr(at, tok.out.find('"', at) - at);
  ASSERT_FALSE(secret.empty()) << tok.out;
  std::unique_ptr<Client> as_a = ClientAs(cluster, secret);
  ASSERT_NE(as_a, nullptr);

  absl::StatusOr<v1::Job> job = as_a->Submit(Spec("in-a"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().queue(), "a") << "a job naming no queue goes to the token's first";
  EXPECT_EQ(job->spec().priority(), 7) << "and gets the queue's default priority";
  EXPECT_EQ(job->state(), v1::JOB_STATE_PENDING);

  v1::JobSpec to_b = Spec("to-b");
  to_b.set_queue("b");
  absl::StatusOr<v1::Job> refused = as_a->Submit(to_b);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("queue 'b'"));
  // Through the CLI: --queue overrides the file's queue:.
  const std::string file = cluster.dir() + "/job.yaml";
  {
    std::ofstream f(file);
    f << "name: from-cli\nworld_size: 1\nqueue: a\nmodel: {name: mlp, input_dim: 5, classes: 2}\n"
         "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n";
  }
  CliResult via_cli = RunTrainctl(cluster, secret, {"submit", file, "--queue", "b"});
  EXPECT_EQ(via_cli.code, 1);
  EXPECT_THAT(via_cli.err, HasSubstr("may not submit to queue 'b' (its queues: a)"));
  // A dry run is refused what the submit would be.
  via_cli = RunTrainctl(cluster, secret, {"submit", file, "--queue", "b", "--dry-run"});
  EXPECT_EQ(via_cli.code, 1);
  EXPECT_THAT(via_cli.err, HasSubstr("may not submit to queue 'b'"));
  via_cli = RunTrainctl(cluster, secret, {"submit", file, "-o", "json"});
  EXPECT_EQ(via_cli.code, 0) << via_cli.err;
  EXPECT_THAT(via_cli.out, ContainsRegex("\"queue\": ?\"a\""));
  // An admin may submit anywhere; an undefined queue is refused by name.
  v1::JobSpec nowhere = Spec("nowhere");
  nowhere.set_queue("zz");
  refused = as_admin->Submit(nowhere);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("queue: no queue named 'zz' (defined: a, b)"));
  v1::JobSpec big = Spec("big");
  big.set_queue("b");
  big.set_world_size(3);
  refused = as_admin->Submit(big);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("max_job_size of 2"));

  // The listing shows the pending job in a; describe and list of jobs name the queue.
  CliResult list = RunTrainctl(cluster, secret, {"queue", "list"});
  ASSERT_EQ(list.code, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr("NAME"));
  std::istringstream lines(list.out);
  std::string header, row_a, row_b;
  std::getline(lines, header);
  std::getline(lines, row_a);
  std::getline(lines, row_b);
  EXPECT_THAT(
      header,
      MatchesRegex("NAME +COHORT +GPU +CPU +MAX-JOB +PRIORITY +PENDING +RUNNING +DEFAULT *"));
  EXPECT_THAT(row_a, MatchesRegex("a +lab +0/4 +0/- +- +7 +2 +0 +- *"));
  EXPECT_THAT(row_b, MatchesRegex("b +- +0/- +0/- +2 +0 +0 +0 +- *"));
  CliResult jobs = RunTrainctl(cluster, secret, {"list"});
  ASSERT_EQ(jobs.code, 0) << jobs.err;
  EXPECT_THAT(jobs.out, ContainsRegex("in-a-[0-9a-f]+ +in-a +a +PENDING"));
  EXPECT_THAT(jobs.out, ContainsRegex("from-cli-[0-9a-f]+ +from-cli +a +PENDING"));

  // Delete waits for the queue's jobs; viewers and submitters may not delete.
  CliResult del = RunTrainctl(cluster, admin, {"queue", "delete", "a"});
  EXPECT_NE(del.code, 0);
  EXPECT_THAT(del.err, HasSubstr("2 pending and 0 running"));
  EXPECT_EQ(as_a->DeleteQueue("b").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(as_admin->DeleteQueue("default").code(), absl::StatusCode::kNotFound);

  // An update replaces the quota, keeps create_time.
  absl::StatusOr<v1::QueueStatus> old_a = as_admin->GetQueue("a");
  ASSERT_TRUE(old_a.ok()) << old_a.status();
  CliResult upd = RunTrainctl(cluster, admin, {"queue", "create", "a", "--gpu", "8", "--update"});
  ASSERT_EQ(upd.code, 0) << upd.err;
  absl::StatusOr<v1::QueueStatus> new_a = as_admin->GetQueue("a");
  ASSERT_TRUE(new_a.ok()) << new_a.status();
  EXPECT_EQ(new_a->queue().nominal_gpu(), 8);
  EXPECT_EQ(new_a->queue().cohort(), "") << "an update replaces the whole queue";
  EXPECT_EQ(new_a->queue().create_time().seconds(), old_a->queue().create_time().seconds());
  EXPECT_EQ(new_a->pending_jobs(), 2);

  // Once its job is gone the queue can go; b survives a coordinator restart.
  ASSERT_TRUE(as_admin->Cancel(job->id(), "test over").ok());
  absl::StatusOr<std::vector<v1::Job>> all = as_admin->List({v1::JOB_STATE_PENDING});
  ASSERT_TRUE(all.ok()) << all.status();
  for (const v1::Job& j : *all) ASSERT_TRUE(as_admin->Cancel(j.id(), "test over").ok()) << j.id();
  del = RunTrainctl(cluster, admin, {"queue", "delete", "a"});
  EXPECT_EQ(del.code, 0) << del.err;
  cluster.KillCoordinator();
  ASSERT_TRUE(cluster.StartCoordinator());
  // The restarted coordinator answers once its port is served again.
  absl::StatusOr<std::vector<v1::QueueStatus>> queues = absl::UnavailableError("not asked");
  for (absl::Time end = absl::Now() + absl::Seconds(15); absl::Now() < end && !queues.ok();) {
    std::unique_ptr<Client> after = ClientAs(cluster, cluster.admin_token(), /*may_fail=*/true);
    if (after != nullptr) queues = after->ListQueues();
    if (!queues.ok()) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(queues.ok()) << queues.status();
  ASSERT_EQ(queues->size(), 1u);
  EXPECT_EQ((*queues)[0].queue().name(), "b");
  EXPECT_EQ((*queues)[0].queue().max_job_size(), 2);
}

// Accounting without workers: a job that never ran holds no slot time, a
// viewer may ask, and a malformed or future `since` is refused naming it
// (through the API and the CLI's --since).
TEST(QueuesE2ETest, UsageCountsOnlySlotTimeAndRefusesABadSince) {
  Cluster cluster(testing::BuildDirOfThisTest(), "");
  ASSERT_TRUE(cluster.StartCoordinator());
  std::unique_ptr<Client> as_admin = ClientAs(cluster, cluster.admin_token());
  ASSERT_NE(as_admin, nullptr);
  ASSERT_TRUE(as_admin->Submit(Spec("never-placed")).ok());
  v1::CreateTokenRequest tok;
  tok.set_name("auditor");
  tok.set_role(v1::ROLE_VIEWER);
  absl::StatusOr<v1::CreateTokenResponse> viewer = as_admin->CreateToken(tok);
  ASSERT_TRUE(viewer.ok()) << viewer.status();
  std::unique_ptr<Client> as_viewer = ClientAs(cluster, viewer->secret());
  ASSERT_NE(as_viewer, nullptr);

  absl::StatusOr<v1::GetUsageResponse> usage = as_viewer->GetUsage(v1::GetUsageRequest());
  ASSERT_TRUE(usage.ok()) << usage.status();
  EXPECT_EQ(usage->rows_size(), 0) << "a pending job held no slot";
  EXPECT_FALSE(usage->has_since());
  EXPECT_GT(usage->until().seconds(), 0);

  v1::GetUsageRequest future;
  future.mutable_since()->set_seconds(absl::ToUnixSeconds(absl::Now() + absl::Hours(1)));
  absl::StatusOr<v1::GetUsageResponse> refused = as_viewer->GetUsage(future);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("since: "));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("after the coordinator's now"));
  v1::GetUsageRequest malformed;
  malformed.mutable_since()->set_nanos(-1);
  refused = as_viewer->GetUsage(malformed);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("since: not a valid timestamp"));

  CliResult table = RunTrainctl(cluster, viewer->secret(), {"usage", "--since", "7d"});
  EXPECT_EQ(table.code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("no slot time since "));
  CliResult csv = RunTrainctl(cluster, viewer->secret(), {"usage", "-o", "csv"});
  CliResult bad;
  EXPECT_EQ(csv.code, 0) << csv.err;
  EXPECT_EQ(
      csv.out,
      "queue,owner,kind,slot_seconds,slot_hours,attempts,jobs,gpu_seconds,wall_seconds,cpu_seconds,"
      "peak_memory_bytes\n")
      << "the first columns as before; the measured ones appended";
  CliResult by_attempt =
      RunTrainctl(cluster, viewer->secret(), {"usage", "--by", "attempt", "-o", "csv"});
  EXPECT_EQ(by_attempt.code, 0) << by_attempt.err;
  EXPECT_THAT(by_attempt.out, ::testing::StartsWith("job_id,attempt,owner,queue,kind,slots,"));
  bad = RunTrainctl(cluster, viewer->secret(), {"usage", "--by", "user"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--by: 'user' is not one of queue, owner, job, attempt"));
  bad = RunTrainctl(cluster, viewer->secret(), {"usage", "--since", "1h", "--until", "2h"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--until: '2h' is not after --since"));
  bad = RunTrainctl(cluster, viewer->secret(), {"usage", "--since", "last week"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("trainctl usage: --since: 'last week' is neither a duration"));
  bad = RunTrainctl(cluster, viewer->secret(), {"usage", "--since", "2999-01-01T00:00:00Z"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--since: '2999-01-01T00:00:00Z' is in the future"));
}

// Queue.default_resources through the CLI and the real coordinator: create
// with --default-cpus/--default-memory/--default-pids, describe shows them,
// bad values name the flag or the field, and a job (and a dry run) that
// asks for no resources gets them.
TEST(QueuesE2ETest, QueueDefaultResourcesFillJobsThatAskForNone) {
  Cluster cluster(testing::BuildDirOfThisTest(), "");
  ASSERT_TRUE(cluster.StartCoordinator());
  const std::string admin = cluster.admin_token();
  CliResult made = RunTrainctl(cluster, admin,
                               {"queue", "create", "batch", "--cpu", "8", "--default-cpus", "2",
                                "--default-memory", "4Gi", "--default-pids", "512"});
  ASSERT_EQ(made.code, 0) << made.err;
  EXPECT_THAT(made.out, HasSubstr("default resources 2 cpus, 4 GiB memory, 512 pids per rank"));
  CliResult shown = RunTrainctl(cluster, admin, {"queue", "describe", "batch"});
  ASSERT_EQ(shown.code, 0) << shown.err;
  EXPECT_THAT(
      shown.out,
      ContainsRegex("Default resources: +2 cpus, 4 GiB memory, 512 pids per rank \\(jobs that "
                    "ask for none\\)"));
  ASSERT_EQ(RunTrainctl(cluster, admin, {"queue", "create", "plain"}).code, 0);
  shown = RunTrainctl(cluster, admin, {"queue", "describe", "plain"});
  EXPECT_THAT(shown.out, ContainsRegex("Default resources: +none"));
  EXPECT_THAT(shown.out, ContainsRegex("Fair-share weight: +1\n")) << "unset weighs 1";

  // Fair-share weights (issue #48): the queue's, and its owners'.
  made = RunTrainctl(cluster, admin,
                     {"queue", "create", "heavy", "--weight", "3", "--owner-weight", "alice=2",
                      "--owner-weight", "bob=0.5"});
  ASSERT_EQ(made.code, 0) << made.err;
  EXPECT_THAT(made.out, HasSubstr(", weight 3"));
  shown = RunTrainctl(cluster, admin, {"queue", "describe", "heavy"});
  EXPECT_THAT(shown.out, ContainsRegex("Fair-share weight: +3 \\(owners: alice=2, bob=0.5\\)"));
  CliResult bad_weight = RunTrainctl(cluster, admin, {"queue", "create", "c", "--weight", "-1"});
  EXPECT_EQ(bad_weight.code, 2) << bad_weight.err;
  EXPECT_THAT(bad_weight.err, HasSubstr("queue.weight: must be > 0 (0 or unset = 1), got -1"));
  bad_weight = RunTrainctl(cluster, admin, {"queue", "create", "c", "--owner-weight", "alice"});
  EXPECT_EQ(bad_weight.code, 2) << bad_weight.err;
  EXPECT_THAT(bad_weight.err,
              HasSubstr("--owner-weight: must be OWNER=WEIGHT (e.g. alice=2), got 'alice'"));
  bad_weight = RunTrainctl(cluster, admin, {"queue", "create", "c", "--owner-weight", "alice=0"});
  EXPECT_EQ(bad_weight.code, 2) << bad_weight.err;
  EXPECT_THAT(bad_weight.err, HasSubstr("queue.owner_weights[\"alice\"]: must be > 0, got 0"));

  // Per-owner limits (issue #48 item 4): shown by describe, validated.
  EXPECT_THAT(shown.out, ContainsRegex("Per owner: +no limit\n"));
  ASSERT_EQ(RunTrainctl(cluster, admin,
                        {"queue", "create", "capped", "--max-jobs-per-owner", "2",
                         "--max-slots-per-owner", "8"})
                .code,
            0);
  shown = RunTrainctl(cluster, admin, {"queue", "describe", "capped"});
  EXPECT_THAT(shown.out, ContainsRegex("Per owner: +at most 2 running jobs, 8 slots\n"));
  CliResult bad_limit =
      RunTrainctl(cluster, admin, {"queue", "create", "c", "--max-slots-per-owner", "-1"});
  EXPECT_EQ(bad_limit.code, 2) << bad_limit.err;
  EXPECT_THAT(bad_limit.err,
              HasSubstr("queue.max_slots_per_owner: must be 0 (no limit) or > 0, got -1"));

  CliResult bad = RunTrainctl(cluster, admin, {"queue", "create", "c", "--default-memory", "4GB"});
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_THAT(
      bad.err,
      HasSubstr("--default-memory: must be a byte quantity (512Mi, 4Gi, 2G or plain bytes), got "
                "'4GB'"));
  bad = RunTrainctl(cluster, admin, {"queue", "create", "c", "--default-pids", "2"});
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_THAT(
      bad.err,
      HasSubstr("queue.default_resources.pids: must be 0 (no limit) or in [8, 4194304], got 2"));
  bad = RunTrainctl(cluster, admin, {"queue", "create", "c", "--default-cpus", "5000"});
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_THAT(
      bad.err,
      HasSubstr("queue.default_resources.cpus: must be 0 (no limit) or in [0.01, 4096] CPUs"));

  std::unique_ptr<Client> as_admin = ClientAs(cluster, admin);
  ASSERT_NE(as_admin, nullptr);
  v1::JobSpec spec = Spec("defaulted");
  spec.set_queue("batch");
  absl::StatusOr<DryRunResult> dry = as_admin->DryRun(spec);
  ASSERT_TRUE(dry.ok()) << dry.status();
  EXPECT_EQ(dry->job.spec().resources().cpus(), 2);
  EXPECT_EQ(dry->job.spec().resources().memory(), int64_t{4} << 30);
  absl::StatusOr<v1::Job> job = as_admin->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().resources().cpus(), 2);
  EXPECT_EQ(job->spec().resources().memory(), int64_t{4} << 30);
  EXPECT_EQ(job->spec().resources().pids(), 512);
  // A job that sets any of the three keeps exactly its own.
  v1::JobSpec own = Spec("own");
  own.set_queue("batch");
  own.mutable_resources()->set_memory(int64_t{1} << 30);
  job = as_admin->Submit(own);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().resources().cpus(), 0);
  EXPECT_EQ(job->spec().resources().memory(), int64_t{1} << 30);
  EXPECT_EQ(job->spec().resources().pids(), 0);
}

// Issue #48: borrowing and lending limits through the CLI (create, describe,
// list), a limit the queue cannot have refused naming the field, and a job
// the queue and its cohort can never run refused at submit unless it waits.
TEST(QueuesE2ETest, BorrowingAndLendingLimitsAreShownAndBoundWhatAQueueCanEverRun) {
  Cluster cluster(testing::BuildDirOfThisTest(), "");
  ASSERT_TRUE(cluster.StartCoordinator());
  const std::string admin = cluster.admin_token();
  CliResult made = RunTrainctl(
      cluster, admin,
      {"queue", "create", "lender", "--gpu", "4", "--cohort", "lab", "--lending-limit-gpu", "1"});
  ASSERT_EQ(made.code, 0) << made.err;
  EXPECT_THAT(made.out, HasSubstr("GPUs 4 (lends at most 1)"));
  made = RunTrainctl(
      cluster, admin,
      {"queue", "create", "borrower", "--gpu", "2", "--cpu", "2", "--cohort", "lab",
       "--borrowing-limit-gpu", "5", "--borrowing-limit-cpu", "0", "--lending-limit-cpu", "2"});
  ASSERT_EQ(made.code, 0) << made.err;
  CliResult shown = RunTrainctl(cluster, admin, {"queue", "describe", "borrower"});
  ASSERT_EQ(shown.code, 0) << shown.err;
  EXPECT_THAT(shown.out, ContainsRegex("GPU slots: +0 used of 2 \\(borrows at most 5\\)\n"));
  EXPECT_THAT(shown.out,
              ContainsRegex("CPU slots: +0 used of 2 \\(borrows at most 0, lends at most 2\\)\n"));
  CliResult listed = RunTrainctl(cluster, admin, {"queue", "list"});
  ASSERT_EQ(listed.code, 0) << listed.err;
  EXPECT_THAT(listed.out, HasSubstr("0/4 (lends at most 1)"));
  CliResult json = RunTrainctl(cluster, admin, {"queue", "describe", "lender", "-o", "json"});
  ASSERT_EQ(json.code, 0) << json.err;
  EXPECT_THAT(json.out, ContainsRegex("\"lending_?[lL]imit_?[gG]pu\": ?1"));

  CliResult bad = RunTrainctl(cluster, admin,
                              {"queue", "create", "c", "--gpu", "2", "--lending-limit-gpu", "3"});
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_THAT(bad.err,
              HasSubstr("queue.lending_limit_gpu: 3 is more than the queue's nominal_gpu of 2"));
  bad = RunTrainctl(cluster, admin, {"queue", "create", "c", "--borrowing-limit-cpu", "1"});
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_THAT(bad.err, HasSubstr("queue.borrowing_limit_cpu: needs a nominal_cpu quota"));

  // borrower can ever hold its 2 GPUs plus the 1 lender lends.
  std::unique_ptr<Client> as_admin = ClientAs(cluster, admin);
  ASSERT_NE(as_admin, nullptr);
  v1::JobSpec spec = Spec("too-big");
  spec.set_queue("borrower");
  spec.set_device(v1::DEVICE_CUDA);
  spec.set_world_size(4);
  absl::StatusOr<v1::Job> job = as_admin->Submit(spec);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(),
              HasSubstr("world_size: 4 ranks are more than queue 'borrower' can ever run (3 "
                        "cuda slots"));
  spec.mutable_scheduling()->set_wait_for_capacity(true);
  job = as_admin->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_PENDING);
}

// Issue #48: quotas in CPUs and memory through the CLI: sizes as
// --default-memory takes them, shown where set (create, describe, list's
// extra column), a bad value refused naming the flag or the field, and a job
// the queue can never hold in memory refused at submit.
TEST(QueuesE2ETest, CpuAndMemoryQuotasAreSetShownAndBoundWhatAQueueCanEverRun) {
  Cluster cluster(testing::BuildDirOfThisTest(), "");
  ASSERT_TRUE(cluster.StartCoordinator());
  const std::string admin = cluster.admin_token();
  CliResult made = RunTrainctl(
      cluster, admin,
      {"queue", "create", "mem", "--cohort", "lab", "--nominal-cpus", "8", "--nominal-memory",
       "16Gi", "--borrowing-limit-memory", "16Gi", "--lending-limit-cpus", "2"});
  ASSERT_EQ(made.code, 0) << made.err;
  EXPECT_THAT(made.out,
              HasSubstr("cpus 8 (lends at most 2), memory 16 GiB (borrows at most 16 GiB)"));
  made = RunTrainctl(cluster, admin, {"queue", "create", "plain", "--gpu", "2"});
  ASSERT_EQ(made.code, 0) << made.err;
  CliResult shown = RunTrainctl(cluster, admin, {"queue", "describe", "mem"});
  ASSERT_EQ(shown.code, 0) << shown.err;
  EXPECT_THAT(shown.out, ContainsRegex("CPUs: +0 used of 8 \\(lends at most 2\\)\n"));
  EXPECT_THAT(shown.out, ContainsRegex("Memory: +0 used of 16 GiB \\(borrows at most 16 GiB\\)\n"));
  shown = RunTrainctl(cluster, admin, {"queue", "describe", "plain"});
  ASSERT_EQ(shown.code, 0) << shown.err;
  EXPECT_THAT(shown.out, Not(HasSubstr("CPUs:")));
  EXPECT_THAT(shown.out, Not(HasSubstr("Memory:")));
  CliResult listed = RunTrainctl(cluster, admin, {"queue", "list"});
  ASSERT_EQ(listed.code, 0) << listed.err;
  EXPECT_THAT(listed.out, HasSubstr("CPUS/MEMORY"));
  EXPECT_THAT(listed.out,
              HasSubstr("cpus 0/8 (lends at most 2), memory 0/16 GiB (borrows at most 16 GiB)"));
  CliResult json = RunTrainctl(cluster, admin, {"queue", "describe", "mem", "-o", "json"});
  ASSERT_EQ(json.code, 0) << json.err;
  EXPECT_THAT(json.out, ContainsRegex("\"nominal_?[mM]emory_?[bB]ytes\": ?\"?17179869184"));

  CliResult bad = RunTrainctl(cluster, admin, {"queue", "create", "c", "--nominal-memory", "lots"});
  EXPECT_NE(bad.code, 0);
  EXPECT_THAT(bad.err, HasSubstr("--nominal-memory: must be a byte quantity"));
  bad = RunTrainctl(cluster, admin,
                    {"queue", "create", "c", "--nominal-cpus", "4", "--lending-limit-cpus", "5"});
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_THAT(bad.err,
              HasSubstr("queue.lending_limit_cpus: 5 is more than the queue's nominal_cpus of 4"));
  bad = RunTrainctl(cluster, admin, {"queue", "create", "c", "--borrowing-limit-memory", "1Gi"});
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_THAT(bad.err,
              HasSubstr("queue.borrowing_limit_memory_bytes: needs a nominal_memory_bytes quota"));

  // mem can ever hold its own 16 GiB (no other queue of its cohort lends
  // it more; its borrowing limit does not bind): 2 ranks of 16 GiB never fit.
  std::unique_ptr<Client> as_admin = ClientAs(cluster, admin);
  ASSERT_NE(as_admin, nullptr);
  v1::JobSpec spec = Spec("too-much-memory");
  spec.set_queue("mem");
  spec.set_world_size(2);
  spec.mutable_resources()->set_memory(int64_t{16} << 30);
  absl::StatusOr<v1::Job> job = as_admin->Submit(spec);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("resources.memory: the job asks 32 GiB (2 ranks of "
                                                "16 GiB); queue 'mem' with its cohort can "
                                                "hold at most 16 GiB"));
  spec.mutable_scheduling()->set_wait_for_capacity(true);
  job = as_admin->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_PENDING);
}

// Issue #44: the first queue, unmarked, makes a job that names none fail
// with the fix in the message; `--cpu 2` alone is said to leave GPUs
// unlimited; once the admin marks the queue the default (--default), a job
// that names no queue lands in it, is admitted and runs on a worker; a new
// default un-marks the old one.
TEST(QueuesE2ETest, TheDefaultQueueTakesJobsThatNameNoneAndTheyRun) {
  Cluster cluster(testing::BuildDirOfThisTest(), "");
  ASSERT_TRUE(cluster.StartCoordinator());
  const std::string admin = cluster.admin_token();
  CliResult made = RunTrainctl(cluster, admin, {"queue", "create", "team-a", "--cpu", "2"});
  ASSERT_EQ(made.code, 0) << made.err;
  EXPECT_THAT(made.out, HasSubstr("queue team-a created: GPUs unlimited (no --gpu), CPUs 2,"));
  EXPECT_THAT(made.out, Not(HasSubstr("default queue")));

  std::unique_ptr<Client> as_admin = ClientAs(cluster, admin);
  ASSERT_NE(as_admin, nullptr);
  absl::StatusOr<v1::Job> refused = as_admin->Submit(Spec("nameless"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("queue: this job names no queue and no queue is the default (defined: "
                        "team-a); name one"));
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("trainctl queue create NAME --default"));

  made = RunTrainctl(cluster, admin,
                     {"queue", "create", "team-a", "--cpu", "2", "--update", "--default"});
  ASSERT_EQ(made.code, 0) << made.err;
  EXPECT_THAT(made.out, HasSubstr("team-a is the default queue: jobs that name no queue go here"));
  CliResult list = RunTrainctl(cluster, admin, {"queue", "list"});
  ASSERT_EQ(list.code, 0) << list.err;
  EXPECT_THAT(list.out, ContainsRegex("team-a +- +0/- +0/2 +- +0 +0 +0 +yes"));
  CliResult shown = RunTrainctl(cluster, admin, {"queue", "describe", "team-a"});
  ASSERT_EQ(shown.code, 0) << shown.err;
  EXPECT_THAT(shown.out, ContainsRegex("Default queue: +yes"));

  // A worker with CPU slots; the job naming no queue goes to team-a and runs.
  const std::string worker_token = cluster.CreateToken(v1::ROLE_WORKER, "w");
  ASSERT_FALSE(worker_token.empty());
  testing::FakeWorker worker(
      grpc::CreateChannel(cluster.address(), grpc::InsecureChannelCredentials()), "w", 2,
      absl::Milliseconds(100), worker_token);
  ASSERT_TRUE(worker.Connect());
  absl::StatusOr<v1::Job> job = as_admin->Submit(Spec("lands"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().queue(), "team-a");
  const std::string id = job->id();
  std::optional<v1::CoordinatorMessage> first = worker.WaitFor(
      [&id](const v1::CoordinatorMessage& m) {
        return (m.has_preflight() && m.preflight().job_id() == id) ||
               (m.has_start_ranks() && m.start_ranks().job_id() == id);
      },
      absl::Seconds(30));
  ASSERT_TRUE(first.has_value()) << "the job was never placed on the worker";
  if (first->has_preflight()) {
    v1::WorkerMessage pre;
    pre.mutable_preflight()->set_job_id(id);
    pre.mutable_preflight()->set_attempt(first->preflight().attempt());
    ASSERT_TRUE(worker.Send(pre));
    ASSERT_TRUE(worker
                    .WaitFor(
                        [&id](const v1::CoordinatorMessage& m) {
                          return m.has_start_ranks() && m.start_ranks().job_id() == id;
                        },
                        absl::Seconds(30))
                    .has_value());
  }
  v1::WorkerMessage rdv;
  rdv.mutable_rendezvous()->set_job_id(id);
  rdv.mutable_rendezvous()->set_attempt(1);
  rdv.mutable_rendezvous()->mutable_info()->set_gloo_store_address("127.0.0.1:1234");
  ASSERT_TRUE(worker.Send(rdv));
  ASSERT_TRUE(worker.SendStatus(id, 1, 0, v1::RANK_STATE_RUNNING));
  EXPECT_EQ(cluster.WaitState(id, v1::JOB_STATE_RUNNING).state(), v1::JOB_STATE_RUNNING);
  absl::StatusOr<v1::QueueStatus> used = as_admin->GetQueue("team-a");
  ASSERT_TRUE(used.ok()) << used.status();
  EXPECT_EQ(used->running_jobs(), 1);
  EXPECT_EQ(used->used_cpu(), 1);
  ASSERT_TRUE(worker.SendStatus(id, 1, 0, v1::RANK_STATE_SUCCEEDED));
  EXPECT_EQ(cluster.WaitState(id, v1::JOB_STATE_SUCCEEDED).state(), v1::JOB_STATE_SUCCEEDED);

  // A second default un-marks the first; jobs naming none follow it.
  made = RunTrainctl(cluster, admin, {"queue", "create", "team-b", "--gpu", "0", "--default"});
  ASSERT_EQ(made.code, 0) << made.err;
  EXPECT_THAT(
      made.out,
      HasSubstr("GPUs 0 (none of its own: only what its cohort lends), CPUs unlimited (no --cpu)"));
  list = RunTrainctl(cluster, admin, {"queue", "list"});
  ASSERT_EQ(list.code, 0) << list.err;
  std::istringstream lines(list.out);
  std::map<std::string, std::string> rows;
  for (std::string line; std::getline(lines, line);) rows[line.substr(0, line.find(' '))] = line;
  EXPECT_THAT(rows["team-a"], MatchesRegex("team-a .* +- *"));
  EXPECT_THAT(rows["team-b"], MatchesRegex("team-b .* +yes *"));
  job = as_admin->Submit(Spec("follows"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().queue(), "team-b");
}

// Issue #48 item 2: a queue's GPU quota per flavor through the CLI: set
// with --nominal-gpus-flavor and its limits with
// --borrowing-limit-gpus-flavor / --lending-limit-gpus-flavor, shown by
// create and describe, a bad value refused naming the flag or the field,
// and a job asking for more of the flavor than the queue may ever hold
// refused at submit naming the quota; a CPU job asking for a flavor
// refused naming the field.
TEST(QueuesE2ETest, GpuFlavorQuotasAreSetShownAndBoundWhatAQueueCanEverRun) {
  Cluster cluster(testing::BuildDirOfThisTest(), "");
  ASSERT_TRUE(cluster.StartCoordinator());
  const std::string admin = cluster.admin_token();
  CliResult made = RunTrainctl(cluster, admin,
                               {"queue", "create", "gpus", "--nominal-gpus-flavor", "h100=4",
                                "--nominal-gpus-flavor", "a100=2", "--borrowing-limit-gpus-flavor",
                                "h100=2", "--lending-limit-gpus-flavor", "h100=1"});
  ASSERT_EQ(made.code, 0) << made.err;
  EXPECT_THAT(made.out,
              HasSubstr("by flavor a100 2, h100 4 gpus; h100 borrows at most 2, lends at most 1"));
  CliResult shown = RunTrainctl(cluster, admin, {"queue", "describe", "gpus"});
  ASSERT_EQ(shown.code, 0) << shown.err;
  EXPECT_THAT(shown.out, ContainsRegex("GPU flavor a100: +0 used of 2\n"));
  EXPECT_THAT(
      shown.out,
      ContainsRegex("GPU flavor h100: +0 used of 4 \\(borrows at most 2, lends at most 1\\)\n"));
  CliResult bad_limit = RunTrainctl(
      cluster, admin, {"queue", "create", "c", "--lending-limit-gpus-flavor", "a100=1"});
  EXPECT_EQ(bad_limit.code, 2) << bad_limit.err;
  EXPECT_THAT(bad_limit.err,
              HasSubstr("queue.lending_limit_gpu_flavors[a100]: needs a nominal_gpu_flavors[a100] "
                        "quota"));
  bad_limit = RunTrainctl(cluster, admin,
                          {"queue", "create", "c", "--borrowing-limit-gpus-flavor", "a100=-1"});
  EXPECT_NE(bad_limit.code, 0);
  EXPECT_THAT(bad_limit.err, HasSubstr("--borrowing-limit-gpus-flavor: must be FLAVOR=N with N >= "
                                       "0 (e.g. h100=4), got 'a100=-1'"));
  CliResult bad =
      RunTrainctl(cluster, admin, {"queue", "create", "c", "--nominal-gpus-flavor", "h100"});
  EXPECT_NE(bad.code, 0);
  EXPECT_THAT(
      bad.err,
      HasSubstr("--nominal-gpus-flavor: must be FLAVOR=N with N >= 0 (e.g. h100=4), got 'h100'"));
  bad = RunTrainctl(cluster, admin, {"queue", "create", "c", "--nominal-gpus-flavor", "H100=4"});
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_THAT(
      bad.err,
      HasSubstr("queue.nominal_gpu_flavors: flavor 'H100' must start with a lowercase letter"));

  std::unique_ptr<Client> as_admin = ClientAs(cluster, admin);
  ASSERT_NE(as_admin, nullptr);
  v1::JobSpec spec = Spec("too-many-h100s");
  spec.set_queue("gpus");
  spec.set_world_size(5);
  spec.set_device(v1::DEVICE_CUDA);
  spec.mutable_resources()->set_gpu_flavor("h100");
  absl::StatusOr<v1::Job> job = as_admin->Submit(spec);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(),
              HasSubstr("resources.gpu_flavor: 5 h100 GPUs exceed the most queue 'gpus' can ever "
                        "hold of h100 (4: its nominal_gpu_flavors quota plus what its cohort could "
                        "lend"));
  spec.set_device(v1::DEVICE_CPU);
  spec.set_world_size(1);
  job = as_admin->Submit(spec);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(),
              HasSubstr("resources.gpu_flavor: asks for GPUs of flavor h100, but device is cpu"));
}

// Issue #48 (queue status): what a queue's running job holds in every
// quota dimension -- CPUs, memory and h100 slots beyond its nominal
// borrowed from its cohort, GPU slots by flavor -- through the API
// (QueueStatus), `queue describe` (text and JSON), `queue list` and
// /metrics.
TEST(QueuesE2ETest, AQueuesUseOfCpusMemoryAndFlavorsIsShownWithWhatItBorrows) {
  Cluster cluster(testing::BuildDirOfThisTest(), "");
  ASSERT_TRUE(cluster.StartCoordinator({"--http_listen=127.0.0.1:0"}));
  const std::string admin = cluster.admin_token();
  CliResult made = RunTrainctl(cluster, admin,
                               {"queue", "create", "lender", "--cohort", "lab", "--nominal-cpus",
                                "8", "--nominal-memory", "8Gi"});
  ASSERT_EQ(made.code, 0) << made.err;
  made = RunTrainctl(
      cluster, admin,
      {"queue", "create", "team", "--cohort", "lab", "--nominal-cpus", "2", "--nominal-memory",
       "2Gi", "--nominal-gpus-flavor", "h100=1", "--borrowing-limit-gpus-flavor", "h100=1"});
  ASSERT_EQ(made.code, 0) << made.err;
  // Lends team the second h100 (issue #48 item 2: flavor quotas borrow).
  made = RunTrainctl(cluster, admin,
                     {"queue", "create", "h100-lender", "--cohort", "lab", "--nominal-gpus-flavor",
                      "h100=3", "--lending-limit-gpus-flavor", "h100=1"});
  ASSERT_EQ(made.code, 0) << made.err;

  // Two h100 GPUs on a worker that enforces limits; team's job takes both,
  // 1.5 CPUs and 3 GiB each: 3 CPUs and 6 GiB, beyond team's 2 and 2 GiB.
  const std::string worker_token = cluster.CreateToken(v1::ROLE_WORKER, "w");
  ASSERT_FALSE(worker_token.empty());
  testing::FakeWorker worker(
      grpc::CreateChannel(cluster.address(), grpc::InsecureChannelCredentials()), "w", 2,
      absl::Milliseconds(100), worker_token);
  worker.set_gpus("NVIDIA H100 80GB HBM3", "h100");
  v1::Allocatable allocatable;
  allocatable.set_cpus(16);
  allocatable.set_memory_bytes(int64_t{64} << 30);
  allocatable.set_enforces_limits(true);
  worker.set_allocatable(allocatable);
  ASSERT_TRUE(worker.Connect());
  std::unique_ptr<Client> as_admin = ClientAs(cluster, admin);
  ASSERT_NE(as_admin, nullptr);
  v1::JobSpec spec = Spec("wide");
  spec.set_queue("team");
  spec.set_world_size(2);
  spec.set_device(v1::DEVICE_CUDA);
  spec.mutable_resources()->set_gpu_flavor("h100");
  spec.mutable_resources()->set_cpus(1.5);
  spec.mutable_resources()->set_memory(int64_t{3} << 30);
  absl::StatusOr<v1::Job> job = as_admin->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->id();
  std::optional<v1::CoordinatorMessage> placed = worker.WaitFor(
      [&id](const v1::CoordinatorMessage& m) {
        return (m.has_preflight() && m.preflight().job_id() == id) ||
               (m.has_start_ranks() && m.start_ranks().job_id() == id);
      },
      absl::Seconds(30));
  ASSERT_TRUE(placed.has_value()) << "the job was never placed: " << cluster.Get(id).state_reason();

  absl::StatusOr<v1::QueueStatus> use = as_admin->GetQueue("team");
  ASSERT_TRUE(use.ok()) << use.status();
  EXPECT_EQ(use->used_gpu(), 2);
  EXPECT_EQ(use->borrowed_gpu(), 0) << "no GPU slot quota: unlimited";
  EXPECT_DOUBLE_EQ(use->used_cpus(), 3);
  EXPECT_DOUBLE_EQ(use->borrowed_cpus(), 1);
  EXPECT_EQ(use->used_memory_bytes(), int64_t{6} << 30);
  EXPECT_EQ(use->borrowed_memory_bytes(), int64_t{4} << 30);
  ASSERT_EQ(use->used_gpu_flavors().count("h100"), 1u);
  EXPECT_EQ(use->used_gpu_flavors().at("h100"), 2);
  ASSERT_EQ(use->borrowed_gpu_flavors().count("h100"), 1u);
  EXPECT_EQ(use->borrowed_gpu_flavors().at("h100"), 1) << "2 on a nominal of 1";

  CliResult shown = RunTrainctl(cluster, admin, {"queue", "describe", "team"});
  ASSERT_EQ(shown.code, 0) << shown.err;
  EXPECT_THAT(shown.out, ContainsRegex("GPU slots: +2 used of unlimited\n"));
  EXPECT_THAT(shown.out, ContainsRegex("CPUs: +3 used of 2 \\(1 borrowed\\)\n"));
  EXPECT_THAT(shown.out, ContainsRegex("Memory: +6 GiB used of 2 GiB \\(4 GiB borrowed\\)\n"));
  EXPECT_THAT(shown.out,
              ContainsRegex("GPU flavor h100: +2 used of 1 \\(1 borrowed; borrows at most 1\\)\n"));
  CliResult json = RunTrainctl(cluster, admin, {"queue", "describe", "team", "-o", "json"});
  ASSERT_EQ(json.code, 0) << json.err;
  EXPECT_THAT(json.out, ContainsRegex("\"used_?[cC]pus\": ?3[,\n }]"));
  EXPECT_THAT(json.out, ContainsRegex("\"borrowed_?[cC]pus\": ?1[,\n }]"));
  EXPECT_THAT(json.out, ContainsRegex("\"used_?[mM]emory_?[bB]ytes\": ?\"?6442450944"));
  EXPECT_THAT(json.out, ContainsRegex("\"borrowed_?[mM]emory_?[bB]ytes\": ?\"?4294967296"));
  EXPECT_THAT(json.out, ContainsRegex("\"used_?[gG]pu_?[fF]lavors\": ?\\{[^}]*\"h100\": ?2"));
  CliResult listed = RunTrainctl(cluster, admin, {"queue", "list"});
  ASSERT_EQ(listed.code, 0) << listed.err;
  EXPECT_THAT(listed.out, HasSubstr("cpus 3/2, memory 6 GiB/2 GiB"));
  EXPECT_THAT(listed.out, HasSubstr("cpus 0/8, memory 0/8 GiB"));

  const std::string page = testing::CoordinatorMetricsPage(cluster, admin);
  using testing::PromSample;
  EXPECT_EQ(PromSample(page, "trainctl_queue_used_cpus{queue=\"team\"}"), 3) << page;
  EXPECT_EQ(PromSample(page, "trainctl_queue_borrowed_cpus{queue=\"team\"}"), 1) << page;
  EXPECT_EQ(PromSample(page, "trainctl_queue_used_memory_bytes{queue=\"team\"}"),
            static_cast<double>(int64_t{6} << 30))
      << page;
  EXPECT_EQ(PromSample(page, "trainctl_queue_borrowed_memory_bytes{queue=\"team\"}"),
            static_cast<double>(int64_t{4} << 30))
      << page;
  EXPECT_EQ(PromSample(page, "trainctl_queue_used_cpus{queue=\"lender\"}"), 0) << page;
  EXPECT_EQ(PromSample(page, "trainctl_queue_borrowed_memory_bytes{queue=\"lender\"}"), 0) << page;
  EXPECT_EQ(
      PromSample(page, "trainctl_queue_used_gpu_flavor_slots{queue=\"team\",flavor=\"h100\"}"), 2)
      << page;
  EXPECT_TRUE(std::isnan(
      PromSample(page, "trainctl_queue_used_gpu_flavor_slots{queue=\"lender\",flavor=\"h100\"}")))
      << "a queue that neither holds nor has a quota of a flavor has no series";
  EXPECT_EQ(
      PromSample(page, "trainctl_queue_borrowed_gpu_flavor_slots{queue=\"team\",flavor=\"h100\"}"),
      1)
      << page;
  EXPECT_EQ(PromSample(page,
                       "trainctl_queue_borrowed_gpu_flavor_slots{queue=\"h100-lender\","
                       "flavor=\"h100\"}"),
            0)
      << page;
}

}  // namespace
}  // namespace trainctl
