// The coordinator's web dashboard over plain HTTP (cpp-httplib client): a
// real coordinator in-process with fake workers moving a job along. Who may
// see what (tokens, the /login cookie, redirects), each JSON endpoint's
// answer, the metrics resume_token a poller follows, and errors that name
// the field. The browser half is tests/dashboard_e2e_test.cc.
#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "client/test_cluster.h"
#include "trainctl/client.h"

namespace trainctl {
namespace {

using google::protobuf::Struct;
using ::testing::HasSubstr;
using ::testing::StartsWith;

template <typename M>
M Parse(const std::string& json) {
  M msg;
  auto status = google::protobuf::util::JsonStringToMessage(json, &msg);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return msg;
}

class DashboardApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string& addr = cluster_.server().http_address();
    ASSERT_FALSE(addr.empty());
    http_ = std::make_unique<httplib::Client>(addr);
    viewer_ = *cluster_.server().IssueToken(v1::ROLE_VIEWER, "viewer");
  }
  httplib::Result Get(const std::string& path, const std::string& token) {
    return http_->Get(path.c_str(), {{"Authorization", "Bearer " + token}});
  }
  std::string Submit(const std::string& name, int world) {
    std::unique_ptr<Client> client = Client::FromChannel(cluster_.channel());
    absl::StatusOr<v1::Job> job = client->SubmitFile(
        testing::WriteFile(testing::MakeTempDir(), "job.yaml", testing::ValidJobYaml(world)),
        {"name=" + name});
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }

  testing::TestCluster cluster_;
  std::unique_ptr<httplib::Client> http_;
  std::string viewer_;
};

TEST_F(DashboardApiTest, PagesNeedATokenAndTheLoginFormSetsAnHttpOnlyCookie) {
  auto page = http_->Get("/jobs/x");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 303);
  EXPECT_EQ(page->get_header_value("Location"), "/login?next=/jobs/x");
  auto login_page = http_->Get("/login");
  ASSERT_TRUE(login_page);
  EXPECT_EQ(login_page->status, 200);
  EXPECT_THAT(login_page->body, HasSubstr("<form id=\"login\" method=\"post\" action=\"/login\">"));
  // Static files need no token and come from the binary.
  auto chart = http_->Get("/static/chart.min.js");
  ASSERT_TRUE(chart);
  EXPECT_EQ(chart->status, 200);
  EXPECT_THAT(chart->body, StartsWith("/*!\n * Chart.js v3.9.1"));
  EXPECT_EQ(http_->Get("/static/nope.js")->status, 404);

  auto refused = http_->Post("/login", "token=wrong&next=/", "application/x-www-form-urlencoded");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_THAT(refused->body, HasSubstr("Token refused: "));
  EXPECT_FALSE(refused->has_header("Set-Cookie"));
  // A worker token is a token, but not one for reading jobs.
  auto worker =
      http_->Post("/login", "token=" + *cluster_.server().IssueToken(v1::ROLE_WORKER, "w"),
                  "application/x-www-form-urlencoded");
  ASSERT_TRUE(worker);
  EXPECT_EQ(worker->status, 401);
  EXPECT_THAT(worker->body, HasSubstr("dashboard needs role admin or submitter or viewer; token"));

  auto ok = http_->Post("/login", "token=" + viewer_ + "&next=/jobs/x",
                        "application/x-www-form-urlencoded");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 303);
  EXPECT_EQ(ok->get_header_value("Location"), "/jobs/x");
  EXPECT_EQ(ok->get_header_value("Set-Cookie"),
            absl::StrCat("trainctl_token=", viewer_, "; Path=/; HttpOnly; SameSite=Strict"));
  // Only a path on this server: never an open redirect.
  auto elsewhere = http_->Post("/login", "token=" + viewer_ + "&next=//evil.example/",
                               "application/x-www-form-urlencoded");
  EXPECT_EQ(elsewhere->get_header_value("Location"), "/");
  // Browsers read '\' as '/': /\evil.example is //evil.example (issue 25).
  auto backslash = http_->Post("/login", "token=" + viewer_ + "&next=%2F%5Cevil.example",
                               "application/x-www-form-urlencoded");
  ASSERT_TRUE(backslash);
  EXPECT_EQ(backslash->get_header_value("Location"), "/");
  // Every answer carries the security headers, a 404 of the server's own too.
  for (auto* r : {&page, &ok, &backslash}) {
    EXPECT_THAT((*r)->get_header_value("Content-Security-Policy"),
                HasSubstr("frame-ancestors 'none'"));
    EXPECT_EQ((*r)->get_header_value("X-Frame-Options"), "DENY");
    EXPECT_EQ((*r)->get_header_value("X-Content-Type-Options"), "nosniff");
  }
  auto unknown = http_->Get("/no/such/page");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_EQ(unknown->get_header_value("X-Frame-Options"), "DENY");
  // /metrics needs a viewer token too.
  auto metrics = http_->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 401);
  auto metrics_ok = http_->Get("/metrics", {{"Authorization", "Bearer " + viewer_}});
  ASSERT_TRUE(metrics_ok);
  EXPECT_EQ(metrics_ok->status, 200);
  EXPECT_THAT(metrics_ok->body, HasSubstr("trainctl_coordinator_up"));

  auto with_cookie = http_->Get("/jobs/x", {{"Cookie", "a=b; trainctl_token=" + viewer_}});
  ASSERT_TRUE(with_cookie);
  EXPECT_EQ(with_cookie->status, 200);
  EXPECT_THAT(with_cookie->body, HasSubstr("<script src=\"/static/chart.min.js\"></script>"));
  auto api_with_cookie = http_->Get("/api/jobs", {{"Cookie", "trainctl_token=" + viewer_}});
  EXPECT_EQ(api_with_cookie->status, 200);
  auto logout = http_->Post("/logout", "", "application/x-www-form-urlencoded");
  EXPECT_EQ(logout->status, 303);
  EXPECT_THAT(logout->get_header_value("Set-Cookie"), HasSubstr("Max-Age=0"));

  auto anonymous = http_->Get("/api/workers");
  EXPECT_EQ(anonymous->status, 401);
  EXPECT_THAT(anonymous->body, StartsWith("{\"error\":\"no token"));
}

