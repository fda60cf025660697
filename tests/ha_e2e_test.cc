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
//   - Two real worker daemons given both addresses run a job while the
//     active coordinator is SIGKILLed: the standby takes over, the workers
//     follow it, the job SUCCEEDS in its first attempt (no rank restarted)
//     with every metric point and log line stored once, and every submit a
//     concurrent loop (the client library, given both addresses) saw
//     acknowledged is there; a `logs -f` follower (the same) resumes once
//     on the new active coordinator and gets every kept line once, in order.
// Every wait polls an observable condition, bounded by a deadline; the only
// fixed sleep is how long a coordinator is kept stopped.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/trainctl/client.h"
#include "common/auth/secret.h"
#include "common/jobspec/job_spec.h"
#include "common/temp_dir.h"
#include "coordinator/store/pg_test_server.h"
#include "tests/support/cluster.h"
#include "tests/support/ports.h"
#include "tests/support/source_dir.h"
#include "trainctl/v1/job_service.grpc.pb.h"

namespace trainctl {
namespace {

using coordinator::store_testing::PgServer;
using coordinator::store_testing::PgTestServer;
using ::testing::HasSubstr;
using testing::Process;

constexpr char kActiveKey[] = "trainctl-active-coordinator";

// grpc.health.v1.Health/Check through the generic stub (the health proto's
// C++ code is not installed): 1 SERVING, 2 NOT_SERVING, -1 no answer.
int HealthOf(const std::string& address, const std::string& service,
             absl::Duration wait = absl::Seconds(2)) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(wait));
  // HealthCheckRequest{service = 1}: tag 0x0a, length, bytes.
  std::string req;
  if (!service.empty())
    req = absl::StrCat(std::string(1, '\x0a'), std::string(1, static_cast<char>(service.size())),
                       service);
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
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
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
        absl::StrCat("name: ", name,
                     "\nmodel: {name: mlp, input_dim: 5, classes: 2}\n"
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
    ASSERT_NE(it, ctx.GetServerTrailingMetadata().end())
        << "no " << kActiveKey << " in the trailers";
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
  for (const char* service : {"trainctl.v1.JobService", "trainctl.v1.WorkerService",
                              "trainctl.v1.AuthService", "trainctl.v1.QueueService"}) {
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
  absl::SleepFor(
      absl::Seconds(1));  // the stop itself goes on a little: the old one's timers all overdue
  EXPECT_EQ(Scalar("SELECT epoch FROM leader"), "2");
  std::string during;
  ASSERT_TRUE(Submit(Jobs(b).get(), "during", &during).ok());
  const std::string old_jobs = Scalar("SELECT COUNT(*) FROM jobs WHERE leader_epoch = 1");
  const std::string old_events = Scalar("SELECT COUNT(*) FROM events WHERE leader_epoch = 1");
  EXPECT_EQ(old_jobs, "1");

  // A health check sent while it is stopped waits in its socket; answered
  // after SIGCONT, it must not say SERVING: the old one cannot know yet
  // whether it still holds the store (it does not). The pause only gives
  // the request time to reach the socket: sent later, it must get the same.
  std::atomic<int> late_health{0};
  std::thread probe([&] { late_health = HealthOf(a, "", absl::Seconds(20)); });
  absl::SleepFor(absl::Milliseconds(300));

  // SIGCONT, and at once a submit to the old one: it must not be taken.
  first->Kill(SIGCONT);
  std::string refused;
  grpc::Status late = Submit(Jobs(a).get(), "to-the-deposed", &refused);
  EXPECT_FALSE(late.ok()) << "the deposed coordinator took job " << refused;
  probe.join();
  EXPECT_NE(late_health.load(), 1) << "the deposed coordinator said SERVING after SIGCONT";
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

// Issue #29's failover e2e: PostgreSQL, two coordinators, two worker
// daemons with both addresses, a job running (tests/support/fake_rank.py's
// chatty job: 8 epochs of 20 steps, a metric point and a log line each, per
// rank) and a submit loop; the active coordinator is SIGKILLed mid-job.
TEST_F(HaE2ETest, AJobRunsThroughAFailoverWithoutARankRestartOrALostPoint) {
  constexpr int kWorld = 2, kEpochs = 8, kSteps = 20;
  const int port_a = testing::UnusedPort(), port_b = testing::UnusedPort();
  const std::string a = absl::StrCat("127.0.0.1:", port_a), b = absl::StrCat("127.0.0.1:", port_b);
  const std::vector<std::string> ha_flags{"--store=" + store_, "--leader_lease_s=2",
                                          "--standby_poll_ms=200", "--recovery_grace_s=10",
                                          "--rendezvous_timeout_s=60"};
  testing::Cluster cluster(testing::BuildDirOfThisTest(),
                           testing::SourceDir() + "/tests/support/fake_rank.py");
  std::vector<std::string> first_flags = ha_flags;
  first_flags.push_back("--listen=" + a);
  ASSERT_TRUE(cluster.StartCoordinator(first_flags)) << cluster.coordinator()->ReadLog();
  ASSERT_TRUE(WaitHealth(a, 1, absl::Seconds(60))) << cluster.coordinator()->ReadLog();
  // The standby: the cluster's flags, its own port, the same admin token file.
  std::vector<std::string> second_argv{binary_,
                                       "--listen=" + b,
                                       "--heartbeat_interval_ms=200",
                                       "--lease_timeout_ms=1500",
                                       "--stop_grace_s=2",
                                       "--admin_token_file=" + cluster.dir() + "/admin.token"};
  second_argv.insert(second_argv.end(), ha_flags.begin(), ha_flags.end());
  Process second(second_argv, dir_ + "/b.log");
  ASSERT_TRUE(second.Start());
  ASSERT_TRUE(WaitHealth(b, 2, absl::Seconds(60))) << second.ReadLog();

  for (int i = 0; i < kWorld; ++i) {
    ASSERT_TRUE(
        cluster.StartWorker(absl::StrCat("w", i), 1, false, {"--coordinator=" + a + "," + b}));
  }
  ASSERT_TRUE(cluster.WaitWorkers(kWorld));
  ParsedJobSpec chatty = ParseJobSpecYaml(
      "model: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n",
      "chatty.yaml",
      {"name=chatty", absl::StrCat("world_size=", kWorld),
       absl::StrCat("training.epochs=", kEpochs), "restart.max_restarts=0"});
  ASSERT_TRUE(chatty.ok());
  const std::string id = cluster.Submit(chatty.spec);
  ASSERT_FALSE(id.empty());
  v1::Job running = cluster.WaitFor(id, [](const v1::Job& j) {
    return j.state() == v1::JOB_STATE_RUNNING && j.progress().epoch() >= 1;
  });
  ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.state_reason();
  ASSERT_LT(running.progress().epoch(), kEpochs - 2) << "the failover must come mid-job";

  // `trainctl logs -f` through the client library, given both addresses,
  // following the job across the failover.
  std::map<int, std::vector<std::string>> followed;  // rank -> lines; guarded by mu_follow
  absl::Mutex mu_follow;
  std::vector<std::string> log_breaks;  // why each break was; guarded by mu_follow
  absl::Status follow_status = absl::UnknownError("not run");
  std::atomic<bool> following{false};
  std::thread follower([&] {
    ClientOptions o;
    o.address = a + "," + b;
    o.token = cluster.admin_token();
    o.timeout = absl::Seconds(20);
    o.on_watch_broken = [&](const absl::Status& why) {
      absl::MutexLock l(&mu_follow);
      log_breaks.push_back(why.ToString());
    };
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(o);
    if (!client.ok()) {
      follow_status = client.status();
      return;
    }
    LogsOptions lo;
    lo.follow = true;
    follow_status = (*client)->Logs(id, lo, [&](const v1::LogChunk& c) {
      following = true;
      absl::MutexLock l(&mu_follow);
      for (const v1::LogLine& line : c.lines()) followed[c.rank()].push_back(line.text());
      return true;
    });
  });
  for (absl::Time until = absl::Now() + absl::Seconds(30); !following && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(10));
  }

  // A submit loop through the client library, given both addresses; one
  // job of one rank each (they wait: the chatty job holds every slot).
  std::atomic<bool> stop{false};
  absl::Mutex mu;
  std::vector<std::string> acknowledged;  // guarded by mu
  std::string loop_error;                 // written before the thread ends
  std::thread submitter([&] {
    ClientOptions o;
    o.address = a + "," + b;
    o.token = cluster.admin_token();
    o.timeout = absl::Seconds(20);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(o);
    if (!client.ok()) {
      loop_error = client.status().ToString();
      return;
    }
    ParsedJobSpec one = ParseJobSpecYaml(
        "model: {name: mlp, input_dim: 5, classes: 2}\n"
        "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n",
        "one.yaml", {"name=loop", "world_size=1", "training.epochs=1"});
    // Paced (about 50 a second) so that the loop spans the failover.
    for (int n = 0; !stop.load() && n < 3000; ++n) {
      absl::StatusOr<v1::Job> j = (*client)->Submit(one.spec);
      if (j.ok()) {
        absl::MutexLock l(&mu);
        acknowledged.push_back(j->id());
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  });

  auto submitted = [&] {
    absl::MutexLock l(&mu);
    return acknowledged.size();
  };
  // Some submits before the kill, some after the takeover.
  for (absl::Time until = absl::Now() + absl::Seconds(30);
       submitted() < 5 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GE(submitted(), 5u) << loop_error;
  cluster.KillCoordinator(SIGKILL);
  const absl::Time killed = absl::Now();
  const size_t before_kill = submitted();
  ASSERT_TRUE(WaitHealth(b, 1, absl::Seconds(10)))
      << "the standby is not active 10 s after the kill\n"
      << second.ReadLog();
  std::cerr << "failover after SIGKILL with workers: " << absl::FormatDuration(absl::Now() - killed)
            << "\n";
  cluster.UseCoordinatorAt(b);
  for (absl::Time until = absl::Now() + absl::Seconds(60);
       submitted() < before_kill + 5 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  stop = true;
  submitter.join();
  EXPECT_GE(submitted(), before_kill + 5)
      << "the submit loop did not go on through the new active coordinator";

  v1::Job done = cluster.WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(120));
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.state_reason() << "\n"
                                                   << second.ReadLog();
  EXPECT_EQ(done.attempts_size(), 1) << "a rank was restarted";
  EXPECT_EQ(done.restarts(), 0);

  // The follower ended with the job, having resumed once on the new active
  // coordinator: it got each rank's kept lines exactly, none twice, in order.
  follower.join();
  EXPECT_TRUE(follow_status.ok()) << follow_status;
  {
    ClientOptions o;
    o.address = b;
    o.token = cluster.admin_token();
    o.timeout = absl::Seconds(20);
    absl::StatusOr<std::unique_ptr<Client>> reader = Client::Connect(o);
    ASSERT_TRUE(reader.ok()) << reader.status();
    std::map<int, std::vector<std::string>> kept;
    ASSERT_TRUE((*reader)
                    ->Logs(id, LogsOptions{},
                           [&](const v1::LogChunk& c) {
                             for (const v1::LogLine& line : c.lines())
                               kept[c.rank()].push_back(line.text());
                             return true;
                           })
                    .ok());
    absl::MutexLock l(&mu_follow);
    EXPECT_EQ(log_breaks.size(), 1u) << absl::StrJoin(log_breaks, "; ");
    ASSERT_EQ(kept.size(), static_cast<size_t>(kWorld));
    for (const auto& [rank, lines] : kept) {
      EXPECT_GE(lines.size(), static_cast<size_t>(kEpochs * kSteps)) << "rank " << rank;
      EXPECT_EQ(followed[rank], lines)
          << "rank " << rank << ": logs -f got " << followed[rank].size()
          << " lines, the coordinator kept " << lines.size();
    }
  }

  // Every point and line, once: what the chatty job produces.
  std::map<std::tuple<int, int, int64_t, int>, int> points;
  EXPECT_TRUE(cluster
                  .Follow(id, absl::Seconds(30),
                          [&](const v1::JobUpdate& u) {
                            for (const v1::MetricPoint& p : u.metrics().points()) {
                              ++points[{p.rank(), p.epoch(), p.step(), static_cast<int>(p.kind())}];
                            }
                          })
                  .ok());
  EXPECT_EQ(points.size(), static_cast<size_t>(kWorld * kEpochs * (kSteps + 1)));
  for (const auto& [key, n] : points) EXPECT_EQ(n, 1);
  for (int r = 0; r < kWorld; ++r) {
    const std::string log = cluster.RankLog(id, 1, r);
    EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1 + kEpochs * (kSteps + 1)) << "rank " << r;
  }

  // Every acknowledged submit is on the new active coordinator.
  EXPECT_TRUE(loop_error.empty()) << loop_error;
  for (const std::string& j : acknowledged) {
    EXPECT_EQ(cluster.Get(j).id(), j) << "acknowledged submit " << j << " is missing";
  }
  std::cerr << acknowledged.size() << " submits acknowledged across the failover\n";

  // The killed one, restarted, stays a standby.
  std::unique_ptr<Process> again = Start("a-again", port_a);
  ASSERT_TRUE(WaitHealth(a, 2, absl::Seconds(60))) << again->ReadLog();
  EXPECT_EQ(HealthOf(b, ""), 1);
}

// A PostgreSQL outage is an outage, not a hang (docs/failures.md): the
// server is killed (-9) mid-job and started again 10 s later; the job goes
// on in its first attempt, the coordinator says the store failed.
TEST_F(HaE2ETest, AJobSurvivesATenSecondDatabaseOutageInOneAttempt) {
  constexpr int kWorld = 2, kEpochs = 20;
  // The real engine (its ranks' heartbeats and the adaptive hang bound).
  const std::string rank = testing::BuildDirOfThisTest() + "/worker/trainer/trainctl-rank";
  if (!std::filesystem::exists(rank)) GTEST_SKIP() << "no trainctl-rank (a build without LibTorch)";
  testing::Cluster cluster(testing::BuildDirOfThisTest(), rank);
  ASSERT_TRUE(cluster.StartCoordinator({"--store=" + store_, "--leader_lease_s=2"}))
      << cluster.coordinator()->ReadLog();
  for (int i = 0; i < kWorld; ++i) ASSERT_TRUE(cluster.StartWorker(absl::StrCat("w", i), 1));
  ASSERT_TRUE(cluster.WaitWorkers(kWorld));
  ParsedJobSpec spec = ParseJobSpecYaml(
      "model: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 10000, size: 5, classes: 2}}\n",
      "outage.yaml",
      {"name=outage", absl::StrCat("world_size=", kWorld),
       absl::StrCat("training.epochs=", kEpochs), "restart.max_restarts=0"});
  ASSERT_TRUE(spec.ok());
  const std::string id = cluster.Submit(spec.spec);
  ASSERT_FALSE(id.empty());
  v1::Job running = cluster.WaitFor(id, [](const v1::Job& j) {
    return j.state() == v1::JOB_STATE_RUNNING && j.progress().epoch() >= 1;
  });
  ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.state_reason();
  ASSERT_LT(running.progress().epoch(), kEpochs / 2) << "the outage must come mid-job";

  PgServer().Crash();
  absl::SleepFor(absl::Seconds(10));  // the outage itself: what is measured is the job's fate
  ASSERT_TRUE(PgServer().Restart().ok());

  v1::Job done = cluster.WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(180));
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.state_reason() << "\n"
                                                   << cluster.coordinator()->ReadLog();
  EXPECT_EQ(done.attempts_size(), 1) << "the outage failed an attempt: "
                                     << (done.attempts_size() > 0 ? done.attempts(0).reason() : "");
  const std::string log = cluster.coordinator()->ReadLog();
  EXPECT_THAT(log, HasSubstr("store_failing"));
  EXPECT_THAT(log, HasSubstr("health_checks_paused"));
  EXPECT_THAT(log, HasSubstr("store_recovered"));
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
  while (absl::Now() < deadline &&
         !((health_a == 1 && health_b == 2) || (health_a == 2 && health_b == 1))) {
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

// #45 item 2: the store's password comes from a file, never from a command
// line; one written in --store is warned about.
TEST_F(HaE2ETest, TheStorePasswordComesFromAFileNeverFromTheCommandLine) {
  const std::string secret = "pw-" + std::to_string(::getpid()) + "-c0ffee";
  absl::StatusOr<std::string> uri = PgServer().PasswordRole("pw_owner", secret, database_);
  ASSERT_TRUE(uri.ok()) << uri.status();
  const std::string file = dir_ + "/pg.password";
  ASSERT_TRUE(auth::WritePrivateFile(file, secret + "\n").ok());
  auto start = [&](const std::string& name, int port, std::vector<std::string> extra) {
    std::vector<std::string> argv{binary_, absl::StrCat("--listen=127.0.0.1:", port),
                                  "--admin-token-file=" + dir_ + "/admin.token"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto p = std::make_unique<Process>(argv, absl::StrCat(dir_, "/", name, ".log"));
    EXPECT_TRUE(p->Start());
    return p;
  };
  auto cmdline = [](pid_t pid) {
    std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"));
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };

  // Without the password the server refuses it (it waits, as a standby
  // does, saying why); it never serves.
  {
    const int port = testing::UnusedPort();
    auto p = start("no-password", port, {"--store=" + *uri});
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (!absl::StrContains(p->ReadLog(), "password") && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(100));
    }
    EXPECT_THAT(p->ReadLog(), HasSubstr("password"));
    EXPECT_NE(HealthOf(absl::StrCat("127.0.0.1:", port), ""), 1);
    p->Kill(SIGKILL);
    p->Wait(absl::Seconds(10));
  }
  // From the file: it serves, and its command line holds no password.
  {
    const int port = testing::UnusedPort();
    auto p = start("from-file", port, {"--store=" + *uri, "--store-password-file=" + file});
    ASSERT_TRUE(WaitHealth(absl::StrCat("127.0.0.1:", port), 1, absl::Seconds(60))) << p->ReadLog();
    const std::string args = cmdline(p->pid());
    EXPECT_THAT(args, HasSubstr("--store-password-file"));
    EXPECT_EQ(args.find(secret), std::string::npos) << "the password is on the command line";
    EXPECT_EQ(p->ReadLog().find(secret), std::string::npos) << "the password is in the log";
    p->Kill(SIGTERM);
    p->Wait(absl::Seconds(30));
  }
  // Written in --store: it works, with a warning that says why not to.
  {
    const int port = testing::UnusedPort();
    auto p = start("in-uri", port, {"--store=" + *uri + "&password=" + secret});
    ASSERT_TRUE(WaitHealth(absl::StrCat("127.0.0.1:", port), 1, absl::Seconds(60))) << p->ReadLog();
    EXPECT_THAT(p->ReadLog(), HasSubstr("warning: --store holds a password"));
    EXPECT_EQ(p->ReadLog().find(secret), std::string::npos) << "the password is in the log";
    p->Kill(SIGTERM);
    p->Wait(absl::Seconds(30));
  }
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
    Process p({binary, "--listen=127.0.0.1:0", "--db=" + dir + "/state.db",
               "--admin_token_file=" + dir + "/admin.token", c.flag},
              absl::StrCat(dir, "/flags-", n++, ".log"));
    ASSERT_TRUE(p.Start());
    const int status = p.Wait(absl::Seconds(30));
    ASSERT_NE(status, -1) << c.flag << ": still running";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << c.flag << ": " << p.ReadLog();
    EXPECT_THAT(p.ReadLog(), HasSubstr(c.says)) << c.flag;
  }
  // A PostgreSQL store without an admin token file (or --tls-dir): the
  // working directory is no place for it, and coordinators must share it.
  Process p({binary, "--listen=127.0.0.1:0", "--store=postgresql://trainctl@127.0.0.1:1/none"},
            dir + "/no-admin.log", dir);
  ASSERT_TRUE(p.Start());
  const int status = p.Wait(absl::Seconds(30));
  ASSERT_NE(status, -1) << "still running";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << p.ReadLog();
  EXPECT_THAT(p.ReadLog(), HasSubstr("--admin-token-file: needed with a PostgreSQL --store"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/admin.token"))
      << "nothing written to the working directory";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace trainctl
