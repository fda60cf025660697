// Failover between coordinators, client side: the client library and the
// CLI with a --coordinator list, against a real coordinator (in-process,
// loopback) and the standby contract's stand-in (tests/support/
// standby_stand_in.h: swap in a real standby once it is on this branch).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/test_cluster.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/standby_stand_in.h"
#include "trainctl/client.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using trainctl::testing::CliRun;
using trainctl::testing::RunTrainctl;
using trainctl::testing::StandbyStandIn;
using trainctl::testing::TestCluster;

constexpr char kSubmit[] = "/trainctl.v1.JobService/SubmitJob";
constexpr char kCancel[] = "/trainctl.v1.JobService/CancelJob";

v1::JobSpec Spec() {
  ParsedJobSpec p = ParseJobSpecYaml(testing::ValidJobYaml(2), "job.yaml");
  EXPECT_TRUE(p.ok());
  return p.spec;
}

absl::StatusOr<std::unique_ptr<Client>> ConnectList(const TestCluster& cluster,
                                                    const std::string& list) {
  ClientOptions options;
  options.address = list;
  options.token = cluster.admin_token();
  options.timeout = absl::Seconds(20);  // generous: loaded CI machines
  return Client::Connect(options);
}

// Jobs the real coordinator holds (every submission that reached it).
size_t JobsOn(TestCluster& cluster) {
  absl::StatusOr<std::unique_ptr<Client>> c = ConnectList(cluster, cluster.address());
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return 0;
  absl::StatusOr<std::vector<v1::Job>> jobs = (*c)->List();
  EXPECT_TRUE(jobs.ok()) << jobs.status();
  return jobs.ok() ? jobs->size() : 0;
}