TEST_F(DashboardApiTest, EndpointsAnswerJobsEventsMetricsLogsAndWorkers) {
  cluster_.AddWorker("w0", 2, {{"zone", "lab"}});
  const std::string id = Submit("api", 2);
  ASSERT_TRUE(cluster_.RunAttemptToSuccess(id, 1, 2));

  auto jobs = Get("/api/jobs", viewer_);
  ASSERT_EQ(jobs->status, 200) << jobs->body;
  EXPECT_EQ(jobs->get_header_value("Content-Type"), "application/json");
  auto list = Parse<v1::ListJobsResponse>(jobs->body);
  ASSERT_EQ(list.jobs_size(), 1);
  EXPECT_EQ(list.jobs(0).state(), v1::JOB_STATE_SUCCEEDED);

  auto job = Get("/api/jobs/" + id, viewer_);
  ASSERT_EQ(job->status, 200) << job->body;
  auto doc = Parse<Struct>(job->body);
  EXPECT_EQ(doc.fields().at("job").struct_value().fields().at("state").string_value(),
            "JOB_STATE_SUCCEEDED");
  const auto& events = doc.fields().at("events").list_value();
  ASSERT_GE(events.values_size(), 4);
  const int last_seq = static_cast<int>(std::stod(
      events.values(events.values_size() - 1).struct_value().fields().at("seq").string_value()));
  auto later = Parse<Struct>(
      Get(absl::StrCat("/api/jobs/", id, "?events_after=", last_seq - 1), viewer_)->body);
  EXPECT_EQ(later.fields().at("events").list_value().values_size(), 1)
      << "only the events after events_after";

  // Metrics: every point, then nothing new from the resume_token.
  auto metrics = Get("/api/jobs/" + id + "/metrics", viewer_);
  ASSERT_EQ(metrics->status, 200) << metrics->body;
  auto page = Parse<v1::GetMetricsResponse>(metrics->body);
  ASSERT_GE(page.batches_size(), 1);
  EXPECT_GT(page.batches(0).points_size(), 0);
  EXPECT_TRUE(page.next_page_token().empty());
  ASSERT_FALSE(page.resume_token().empty());
  auto rest = Parse<v1::GetMetricsResponse>(
      Get("/api/jobs/" + id + "/metrics?page_token=" + page.resume_token(), viewer_)->body);
  EXPECT_EQ(rest.batches_size(), 0);
  EXPECT_EQ(rest.resume_token(), page.resume_token()) << "an empty page keeps the poller's place";

  // Logs: every rank, one rank, and refusals naming the field.
  auto logs = Parse<Struct>(Get("/api/jobs/" + id + "/logs", viewer_)->body);
  EXPECT_EQ(logs.fields().at("attempt").number_value(), 1);
  EXPECT_EQ(logs.fields().at("world_size").number_value(), 2);
  EXPECT_EQ(logs.fields().at("lines").list_value().values_size(), 2);
  auto rank1 =
      Parse<Struct>(Get("/api/jobs/" + id + "/logs?rank=1&attempt=1&tail=10", viewer_)->body);
  ASSERT_EQ(rank1.fields().at("lines").list_value().values_size(), 1);
  EXPECT_EQ(rank1.fields()
                .at("lines")
                .list_value()
                .values(0)
                .struct_value()
                .fields()
                .at("text")
                .string_value(),
            "rank 1 trained 2 epochs");
  auto bad_rank = Get("/api/jobs/" + id + "/logs?rank=2", viewer_);
  EXPECT_EQ(bad_rank->status, 400);
  EXPECT_THAT(bad_rank->body,
              HasSubstr("rank: 2 is outside job '" + id + "''s world: world_size 2 (ranks 0..1)"));
  auto bad_attempt = Get("/api/jobs/" + id + "/logs?attempt=3", viewer_);
  EXPECT_EQ(bad_attempt->status, 400);
  EXPECT_THAT(bad_attempt->body, HasSubstr("attempt: 3 is out of range"));
  auto not_a_number = Get("/api/jobs/" + id + "/logs?tail=-1", viewer_);
  EXPECT_EQ(not_a_number->status, 400);
  EXPECT_THAT(not_a_number->body, HasSubstr("tail: '-1' is not a non-negative integer"));
  auto bad_token = Get("/api/jobs/" + id + "/metrics?page_token=x", viewer_);
  EXPECT_EQ(bad_token->status, 400);
  EXPECT_THAT(bad_token->body,
              HasSubstr("page_token: 'x' is not a token this coordinator returned"));
  auto missing = Get("/api/jobs/nope", viewer_);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(missing->body, "{\"error\":\"no job nope\"}");

  auto workers = Parse<v1::ListWorkersResponse>(Get("/api/workers", viewer_)->body);
  ASSERT_EQ(workers.workers_size(), 1);
  EXPECT_EQ(workers.workers(0).labels().at("zone"), "lab");
  EXPECT_EQ(workers.workers(0).slots_size(), 2);
}

