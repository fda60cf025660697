// Bulk cancel end to end (issue #48, docs/queues.md#cancelling-many-jobs): a
// real coordinator process with two queues and no workers (jobs stay
// pending). `trainctl cancel --queue a` lists the matching jobs and, with
// --dry-run, without a terminal and without --yes, or when the user answers
// no, cancels nothing; with --yes (or a "y" on the terminal) it cancels
// exactly queue a's jobs that had not ended, one `cancelled` event each. A
// submitter's filters match only its own jobs and naming another owner is
// refused. /metrics shows the scheduler's new series (pass duration,
// preemptions) and the per-queue pending gauge following the cancel.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/cli.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "tests/support/metrics_page.h"
#include "trainctl/client.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using trainctl::testing::Cluster;
using trainctl::testing::CoordinatorMetricsPage;
using trainctl::testing::PromSample;

v1::JobSpec Spec(const std::string& name, const std::string& queue) {
  ParsedJobSpec p = ParseJobSpecYaml(
      "model: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n",
      "bulk.yaml", {"name=" + name, "world_size=1", "queue=" + queue});
  EXPECT_TRUE(p.ok());
  return p.spec;
}

struct CliResult {
  int code;
  std::string out;
  std::string err;
};

// One trainctl command line in-process, as `token`. `answer`: what the user
// types when asked (stdin a terminal); nullopt: stdin is not a terminal.
CliResult RunTrainctl(const Cluster& cluster, const std::string& token,
                      std::vector<std::string> args,
                      std::optional<std::string> answer = std::nullopt) {
  cli::CliEnvironment env;
  const std::string address = cluster.address();
  env.getenv = [address, token](const std::string& name) -> std::optional<std::string> {
    if (name == "TRAINCTL_COORDINATOR") return address;
    if (name == "TRAINCTL_TOKEN") return token;
    if (name == "HOME" || name == "XDG_CONFIG_HOME")
      return std::string("/nonexistent-trainctl-home");
    return std::nullopt;
  };
  if (answer.has_value()) env.read_answer = [answer] { return answer; };
  std::vector<const char*> argv = {"trainctl"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  int code = cli::RunCli(static_cast<int>(argv.size()), argv.data(), out, err, env);
  return {code, out.str(), err.str()};
}

std::unique_ptr<Client> ClientAs(const Cluster& cluster, const std::string& token) {
  ClientOptions options;
  options.address = cluster.address();
  options.token = token;
  options.timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(options);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

int CancelledEvents(Cluster& cluster, const std::string& id, std::string* message) {
  int n = 0;
  for (const v1::Event& e : cluster.Events(id)) {
    if (e.type() != "cancelled") continue;
    ++n;
    *message = e.message();
  }
  return n;
}

TEST(BulkCancelE2ETest, CancelByQueueAsksFirstCancelsExactlyItsJobsAndMetricsShowTheScheduler) {
  Cluster cluster(testing::BuildDirOfThisTest(), "");
  ASSERT_TRUE(cluster.StartCoordinator({"--http_listen=127.0.0.1:0"}));
  const std::string admin = cluster.admin_token();
  for (const char* q : {"a", "b"}) {
    CliResult made = RunTrainctl(cluster, admin, {"queue", "create", q});
    ASSERT_EQ(made.code, 0) << made.err;
  }
  std::unique_ptr<Client> as_admin = ClientAs(cluster, admin);
  ASSERT_NE(as_admin, nullptr);
  const std::string secret = cluster.CreateToken(v1::ROLE_SUBMITTER, "sam");
  ASSERT_FALSE(secret.empty());
  std::unique_ptr<Client> as_sam = ClientAs(cluster, secret);
  ASSERT_NE(as_sam, nullptr);

  // Queue a: three of the admin's jobs, one of sam's, one already ended;
  // queue b: two of the admin's.
  std::set<std::string> in_a;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<v1::Job> j = as_admin->Submit(Spec(absl::StrCat("a", i), "a"));
    ASSERT_TRUE(j.ok()) << j.status();
    in_a.insert(j->id());
  }
  absl::StatusOr<v1::Job> sams = as_sam->Submit(Spec("sams", "a"));
  ASSERT_TRUE(sams.ok()) << sams.status();
  in_a.insert(sams->id());
  absl::StatusOr<v1::Job> ended = as_admin->Submit(Spec("ended", "a"));
  ASSERT_TRUE(ended.ok()) << ended.status();
  ASSERT_TRUE(as_admin->Cancel(ended->id(), "earlier").ok());
  std::vector<std::string> in_b;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<v1::Job> j = as_admin->Submit(Spec(absl::StrCat("b", i), "b"));
    ASSERT_TRUE(j.ok()) << j.status();
    in_b.push_back(j->id());
  }
  const std::string admin_name = cluster.Get(in_b[0]).owner();
  ASSERT_FALSE(admin_name.empty());

  std::string page = CoordinatorMetricsPage(cluster, admin);
  EXPECT_EQ(PromSample(page, "trainctl_queue_pending_jobs{queue=\"a\"}"), 4) << page;
  EXPECT_GE(PromSample(page, "trainctl_scheduler_pass_seconds_count"), 1)
      << "every submit asked for a timed pass";
  EXPECT_THAT(page, HasSubstr("# TYPE trainctl_scheduler_pass_seconds histogram"));
  EXPECT_THAT(page, HasSubstr("trainctl_scheduler_pass_seconds_bucket{le=\"+Inf\"}"));
  EXPECT_EQ(PromSample(page, "trainctl_preemptions_total"), 0);
  // Where the loop's time goes: every submit was a posted task, housekeeping a timer.
  EXPECT_THAT(page, HasSubstr("# TYPE trainctl_loop_task_wait_seconds histogram"));
  EXPECT_THAT(page, HasSubstr("# TYPE trainctl_loop_task_run_seconds histogram"));
  EXPECT_GE(PromSample(page, "trainctl_loop_task_wait_seconds_count{kind=\"posted\"}"), 6) << page;
  EXPECT_GE(PromSample(page, "trainctl_loop_task_run_seconds_count{kind=\"posted\"}"), 6) << page;
  EXPECT_THAT(page, HasSubstr("trainctl_loop_task_run_seconds_bucket{kind=\"timer\",le=\"+Inf\"}"));

  auto all_pending = [&] {
    for (const std::string& id : in_a)
      EXPECT_EQ(cluster.Get(id).state(), v1::JOB_STATE_PENDING) << id;
  };
  // A dry run lists the four and cancels nothing.
  CliResult dry = RunTrainctl(cluster, admin, {"cancel", "--queue", "a", "--dry-run"});
  EXPECT_EQ(dry.code, 0) << dry.err;
  EXPECT_THAT(dry.out, HasSubstr("4 jobs would be cancelled (dry run, nothing cancelled)"));
  for (const std::string& id : in_a) EXPECT_THAT(dry.out, HasSubstr(id));
  EXPECT_THAT(dry.out, Not(HasSubstr(ended->id())));
  all_pending();
  // No terminal and no --yes: the list, then a refusal that names --yes.
  CliResult unasked = RunTrainctl(cluster, admin, {"cancel", "--queue", "a"});
  EXPECT_EQ(unasked.code, 2);
  EXPECT_THAT(unasked.out, HasSubstr("4 jobs match:"));
  EXPECT_THAT(unasked.err, HasSubstr("pass --yes"));
  all_pending();
  // On a terminal, answered no.
  CliResult declined = RunTrainctl(cluster, admin, {"cancel", "--queue", "a"}, "n");
  EXPECT_EQ(declined.code, 1);
  EXPECT_THAT(declined.out, HasSubstr("Cancel 4 jobs? [y/N]"));
  EXPECT_THAT(declined.out, HasSubstr("nothing cancelled"));
  all_pending();
  // JOB and filters exclude each other; a state that has ended is refused.
  CliResult both = RunTrainctl(cluster, admin, {"cancel", in_b[0], "--queue", "a", "--yes"});
  EXPECT_EQ(both.code, 2);
  EXPECT_THAT(both.err, HasSubstr("exclude each other"));
  CliResult bad_state = RunTrainctl(cluster, admin, {"cancel", "--state", "Succeeded", "--yes"});
  EXPECT_EQ(bad_state.code, 2);
  EXPECT_THAT(bad_state.err, HasSubstr("--state: succeeded jobs have ended"));

  // Sam, a submitter: sees only its own job and may not name the admin.
  CliResult sam_dry = RunTrainctl(cluster, secret, {"cancel", "--queue", "a", "--dry-run"});
  EXPECT_EQ(sam_dry.code, 0) << sam_dry.err;
  EXPECT_THAT(sam_dry.out, HasSubstr("1 job would be cancelled"));
  EXPECT_THAT(sam_dry.out, HasSubstr(sams->id()));
  CliResult sam_other = RunTrainctl(cluster, secret, {"cancel", "--owner", admin_name, "--yes"});
  EXPECT_EQ(sam_other.code, 1);
  EXPECT_THAT(sam_other.err, HasSubstr("a submitter cancels only its own jobs"));
  absl::StatusOr<v1::CancelJobsResponse> sam_states =
      as_sam->CancelJobs({"", "", {v1::JOB_STATE_PENDING}}, "", /*dry_run=*/true);
  ASSERT_TRUE(sam_states.ok()) << sam_states.status();
  EXPECT_THAT(sam_states->job_ids(), ::testing::ElementsAre(sams->id()));
  absl::StatusOr<v1::CancelJobsResponse> unfiltered = as_admin->CancelJobs({}, "", false);
  EXPECT_EQ(unfiltered.status().code(), absl::StatusCode::kInvalidArgument);
  all_pending();

  // The admin, --yes with a case-insensitive state: exactly a's four.
  CliResult yes = RunTrainctl(
      cluster, admin,
      {"cancel", "--queue", "a", "--state", "PENDING,running", "--yes", "--reason", "a closes"});
  ASSERT_EQ(yes.code, 0) << yes.err;
  EXPECT_THAT(yes.out, HasSubstr("cancelled 4 jobs"));
  for (const std::string& id : in_a) {
    EXPECT_EQ(cluster.Get(id).state(), v1::JOB_STATE_CANCELLED) << id;
    std::string message;
    EXPECT_EQ(CancelledEvents(cluster, id, &message), 1) << id;
    EXPECT_THAT(message, HasSubstr("a closes"));
  }
  std::string message;
  EXPECT_EQ(CancelledEvents(cluster, ended->id(), &message), 1)
      << "an ended job is not cancelled again";
  EXPECT_THAT(message, HasSubstr("earlier"));
  for (const std::string& id : in_b)
    EXPECT_EQ(cluster.Get(id).state(), v1::JOB_STATE_PENDING) << id;

  // On a terminal, answered yes: b's two.
  CliResult confirmed = RunTrainctl(cluster, admin, {"cancel", "--queue", "b"}, "y");
  ASSERT_EQ(confirmed.code, 0) << confirmed.err;
  EXPECT_THAT(confirmed.out, HasSubstr("Cancel 2 jobs? [y/N]"));
  EXPECT_THAT(confirmed.out, HasSubstr("cancelled 2 jobs"));
  for (const std::string& id : in_b)
    EXPECT_EQ(cluster.Get(id).state(), v1::JOB_STATE_CANCELLED) << id;
  CliResult none = RunTrainctl(cluster, admin, {"cancel", "--queue", "b"});
  EXPECT_EQ(none.code, 0) << none.err;
  EXPECT_THAT(none.out, HasSubstr("no jobs match"));

  page = CoordinatorMetricsPage(cluster, admin);
  EXPECT_EQ(PromSample(page, "trainctl_queue_pending_jobs{queue=\"a\"}"), 0) << page;
  EXPECT_EQ(PromSample(page, "trainctl_queue_pending_jobs{queue=\"b\"}"), 0);
  EXPECT_EQ(PromSample(page, "trainctl_jobs{state=\"cancelled\"}"), 7);
}

}  // namespace
}  // namespace trainctl