TEST(FailoverTest, StandbyFirstInTheListLeadsToTheActive) {
  TestCluster cluster;
  cluster.AddWorker("w0", 2);
  StandbyStandIn standby(cluster.address());
  ASSERT_FALSE(standby.address().empty());
  absl::StatusOr<std::unique_ptr<Client>> client =
      ConnectList(cluster, absl::StrCat(standby.address(), ",", cluster.address()));
  ASSERT_TRUE(client.ok()) << client.status();

  absl::StatusOr<v1::Job> job = (*client)->Submit(Spec());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(standby.calls(kSubmit), 1) << "the standby was asked first and pointed on";
  EXPECT_EQ(JobsOn(cluster), 1u) << "one call, one job";
  EXPECT_EQ((*client)->active_address(), cluster.address());

  // The active one is remembered: the next calls go there directly.
  absl::StatusOr<v1::Job> got = (*client)->Get(job->id());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(standby.calls(), 1);

  // Streams open on the active coordinator too: a new client of the same
  // list in this process starts at the remembered active one, so make one
  // of another list (the standby alone, which names the active).
  absl::StatusOr<std::unique_ptr<Client>> via_hint = ConnectList(cluster, standby.address());
  ASSERT_TRUE(via_hint.ok()) << via_hint.status();
  ASSERT_TRUE(cluster.RunAttemptToSuccess(job->id(), 1, 1));
  int updates = 0;
  absl::StatusOr<v1::Job> watched = (*via_hint)->Watch(job->id(), true, [&](const v1::JobUpdate&) {
    ++updates;
    return true;
  });
  ASSERT_TRUE(watched.ok()) << watched.status();
  EXPECT_EQ(watched->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_GT(updates, 0);
  EXPECT_EQ(standby.calls("/trainctl.v1.JobService/WatchJob"), 1)
      << "opened on the standby, then on the active";
  int chunks = 0;
  absl::Status logs = (*via_hint)->Logs(job->id(), LogsOptions{}, [&](const v1::LogChunk&) {
    ++chunks;
    return true;
  });
  EXPECT_TRUE(logs.ok()) << logs;
  EXPECT_GT(chunks, 0);
}

TEST(FailoverTest, TheHintIsFollowedWhenTheActiveIsNotInTheList) {
  TestCluster cluster;
  StandbyStandIn standby(cluster.address());
  ASSERT_FALSE(standby.address().empty());
  absl::StatusOr<std::unique_ptr<Client>> client = ConnectList(cluster, standby.address());
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<v1::Job> job = (*client)->Submit(Spec());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ((*client)->active_address(), cluster.address());
  EXPECT_EQ(JobsOn(cluster), 1u);
  // Cancel is not idempotent: after the standby's answer (it did not run
  // there) it goes to the active coordinator once.
  absl::StatusOr<std::unique_ptr<Client>> fresh_list =
      ConnectList(cluster, absl::StrCat(standby.address(), ",", cluster.address()));
  ASSERT_TRUE(fresh_list.ok());
  absl::StatusOr<v1::Job> cancelled = (*fresh_list)->Cancel(job->id(), "test");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(standby.calls(kCancel), 1);
}

TEST(FailoverTest, AnUnreachableAddressLeadsToTheNext) {
  TestCluster cluster;
  const std::string dead = absl::StrCat("127.0.0.1:", testing::UnusedPort());
  absl::StatusOr<std::unique_ptr<Client>> client =
      ConnectList(cluster, absl::StrCat(dead, ",", cluster.address()));
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<v1::Job> job = (*client)->Submit(Spec());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(JobsOn(cluster), 1u);
  EXPECT_EQ((*client)->active_address(), cluster.address());

  // An entry that is a DNS name with several addresses (localhost: ::1 and
  // 127.0.0.1) stays one entry: gRPC's resolver tries its addresses.
  const std::string port = cluster.address().substr(cluster.address().rfind(':') + 1);
  absl::StatusOr<std::unique_ptr<Client>> by_name =
      ConnectList(cluster, absl::StrCat(dead, ",localhost:", port));
  ASSERT_TRUE(by_name.ok()) << by_name.status();
  absl::StatusOr<std::vector<v1::Job>> listed = (*by_name)->List();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 1u);

  // Nothing listens anywhere: one error naming each address and why.
  const std::string dead2 = absl::StrCat("127.0.0.1:", testing::UnusedPort());
  ClientOptions options;
  options.address = absl::StrCat(dead, ",", dead2);
  options.timeout = absl::Seconds(3);
  absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Client>> none = Client::Connect(options);
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Seconds(2)) << "refused addresses are tried again until the timeout";
  EXPECT_LT(took, absl::Seconds(10)) << "and given up then";
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(none.status().message(), HasSubstr(absl::StrCat(dead, ": connection failed")));
  EXPECT_THAT(none.status().message(), HasSubstr(absl::StrCat(dead2, ": connection failed")));
}

// A coordinator that is restarting (its port refuses connections for a
// while) is waited for up to the timeout, as a standby taking over is: a
// command started in that window does not fail at once (#47: 57 of 1,000
// submits failed during a 2.2 s restart).
TEST(FailoverTest, ConnectWaitsForACoordinatorThatComesUpWithinTheTimeout) {
  const int port = testing::UnusedPort();
  ASSERT_NE(port, 0);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  std::unique_ptr<grpc::Server> server;
  absl::Notification listening;
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(1500));  // the restart's downtime (what is waited for)
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials());
    server = builder.BuildAndStart();
    listening.Notify();
  });
  ClientOptions options;
  options.address = address;
  options.timeout = absl::Seconds(30);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  const absl::Duration took = absl::Now() - start;
  later.join();
  ASSERT_TRUE(listening.HasBeenNotified());
  ASSERT_NE(server, nullptr) << "port " << port << " was taken meanwhile";
  EXPECT_TRUE(client.ok()) << client.status();
  EXPECT_GE(took, absl::Seconds(1)) << "it was refused at first";
  EXPECT_LT(took, absl::Seconds(25));
  server->Shutdown();
}