TEST_F(DashboardApiTest, QueuesPageAndEndpointShowQuotaUseAndJobs) {
  auto empty = Get("/api/queues", viewer_);
  ASSERT_EQ(empty->status, 200) << empty->body;
  EXPECT_EQ(Parse<v1::ListQueuesResponse>(empty->body).queues_size(), 0);

  std::unique_ptr<Client> admin = Client::FromChannel(cluster_.channel());
  v1::Queue a;
  a.set_name("team-a");
  a.set_nominal_cpu(2);
  a.set_cohort("lab");
  ASSERT_TRUE(admin->CreateQueue(a).ok());
  v1::Queue b;
  b.set_name("team-b");
  ASSERT_TRUE(admin->CreateQueue(b).ok());
  // No worker: the job waits in its queue.
  absl::StatusOr<v1::Job> job = admin->SubmitFile(
      testing::WriteFile(testing::MakeTempDir(), "job.yaml", testing::ValidJobYaml(2)),
      {"name=queued", "queue=team-a"});
  ASSERT_TRUE(job.ok()) << job.status();

  auto page = Get("/queues", viewer_);
  ASSERT_EQ(page->status, 200);
  EXPECT_THAT(page->body, HasSubstr("<nav>"));
  auto anonymous = http_->Get("/api/queues");
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->status, 401);

  auto answer = Get("/api/queues", viewer_);
  ASSERT_EQ(answer->status, 200) << answer->body;
  EXPECT_EQ(answer->get_header_value("Content-Type"), "application/json");
  auto queues = Parse<v1::ListQueuesResponse>(answer->body);
  ASSERT_EQ(queues.queues_size(), 2) << answer->body;
  EXPECT_EQ(queues.queues(0).queue().name(), "team-a");
  EXPECT_EQ(queues.queues(0).queue().nominal_cpu(), 2);
  EXPECT_FALSE(queues.queues(0).queue().has_nominal_gpu()) << "unlimited";
  EXPECT_EQ(queues.queues(0).queue().cohort(), "lab");
  EXPECT_EQ(queues.queues(0).pending_jobs(), 1);
  EXPECT_EQ(queues.queues(0).running_jobs(), 0);
  EXPECT_EQ(queues.queues(0).used_cpu(), 0);
  EXPECT_EQ(queues.queues(1).queue().name(), "team-b");
  EXPECT_EQ(queues.queues(1).pending_jobs(), 0);
}

}  // namespace
}  // namespace trainctl
