// Active and standby coordinators on one PostgreSQL database (issue #29;
// docs/operator.md, "High availability"): real trainctl-coordinator
// processes with --store postgresql://... on loopback ports, and the real
// PostgreSQL server pg_test_server.h starts for this binary.
//   - The second coordinator is a standby: health NOT_SERVING, every other
//     call UNAVAILABLE naming the active one (trailing metadata
//     trainctl-active-coordinator).
//   - SIGKILL the active one: the standby takes over with every job; the
//     killed one, restarted, stays a standby.
//   - SIGSTOP the active one past its lease: the standby takes over; after
//     SIGCONT the old one steps down (re-executes as a standby) and writes
//     nothing: every jobs and events row carries its writer's leader epoch.
// Every wait polls an observable condition, bounded by a deadline; the only
// fixed sleep is how long a coordinator is kept stopped.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/auth/secret.h"
#include "common/jobspec/job_spec.h"
#include "common/temp_dir.h"
#include "coordinator/store/pg_test_server.h"
#include "tests/support/cluster.h"
#include "tests/support/ports.h"
#include "trainctl/v1/job_service.grpc.pb.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using coordinator::store_testing::PgServer;
using coordinator::store_testing::PgTestServer;
using testing::Process;

constexpr char kActiveKey[] = "trainctl-active-coordinator";

// grpc.health.v1.Health/Check through the generic stub (the health proto's
// C++ code is not installed): 1 SERVING, 2 NOT_SERVING, -1 no answer.
int HealthOf(const std::string& address, const std::string& service) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  // HealthCheckRequest{service = 1}: tag 0x0a, length, bytes.
  std::string req;
  if (!service.empty()) req = absl::StrCat(std::string(1, '\x0a'), std::string(1, static_cast<char>(service.size())), service);
  grpc::Slice slice(req);
  grpc::ByteBuffer request(&slice, 1);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse{status = 1}: 0x08 then the enum (absent: UNKNOWN, 0).
  if (bytes.size() >= 2 && bytes[0] == '\x08') return bytes[1];
  return 0;
}

