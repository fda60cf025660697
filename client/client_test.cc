// The client library against a real coordinator (in-process, loopback port,
// temporary database) with fake workers moving jobs along.
#include "trainctl/client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/test_cluster.h"
#include "common/jobspec/job_spec.h"

namespace trainctl {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using trainctl::testing::TestCluster;

std::unique_ptr<Client> ConnectTo(const TestCluster& cluster) {
  ClientOptions options;
  options.address = cluster.address();
  options.token = cluster.admin_token();
  options.timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

v1::JobSpec Spec(int world_size) {
  ParsedJobSpec p = ParseJobSpecYaml(testing::ValidJobYaml(world_size), "job.yaml");
  EXPECT_TRUE(p.ok());
  return p.spec;
}

// Nothing listens: Connect tries again (a coordinator may be restarting)
// until the timeout, then names the address (#47 item 6).
TEST(ClientTest, ConnectTriesUntilTheTimeoutAndNamesTheAddressWhenNothingListens) {
  ClientOptions options;
  options.address = absl::StrCat("127.0.0.1:", testing::UnusedPort());
  options.timeout = absl::Seconds(2);
  absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  const absl::Duration refused_for = absl::Now() - start;
  EXPECT_GE(refused_for, absl::Seconds(1)) << "refused connections are tried again";
  EXPECT_LT(refused_for, absl::Seconds(10)) << "until the timeout";
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(client.status().message(), HasSubstr(options.address));

  // A peer that accepts TCP but never speaks HTTP/2 is bounded by the timeout.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  options.address = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  options.timeout = absl::Milliseconds(500);
  start = absl::Now();
  client = Client::Connect(options);
  absl::Duration took = absl::Now() - start;
  close(fd);
  EXPECT_LT(took, absl::Seconds(3));
  ASSERT_FALSE(client.ok()) << "a silent peer is not a coordinator";
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(client.status().message(), HasSubstr(options.address));
}

TEST(ClientTest, SubmitGetListCancelAndErrorCodes) {
  TestCluster cluster;
  std::unique_ptr<Client> client = ConnectTo(cluster);
  ASSERT_NE(client, nullptr);

  absl::StatusOr<v1::Job> job = client->Submit(Spec(2));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_THAT(job->id(), StartsWith("classic-"));
  EXPECT_EQ(job->state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job->spec().data().batch_size(), 30);

  absl::StatusOr<v1::Job> got = client->Get(job->id());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->id(), job->id());
  EXPECT_EQ(client->Get("no-such-job").status().code(), absl::StatusCode::kNotFound);

  // The coordinator's validation: InvalidArgument naming the field.
  v1::JobSpec bad = Spec(2);
  bad.set_world_size(-1);
  absl::StatusOr<v1::Job> refused = client->Submit(bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("world_size: must be > 0, got -1"));

  absl::StatusOr<v1::Job> cancelled = client->Cancel(job->id(), "changed my mind");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  absl::Status again = client->Cancel(job->id()).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.message(), HasSubstr("already ended"));

  absl::StatusOr<std::vector<v1::Job>> pending = client->List({v1::JOB_STATE_PENDING});
  ASSERT_TRUE(pending.ok());
  EXPECT_TRUE(pending->empty());
  absl::StatusOr<std::vector<v1::Job>> all = client->List();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ(all->front().state(), v1::JOB_STATE_CANCELLED);
}

TEST(ClientTest, ListFollowsPagesAndHonoursTheLimit) {
  TestCluster cluster;
  std::unique_ptr<Client> client = ConnectTo(cluster);
  ASSERT_NE(client, nullptr);
  // More than one page (100) of jobs.
  std::set<std::string> ids;
  for (int i = 0; i < 130; ++i) {
    absl::StatusOr<v1::Job> job = client->Submit(Spec(1));
    ASSERT_TRUE(job.ok()) << job.status();
    ids.insert(job->id());
  }
  absl::StatusOr<std::vector<v1::Job>> all = client->List();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 130u);
  std::set<std::string> listed;
  for (const v1::Job& j : *all) listed.insert(j.id());
  EXPECT_EQ(listed, ids) << "every job once, across pages";
  absl::StatusOr<std::vector<v1::Job>> some = client->List({}, 7);
  ASSERT_TRUE(some.ok());
  EXPECT_EQ(some->size(), 7u);
  EXPECT_EQ(client->List({}, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClientTest, SubmitFileValidatesLocallyAndSendsNothingWhenInvalid) {
  TestCluster cluster;
  std::unique_ptr<Client> client = ConnectTo(cluster);
  ASSERT_NE(client, nullptr);
  std::string dir = testing::MakeTempDir();
  std::string path = testing::WriteFile(
      dir, "bad.yaml",
      "name: Bad_Name\nworld_size: 0\nmodel: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 10, size: 5}}\n");
  absl::StatusOr<v1::Job> job = client->SubmitFile(path);
  ASSERT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<std::string> lines = absl::StrSplit(job.status().message(), '\n');
  ASSERT_GE(lines.size(), 2u) << job.status();
  for (const std::string& l : lines) EXPECT_THAT(l, StartsWith(path + ":")) << l;
  EXPECT_TRUE(client->List()->empty()) << "nothing was submitted";

  // Overrides reach the submitted spec.
  std::string good = testing::WriteFile(dir, "good.yaml", testing::ValidJobYaml(2));
  job = client->SubmitFile(good, {"world_size=3", "training.optimizer.lr=0.01"});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().world_size(), 3);
  EXPECT_DOUBLE_EQ(job->spec().training().optimizer().lr(), 0.01);
}