TEST(FailoverTest, ACallThatMayHaveRunIsNotSentAgainUnlessIdempotent) {
  TestCluster cluster;
  // A coordinator whose answers are lost after the call arrived.
  StandbyStandIn lost("", StandbyStandIn::Mode::kLostAnswer);
  ASSERT_FALSE(lost.address().empty());
  absl::StatusOr<std::unique_ptr<Client>> direct = ConnectList(cluster, cluster.address());
  ASSERT_TRUE(direct.ok());
  absl::StatusOr<v1::Job> job = (*direct)->Submit(Spec());
  ASSERT_TRUE(job.ok()) << job.status();

  absl::StatusOr<std::unique_ptr<Client>> client =
      ConnectList(cluster, absl::StrCat(lost.address(), ",", cluster.address()));
  ASSERT_TRUE(client.ok()) << client.status();
  // Cancel: maybe it ran. Returned as it is, never sent to the next one.
  absl::StatusOr<v1::Job> cancelled = (*client)->Cancel(job->id(), "test");
  ASSERT_FALSE(cancelled.ok());
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(lost.calls(kCancel), 1);
  absl::StatusOr<v1::Job> still = (*direct)->Get(job->id());
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->state(), v1::JOB_STATE_PENDING)
      << "the cancel never reached the other coordinator";

  // A read goes on to the next address.
  absl::StatusOr<v1::Job> got = (*client)->Get(job->id());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->id(), job->id());

  // Submit carries a request id the coordinator deduplicates: sent again
  // to the next address, and still one job per call. (A list of its own:
  // this process remembers the active coordinator of the one above.)
  StandbyStandIn lost_too("", StandbyStandIn::Mode::kLostAnswer);
  absl::StatusOr<std::unique_ptr<Client>> other =
      ConnectList(cluster, absl::StrCat(lost_too.address(), ",", cluster.address()));
  ASSERT_TRUE(other.ok()) << other.status();
  absl::StatusOr<v1::Job> second = (*other)->Submit(Spec());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(lost_too.calls(kSubmit), 1);
  EXPECT_EQ(JobsOn(cluster), 2u);
}

TEST(FailoverTest, CliTakesAListFromTheFlagAndTheEnvironment) {
  TestCluster cluster;
  StandbyStandIn standby(cluster.address());
  ASSERT_FALSE(standby.address().empty());
  const std::string dir = testing::MakeTempDir();
  const std::string file = testing::WriteFile(dir, "job.yaml", testing::ValidJobYaml(2));
  const std::string dead = absl::StrCat("127.0.0.1:", testing::UnusedPort());

  CliRun r = RunTrainctl({"--coordinator", absl::StrCat(standby.address(), ",", cluster.address()),
                          "--token", cluster.admin_token(), "--timeout", "20", "submit", file});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(JobsOn(cluster), 1u);
  EXPECT_EQ(standby.calls(kSubmit), 1);

  r = RunTrainctl({"--coordinator", absl::StrCat(dead, ",", cluster.address()), "--token",
                   cluster.admin_token(), "--timeout", "20", "list"});
  ASSERT_EQ(r.code, 0) << r.err;

  cli::CliEnvironment env = testing::TestEnvironment();
  const std::string list = absl::StrCat(dead, ",", standby.address());
  env.getenv = [&](const std::string& name) -> std::optional<std::string> {
    if (name == "TRAINCTL_COORDINATOR") return list;
    return std::nullopt;
  };
  r = RunTrainctl({"--token", cluster.admin_token(), "--timeout", "20", "workers"}, env);
  EXPECT_EQ(r.code, 0) << r.err;

  // A bad entry names where it came from.
  r = RunTrainctl({"--coordinator", "a:7070,b", "list"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--coordinator: 'b': expected HOST:PORT (no port)"));
  env.getenv = [](const std::string& name) -> std::optional<std::string> {
    if (name == "TRAINCTL_COORDINATOR") return "a:7070,,b:1";
    return std::nullopt;
  };
  r = RunTrainctl({"list"}, env);
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("$TRAINCTL_COORDINATOR: entry 2 of 'a:7070,,b:1' is empty"));
}

}  // namespace
}  // namespace trainctl