class HaE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    PgTestServer& pg = PgServer();
    if (!pg.ok()) GTEST_SKIP() << "needs PostgreSQL: " << pg.status();
    auto uri = pg.NewDatabase();
    ASSERT_TRUE(uri.ok()) << uri.status();
    store_ = *uri;
    database_ = pg.last_database();
    dir_ = MakeTempDir("ha_e2e");
    binary_ = testing::BuildDirOfThisTest() + "/coordinator/trainctl-coordinator";
  }

  void TearDown() override {
    // The coordinators' logs stay for a failed test to be read.
    if (!dir_.empty() && !HasFailure()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  std::unique_ptr<Process> Start(const std::string& name, int port) {
    std::vector<std::string> argv{binary_,
                                  absl::StrCat("--listen=127.0.0.1:", port),
                                  "--store=" + store_,
                                  "--admin_token_file=" + dir_ + "/admin.token",
                                  "--leader_lease_s=2",
                                  "--standby_poll_ms=200",
                                  "--recovery_grace_s=2"};
    auto p = std::make_unique<Process>(argv, absl::StrCat(dir_, "/", name, "-", starts_++, ".log"));
    EXPECT_TRUE(p->Start());
    return p;
  }

  // Polls the health service until `service` reports `want`.
  bool WaitHealth(const std::string& address, int want, absl::Duration timeout,
                  const std::string& service = "") {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (HealthOf(address, service) == want) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  std::unique_ptr<v1::JobService::Stub> Jobs(const std::string& address) {
    if (token_.empty()) {
      absl::StatusOr<std::string> t = auth::ReadTokenFile(dir_ + "/admin.token");
      EXPECT_TRUE(t.ok()) << t.status();
      if (t.ok()) token_ = *t;
    }
    grpc::ChannelArguments args;
    return v1::JobService::NewStub(grpc::experimental::CreateCustomChannelWithInterceptors(
        address, grpc::InsecureChannelCredentials(), args, auth::BearerInterceptors(token_)));
  }

  grpc::Status Submit(v1::JobService::Stub* jobs, const std::string& name, std::string* id) {
    ParsedJobSpec p = ParseJobSpecYaml(
        absl::StrCat("name: ", name, "\nmodel: {name: mlp, input_dim: 5, classes: 2}\n"
                     "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n"
                     "scheduling: {wait_for_capacity: true}\n"),
        "ha.yaml", {});
    EXPECT_TRUE(p.ok());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::SubmitJobRequest req;
    *req.mutable_spec() = p.spec;
    v1::SubmitJobResponse resp;
    grpc::Status s = jobs->SubmitJob(&ctx, req, &resp);
    if (s.ok() && id != nullptr) *id = resp.job().id();
    return s;
  }

  std::string Scalar(const std::string& sql) {
    absl::StatusOr<std::string> v = PgServer().AdminQuery(database_, sql);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : "(error)";
  }

  // A standby's answer to ListJobs must name `active`.
  void ExpectStandbyNaming(const std::string& standby, const std::string& active) {
    auto jobs = Jobs(standby);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListJobsResponse resp;
    grpc::Status s = jobs->ListJobs(&ctx, v1::ListJobsRequest(), &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
    EXPECT_EQ(s.error_message(), "standby coordinator; the active coordinator is at " + active);
    auto it = ctx.GetServerTrailingMetadata().find(kActiveKey);
    ASSERT_NE(it, ctx.GetServerTrailingMetadata().end()) << "no " << kActiveKey << " in the trailers";
    EXPECT_EQ(std::string(it->second.data(), it->second.size()), active);
  }

  std::string store_, database_, dir_, binary_, token_;
  int starts_ = 0;
};

TEST_F(HaE2ETest, TheSecondIsAStandbyAndTakesOverWhenTheActiveIsKilled) {
  const int port_a = testing::UnusedPort(), port_b = testing::UnusedPort();
  const std::string a = absl::StrCat("127.0.0.1:", port_a), b = absl::StrCat("127.0.0.1:", port_b);
  std::unique_ptr<Process> first = Start("a", port_a);
  ASSERT_TRUE(WaitHealth(a, 1, absl::Seconds(60))) << first->ReadLog();
  std::unique_ptr<Process> second = Start("b", port_b);
  ASSERT_TRUE(WaitHealth(b, 2, absl::Seconds(60))) << second->ReadLog();
  for (const char* service : {"trainctl.v1.JobService", "trainctl.v1.WorkerService", "trainctl.v1.AuthService",
                              "trainctl.v1.QueueService"}) {
    EXPECT_EQ(HealthOf(b, service), 2) << service;
    EXPECT_EQ(HealthOf(a, service), 1) << service;
  }
  ExpectStandbyNaming(b, a);

  std::string before;
  ASSERT_TRUE(Submit(Jobs(a).get(), "before", &before).ok());

  first->Kill(SIGKILL);
  first->Wait(absl::Seconds(10));
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(WaitHealth(b, 1, absl::Seconds(10))) << second->ReadLog();
  const absl::Duration failover = absl::Now() - killed;
  EXPECT_LT(failover, absl::Seconds(10));
  std::cerr << "failover after SIGKILL: " << absl::FormatDuration(failover) << "\n";
  auto jobs = Jobs(b);
  std::string after;
  grpc::Status submitted = Submit(jobs.get(), "after", &after);
  ASSERT_TRUE(submitted.ok()) << submitted.error_message();
  {
    grpc::ClientContext ctx;
    v1::GetJobRequest req;
    req.set_job_id(before);
    v1::Job job;
    grpc::Status got = jobs->GetJob(&ctx, req, &job);
    ASSERT_TRUE(got.ok()) << got.error_message();
    EXPECT_EQ(job.spec().name(), "before");
  }
  EXPECT_EQ(Scalar("SELECT epoch FROM leader"), "2");
  EXPECT_EQ(Scalar("SELECT address FROM leader"), b);

  // The killed one comes back as a standby naming the new active one.
  first = Start("a", port_a);
  ASSERT_TRUE(WaitHealth(a, 2, absl::Seconds(60))) << first->ReadLog();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (first->ReadLog().find("active=" + b) == std::string::npos && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ExpectStandbyNaming(a, b);
  EXPECT_EQ(HealthOf(b, ""), 1);
  EXPECT_EQ(Scalar("SELECT epoch FROM leader"), "2");
}

TEST_F(HaE2ETest, AStoppedActiveIsReplacedAndStepsDownWithoutWritingAfterSigcont) {
  const int port_a = testing::UnusedPort(), port_b = testing::UnusedPort();
  const std::string a = absl::StrCat("127.0.0.1:", port_a), b = absl::StrCat("127.0.0.1:", port_b);
  std::unique_ptr<Process> first = Start("a", port_a);
  ASSERT_TRUE(WaitHealth(a, 1, absl::Seconds(60))) << first->ReadLog();
  std::unique_ptr<Process> second = Start("b", port_b);
  ASSERT_TRUE(WaitHealth(b, 2, absl::Seconds(60))) << second->ReadLog();
  std::string before;
  ASSERT_TRUE(Submit(Jobs(a).get(), "before", &before).ok());
  ASSERT_EQ(Scalar("SELECT epoch FROM leader"), "1");

  // Stopped longer than its lease (2 s): PostgreSQL ends its session, the
  // standby takes the lock.
  first->Kill(SIGSTOP);
  const absl::Time stopped = absl::Now();
  ASSERT_TRUE(WaitHealth(b, 1, absl::Seconds(30))) << second->ReadLog();
  std::cerr << "failover after SIGSTOP: " << absl::FormatDuration(absl::Now() - stopped) << "\n";
  absl::SleepFor(absl::Seconds(1));  // the stop itself goes on a little: the old one's timers all overdue
  EXPECT_EQ(Scalar("SELECT epoch FROM leader"), "2");
  std::string during;
  ASSERT_TRUE(Submit(Jobs(b).get(), "during", &during).ok());
  const std::string old_jobs = Scalar("SELECT COUNT(*) FROM jobs WHERE leader_epoch = 1");
  const std::string old_events = Scalar("SELECT COUNT(*) FROM events WHERE leader_epoch = 1");
  EXPECT_EQ(old_jobs, "1");

  // SIGCONT, and at once a submit to the old one: it must not be taken.
  first->Kill(SIGCONT);
  std::string refused;
  grpc::Status late = Submit(Jobs(a).get(), "to-the-deposed", &refused);
  EXPECT_FALSE(late.ok()) << "the deposed coordinator took job " << refused;
  // It steps down: re-executed (same pid) as a standby naming the new one.
  ASSERT_TRUE(WaitHealth(a, 2, absl::Seconds(30))) << first->ReadLog();
  EXPECT_TRUE(first->running());
  EXPECT_THAT(first->ReadLog(), HasSubstr("deposed"));
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (first->ReadLog().find("active=" + b) == std::string::npos && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ExpectStandbyNaming(a, b);

  // Nothing written by epoch 1 after it was deposed; the new one holds on.
  EXPECT_EQ(Scalar("SELECT COUNT(*) FROM jobs WHERE leader_epoch = 1"), old_jobs);
  EXPECT_EQ(Scalar("SELECT COUNT(*) FROM events WHERE leader_epoch = 1"), old_events);
  EXPECT_EQ(Scalar("SELECT COUNT(*) FROM jobs"), "2");
  EXPECT_EQ(Scalar("SELECT epoch FROM leader"), "2");
  EXPECT_EQ(HealthOf(b, ""), 1);
  auto jobs = Jobs(b);
  grpc::ClientContext ctx;
  v1::ListJobsResponse list;
  ASSERT_TRUE(jobs->ListJobs(&ctx, v1::ListJobsRequest(), &list).ok());
  std::vector<std::string> names;
  for (const v1::Job& j : list.jobs()) names.push_back(j.spec().name());
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("before", "during"));
}

// Two coordinators started together, before any admin token file exists:
// the one that waited uses the file the active one wrote (one admin token
// for the cluster), not a secret of its own.
TEST_F(HaE2ETest, StartedTogetherTheyShareTheAdminTokenTheActiveWrote) {
  const int port_a = testing::UnusedPort(), port_b = testing::UnusedPort();
  const std::string a = absl::StrCat("127.0.0.1:", port_a), b = absl::StrCat("127.0.0.1:", port_b);
  std::unique_ptr<Process> first = Start("a", port_a);
  std::unique_ptr<Process> second = Start("b", port_b);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  int health_a = -1, health_b = -1;
  while (absl::Now() < deadline && !((health_a == 1 && health_b == 2) || (health_a == 2 && health_b == 1))) {
    absl::SleepFor(absl::Milliseconds(50));
    health_a = HealthOf(a, "");
    health_b = HealthOf(b, "");
  }
  ASSERT_TRUE((health_a == 1 && health_b == 2) || (health_a == 2 && health_b == 1))
      << first->ReadLog() << second->ReadLog();
  Process* active = health_a == 1 ? first.get() : second.get();
  const std::string active_address = health_a == 1 ? a : b, standby_address = health_a == 1 ? b : a;
  std::string id;
  ASSERT_TRUE(Submit(Jobs(active_address).get(), "first", &id).ok());  // the token from the file
  active->Kill(SIGKILL);
  active->Wait(absl::Seconds(10));
  ASSERT_TRUE(WaitHealth(standby_address, 1, absl::Seconds(30)));
  grpc::Status s = Submit(Jobs(standby_address).get(), "second", &id);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// Bad HA flags are refused before anything starts, naming the flag.
TEST(HaFlagsTest, BadFlagsAreRefusedNamingTheFlag) {
  const std::string dir = MakeTempDir("ha_flags");
  const std::string binary = testing::BuildDirOfThisTest() + "/coordinator/trainctl-coordinator";
  struct Case {
    std::string flag, says;
  };
  int n = 0;
  for (const Case& c : {Case{"--advertise-address=no-port-here", "--advertise-address"},
                        Case{"--advertise-address=host:70000", "--advertise-address"},
                        Case{"--leader-lease-s=0", "--leader-lease-s"},
                        Case{"--standby-poll-ms=1", "--standby-poll-ms"}}) {
    Process p({binary, "--listen=127.0.0.1:0", "--db=" + dir + "/state.db", "--admin_token_file=" + dir + "/admin.token",
               c.flag},
              absl::StrCat(dir, "/flags-", n++, ".log"));
    ASSERT_TRUE(p.Start());
    const int status = p.Wait(absl::Seconds(30));
    ASSERT_NE(status, -1) << c.flag << ": still running";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << c.flag << ": " << p.ReadLog();
    EXPECT_THAT(p.ReadLog(), HasSubstr(c.says)) << c.flag;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace trainctl