TEST(ClientTest, DryRunPlansOnFreeSlotsOrSaysWhyItWouldWait) {
  TestCluster cluster;
  std::unique_ptr<Client> client = ConnectTo(cluster);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<DryRunResult> waits = client->DryRun(Spec(2));
  ASSERT_TRUE(waits.ok()) << waits.status();
  EXPECT_TRUE(waits->planned.empty());
  EXPECT_FALSE(waits->pending_reason.empty());

  cluster.AddWorker("w0", 2);
  absl::StatusOr<DryRunResult> plan = client->DryRun(Spec(2));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->planned.size(), 2u);
  EXPECT_EQ(plan->planned[0].worker_id(), "w0");
  EXPECT_EQ(plan->planned[1].local_rank(), 1);
  EXPECT_TRUE(plan->job.id().empty()) << "a dry run stores nothing";
  EXPECT_TRUE(client->List()->empty());
}

TEST(ClientTest, WatchDeliversHistoryAndLiveUpdatesAndReturnsTheFinalJob) {
  TestCluster cluster;
  cluster.AddWorker("w0", 1);
  cluster.AddWorker("w1", 1);
  std::unique_ptr<Client> client = ConnectTo(cluster);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::Job> job = client->Submit(Spec(2));
  ASSERT_TRUE(job.ok());

  std::vector<std::string> events;
  int metric_points = 0;
  absl::StatusOr<v1::Job> final_job;
  std::thread watcher([&] {
    final_job = client->Watch(job->id(), /*include_history=*/true, [&](const v1::JobUpdate& u) {
      if (u.has_event()) events.push_back(u.event().type());
      metric_points += u.metrics().points_size();
      return true;
    });
  });
  ASSERT_TRUE(cluster.RunAttemptToSuccess(job->id(), 1, /*epochs=*/2));
  watcher.join();
  ASSERT_TRUE(final_job.ok()) << final_job.status();
  EXPECT_EQ(final_job->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(final_job->attempts_size(), 1) << "the final job comes with its attempts";
  EXPECT_THAT(events, AllOf(Contains("submitted"), Contains("running"), Contains("epoch_end"),
                            Contains("succeeded")));
  EXPECT_EQ(metric_points, 8);

  // A callback that stops at the first update ends the watch at once.
  int seen = 0;
  absl::StatusOr<v1::Job> stopped = client->Watch(job->id(), true, [&](const v1::JobUpdate&) {
    ++seen;
    return false;
  });
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(seen, 1);
  EXPECT_EQ(client->Watch("no-such-job", false, nullptr).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ClientTest, LogsReturnsStoredLinesPerRank) {
  TestCluster cluster;
  cluster.AddWorker("w0", 2);
  std::unique_ptr<Client> client = ConnectTo(cluster);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::Job> job = client->Submit(Spec(2));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(cluster.RunAttemptToSuccess(job->id(), 1, 1));
  std::vector<std::string> lines;
  LogsOptions options;
  absl::Status s = client->Logs(job->id(), options, [&](const v1::LogChunk& c) {
    for (const v1::LogLine& l : c.lines()) lines.push_back(absl::StrCat(c.rank(), ": ", l.text()));
    return true;
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_THAT(lines, Contains("0: rank 0 trained 1 epochs"));
  EXPECT_THAT(lines, Contains("1: rank 1 trained 1 epochs"));
  options.rank = 1;
  lines.clear();
  ASSERT_TRUE(client
                  ->Logs(job->id(), options,
                         [&](const v1::LogChunk& c) {
                           for (const v1::LogLine& l : c.lines()) lines.push_back(l.text());
                           return true;
                         })
                  .ok());
  EXPECT_THAT(lines, ::testing::ElementsAre("rank 1 trained 1 epochs"));
  options.attempt = 7;
  EXPECT_EQ(client->Logs(job->id(), options, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClientTest, WorkersListsSlotsAndGoneWorkersOnRequest) {
  TestCluster cluster;
  cluster.AddWorker("w0", 2);
  cluster.AddWorker("w1", 1);
  std::unique_ptr<Client> client = ConnectTo(cluster);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::vector<v1::Worker>> workers = client->Workers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 2u);
  cluster.RemoveWorker("w1");
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline && client->Workers()->size() != 1)
    absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(client->Workers()->size(), 1u);
  absl::StatusOr<std::vector<v1::Worker>> all = client->Workers(/*include_gone=*/true);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 2u);
}

TEST(ClientTest, FromChannelUsesAnInProcessChannel) {
  TestCluster cluster;
  std::unique_ptr<Client> client = Client::FromChannel(cluster.channel());
  absl::StatusOr<std::vector<v1::Job>> jobs = client->List();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_TRUE(jobs->empty());
}

}  // namespace
}  // namespace trainctl
