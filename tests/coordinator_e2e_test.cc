// The coordinator over gRPC, end to end: in-process and over a real
// loopback port, with scripted workers driving a job through its whole
// life, two watchers, a lost worker and a restart; and the real binary
// killed with SIGKILL and restarted on the same database.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/auth/secret.h"
#include "common/jobspec/job_spec.h"
#include "common/subprocess.h"
#include "common/temp_dir.h"
#include "coordinator/server/coordinator_server.h"
#include "tests/support/fake_worker.h"
#include "trainctl/v1/job_service.grpc.pb.h"

namespace trainctl {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using trainctl::testing::FakeWorker;

std::string TempDir() { return MakeTempDirRemovedAtExit("coord_e2e"); }

v1::JobSpec Spec(int world_size, int max_restarts = 3) {
  ParsedJobSpec p = ParseJobSpecYaml(
      "name: e2e\nmodel: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n",
      "e2e.yaml",
      {absl::StrCat("world_size=", world_size),
       absl::StrCat("restart.max_restarts=", max_restarts)});
  EXPECT_TRUE(p.ok());
  return p.spec;
}

// Collects a WatchJob stream on its own thread.
// `GetLogs(follow)` of the latest attempt, read on its own thread.
class LogFollower {
 public:
  LogFollower(v1::JobService::Stub* stub, const std::string& job) {
    v1::GetLogsRequest req;
    req.set_job_id(job);
    req.set_follow(true);
    reader_ = stub->GetLogs(&ctx_, req);
    thread_ = std::thread([this] {
      v1::LogChunk c;
      while (reader_->Read(&c)) {
        absl::MutexLock lock(&mu_);
        for (const auto& l : c.lines()) lines_.push_back(absl::StrCat(c.attempt(), ":", l.text()));
      }
      reader_->Finish();
      absl::MutexLock lock(&mu_);
      done_ = true;
    });
  }
  ~LogFollower() {
    ctx_.TryCancel();
    thread_.join();
  }
  bool WaitDone(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), timeout);
  }
  // Waits until `n` lines arrived.
  bool WaitLines(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return lines_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  std::vector<std::string> Lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<v1::LogChunk>> reader_;
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

bool SendLog(FakeWorker& w, const std::string& job, int attempt, int rank,
             const std::string& text) {
  v1::WorkerMessage m;
  v1::LogChunk* c = m.mutable_logs();
  c->set_job_id(job);
  c->set_attempt(attempt);
  c->set_rank(rank);
  v1::LogLine* l = c->add_lines();
  l->set_rank(rank);
  l->set_text(text);
  return w.Send(m);
}

class Watcher {
 public:
  Watcher(v1::JobService::Stub* stub, const std::string& job, bool history) {
    v1::WatchJobRequest req;
    req.set_job_id(job);
    req.set_include_history(history);
    reader_ = stub->WatchJob(&ctx_, req);
    thread_ = std::thread([this] {
      v1::JobUpdate u;
      while (reader_->Read(&u)) {
        absl::MutexLock lock(&mu_);
        updates_.push_back(u);
      }
      status_ = reader_->Finish();
      absl::MutexLock lock(&mu_);
      done_ = true;
    });
  }
  ~Watcher() {
    ctx_.TryCancel();
    thread_.join();
  }
  // Waits for the stream to end (the job ended).
  bool WaitDone(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), timeout);
  }
  std::vector<std::string> EventTypes() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const auto& u : updates_)
      if (u.has_event()) out.push_back(u.event().type());
    return out;
  }
  int MetricPoints() {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const auto& u : updates_) n += u.metrics().points_size();
    return n;
  }
  v1::JobState LastState() {
    absl::MutexLock lock(&mu_);
    v1::JobState s = v1::JOB_STATE_UNSPECIFIED;
    for (const auto& u : updates_)
      if (u.has_job()) s = u.job().state();
    return s;
  }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<v1::JobUpdate>> reader_;
  std::thread thread_;
  grpc::Status status_;
  absl::Mutex mu_;
  std::vector<v1::JobUpdate> updates_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

bool IsStart(const v1::CoordinatorMessage& m) { return m.has_start_ranks(); }
auto StartOf(int attempt) {
  return [attempt](const v1::CoordinatorMessage& m) {
    return m.has_start_ranks() && m.start_ranks().attempt() == attempt;
  };
}
auto RendezvousOf(int attempt) {
  return [attempt](const v1::CoordinatorMessage& m) {
    return m.has_rendezvous() && m.rendezvous().attempt() == attempt;
  };
}

v1::Job WaitState(v1::JobService::Stub* stub, const std::string& id, v1::JobState want,
                  absl::Duration timeout = absl::Seconds(10)) {
  absl::Time deadline = absl::Now() + timeout;
  v1::Job job;
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    v1::GetJobRequest req;
    req.set_job_id(id);
    if (stub->GetJob(&ctx, req, &job).ok() && job.state() == want) return job;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ADD_FAILURE() << "job " << id << " never reached state " << want << "; last " << job.state()
                << " " << job.state_reason();
  return job;
}

std::string Submit(v1::JobService::Stub* stub, const v1::JobSpec& spec) {
  grpc::ClientContext ctx;
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  v1::SubmitJobResponse resp;
  grpc::Status s = stub->SubmitJob(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp.job().id();
}

// Drives attempt `attempt` of a 2-rank job with rank 0 on w0 and rank 1 on w1 to success.
void RunToSuccess(v1::JobService::Stub* stub, FakeWorker& w0, FakeWorker& w1, const std::string& id,
                  int attempt) {
  ASSERT_TRUE(w0.WaitFor(StartOf(attempt)));
  ASSERT_TRUE(w1.WaitFor(StartOf(attempt)));
  v1::WorkerMessage rdv;
  rdv.mutable_rendezvous()->set_job_id(id);
  rdv.mutable_rendezvous()->set_attempt(attempt);
  rdv.mutable_rendezvous()->mutable_info()->set_gloo_store_address("127.0.0.1:1234");
  ASSERT_TRUE(w0.Send(rdv));
  ASSERT_TRUE(w0.WaitFor(RendezvousOf(attempt)));
  ASSERT_TRUE(w1.WaitFor(RendezvousOf(attempt)));
  w0.SendStatus(id, attempt, 0, v1::RANK_STATE_RUNNING);
  w1.SendStatus(id, attempt, 1, v1::RANK_STATE_RUNNING);
  WaitState(stub, id, v1::JOB_STATE_RUNNING);
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (auto* w : {&w0, &w1}) {
      v1::WorkerMessage m;
      v1::MetricBatch* b = m.mutable_metrics();
      b->set_job_id(id);
      b->set_attempt(attempt);
      v1::MetricPoint* p = b->add_points();
      p->set_kind(v1::MetricPoint::KIND_EPOCH_END);
      p->set_rank(w == &w0 ? 0 : 1);
      p->set_epoch(epoch);
      p->set_loss(1.0 / (epoch + 1));
      ASSERT_TRUE(w->Send(m));
    }
  }
  w0.SendStatus(id, attempt, 0, v1::RANK_STATE_SUCCEEDED);
  w1.SendStatus(id, attempt, 1, v1::RANK_STATE_SUCCEEDED);
}

// Every call goes through authentication: clients carry this admin secret,
// fake workers a worker token (kept across restarts: their ids are bound).
constexpr char kAdminToken[] = "tct_admin_coordinator-e2e-test";

std::shared_ptr<grpc::Channel> Net(const std::string& addr,
                                   const std::string& token = kAdminToken) {
  auth::ChannelSecurity security;
  security.token = token;
  return *auth::MakeChannel(addr, security, grpc::ChannelArguments());
}

std::string WorkerToken(coordinator::CoordinatorServer& server) {
  absl::StatusOr<std::string> t = server.IssueToken(v1::ROLE_WORKER, "fake-workers");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : "";
}

coordinator::CoordinatorOptions Options(const std::string& dir) {
  coordinator::CoordinatorOptions o;
  o.admin_token = kAdminToken;
  o.listen = "127.0.0.1:0";
  o.db_path = dir + "/state.db";
  o.registry.heartbeat_interval = absl::Milliseconds(100);
  o.registry.lease_timeout = absl::Milliseconds(800);
  o.check_interval = absl::Milliseconds(50);
  return o;
}

TEST(CoordinatorE2ETest, InProcessJobLifeWithTwoWatchers) {
  std::string dir = TempDir();
  coordinator::CoordinatorServer server(Options(dir));
  ASSERT_TRUE(server.Start().ok());
  auto channel = server.InProcessChannel(kAdminToken);
  auto stub = v1::JobService::NewStub(channel);

  std::string wt = WorkerToken(server);
  auto wchannel = server.InProcessChannel("");
  FakeWorker w0(wchannel, "w0", 1, absl::Milliseconds(100), wt),
      w1(wchannel, "w1", 1, absl::Milliseconds(100), wt);
  ASSERT_TRUE(w0.Connect());
  ASSERT_TRUE(w1.Connect());
  std::string id = Submit(stub.get(), Spec(2));
  Watcher early(stub.get(), id, /*history=*/false);
  RunToSuccess(stub.get(), w0, w1, id, 1);
  v1::Job done = WaitState(stub.get(), id, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.attempts_size(), 1);
  ASSERT_TRUE(early.WaitDone(absl::Seconds(10))) << "watch ends when the job ends";
  EXPECT_THAT(early.EventTypes(), Contains("succeeded"));
  EXPECT_EQ(early.MetricPoints(), 4);
  EXPECT_EQ(early.LastState(), v1::JOB_STATE_SUCCEEDED);

  // A late watcher gets the history, then the stream ends.
  Watcher late(stub.get(), id, /*history=*/true);
  ASSERT_TRUE(late.WaitDone(absl::Seconds(10)));
  EXPECT_THAT(late.EventTypes(), ::testing::ElementsAre("submitted", "scheduled", "running",
                                                        "epoch_end", "epoch_end", "succeeded"));
  EXPECT_EQ(late.MetricPoints(), 4);
  w0.Leave();
  w1.Leave();
}

TEST(CoordinatorE2ETest, LoopbackLostWorkerRestartsAndBadInputIsRefused) {
  std::string dir = TempDir();
  coordinator::CoordinatorServer server(Options(dir));
  absl::StatusOr<std::string> addr = server.Start();
  ASSERT_TRUE(addr.ok());
  auto channel = Net(*addr);
  auto stub = v1::JobService::NewStub(channel);
  std::string wt = WorkerToken(server);
  auto wchannel = Net(*addr, "");

  // Bad input: named field, nothing stored.
  {
    v1::JobSpec bad = Spec(2);
    bad.set_world_size(-1);
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    *req.mutable_spec() = bad;
    v1::SubmitJobResponse resp;
    grpc::Status s = stub->SubmitJob(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("world_size: must be > 0, got -1"));
    grpc::ClientContext ctx2;
    v1::GetJobRequest get;
    get.set_job_id("nope");
    v1::Job job;
    EXPECT_EQ(stub->GetJob(&ctx2, get, &job).error_code(), grpc::StatusCode::NOT_FOUND);
  }

  FakeWorker w0(wchannel, "w0", 1, absl::Milliseconds(100), wt),
      w1(wchannel, "w1", 1, absl::Milliseconds(100), wt);
  ASSERT_TRUE(w0.Connect());
  ASSERT_TRUE(w1.Connect());
  // A second daemon claiming w0's id is refused.
  FakeWorker imposter(wchannel, "w0", 1, absl::Milliseconds(100), wt);
  EXPECT_FALSE(imposter.Connect());

  std::string id = Submit(stub.get(), Spec(2));
  Watcher watcher(stub.get(), id, false);
  ASSERT_TRUE(w0.WaitFor(StartOf(1)));
  ASSERT_TRUE(w1.WaitFor(StartOf(1)));
  w0.SendStatus(id, 1, 0, v1::RANK_STATE_RUNNING);
  w1.SendStatus(id, 1, 1, v1::RANK_STATE_RUNNING);
  WaitState(stub.get(), id, v1::JOB_STATE_RUNNING);
  // `trainctl logs -f` started during attempt 1 follows the job into attempt 2.
  LogFollower follower(stub.get(), id);
  ASSERT_TRUE(SendLog(w0, id, 1, 0, "first attempt"));
  ASSERT_TRUE(follower.WaitLines(1, absl::Seconds(10)));

  // w1 dies: after its lease the attempt fails and the job restarts.
  absl::Time crashed = absl::Now();
  w1.Crash();
  v1::Job j = WaitState(stub.get(), id, v1::JOB_STATE_RESTARTING);
  EXPECT_LT(absl::Now() - crashed, absl::Seconds(3)) << "lost within a few leases";
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("lost with its worker"));
  auto stop = w0.WaitFor([](const v1::CoordinatorMessage& m) { return m.has_stop_ranks(); });
  ASSERT_TRUE(stop);
  w0.SendStatus(id, 1, 0, v1::RANK_STATE_STOPPED);
  // w1 comes back; attempt 2 runs to the end.
  ASSERT_TRUE(w1.Connect());
  ASSERT_TRUE(w0.WaitFor(StartOf(2)));
  ASSERT_TRUE(SendLog(w0, id, 2, 0, "second attempt"));
  ASSERT_TRUE(follower.WaitLines(2, absl::Seconds(10)));
  // Once the follower is on attempt 2, attempt 1's late lines stay out.
  ASSERT_TRUE(SendLog(w0, id, 1, 0, "late line of attempt 1"));
  RunToSuccess(stub.get(), w0, w1, id, 2);
  j = WaitState(stub.get(), id, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(j.restarts(), 1);
  ASSERT_TRUE(follower.WaitDone(absl::Seconds(10))) << "logs -f ends with the job";
  EXPECT_THAT(follower.Lines(), ::testing::ElementsAre("1:first attempt", "2:second attempt"));
  ASSERT_TRUE(watcher.WaitDone(absl::Seconds(10)));
  EXPECT_THAT(watcher.EventTypes(), Contains("restarting"));

  // Workers list shows both, with no busy slot left.
  grpc::ClientContext ctx;
  v1::ListWorkersResponse workers;
  auto wstub = v1::WorkerService::NewStub(channel);
  ASSERT_TRUE(wstub->ListWorkers(&ctx, v1::ListWorkersRequest(), &workers).ok());
  ASSERT_EQ(workers.workers_size(), 2);
  EXPECT_EQ(workers.workers(0).busy_slots_size(), 0);
  w0.Leave();
  w1.Leave();
}

// A worker names only its own address in a rendezvous report (the address
// it registered or connects from): a forged one is refused and logged, no
// rank is sent there, and since the ranks on the other worker could never
// meet, the attempt fails at once as CONFIG naming the worker and the flag
// that fixes it (not when the rendezvous times out).
TEST(CoordinatorE2ETest, ForgedRendezvousAddressIsRefused) {
  std::string dir = TempDir();
  coordinator::CoordinatorServer server(Options(dir));
  absl::StatusOr<std::string> addr = server.Start();
  ASSERT_TRUE(addr.ok());
  auto stub = v1::JobService::NewStub(Net(*addr));
  std::string wt = WorkerToken(server);
  auto wchannel = Net(*addr, "");
  FakeWorker w0(wchannel, "w0", 1, absl::Milliseconds(100), wt),
      w1(wchannel, "w1", 1, absl::Milliseconds(100), wt);
  ASSERT_TRUE(w0.Connect());
  ASSERT_TRUE(w1.Connect());
  std::string id = Submit(stub.get(), Spec(2));
  ASSERT_TRUE(w0.WaitFor(StartOf(1)));
  ASSERT_TRUE(w1.WaitFor(StartOf(1)));
  ::testing::internal::CaptureStderr();
  const absl::Time sent = absl::Now();
  for (auto [store, master] : {std::pair<const char*, const char*>{"6.6.6.6:6666", ""},
                               {"127.0.0.1:1234", "6.6.6.6"},
                               {"[::6]:6666", ""}}) {
    v1::WorkerMessage rdv;
    rdv.mutable_rendezvous()->set_job_id(id);
    rdv.mutable_rendezvous()->set_attempt(1);
    rdv.mutable_rendezvous()->mutable_info()->set_gloo_store_address(store);
    rdv.mutable_rendezvous()->mutable_info()->set_master_addr(master);
    ASSERT_TRUE(w0.Send(rdv));
  }
  v1::Job failed = WaitState(stub.get(), id, v1::JOB_STATE_FAILED);
  const absl::Duration took = absl::Now() - sent;
  // Nothing reached rank 1, and the attempt records no address, while the
  // session stays up (a heartbeat round trip after the reports).
  EXPECT_FALSE(w1.WaitFor(RendezvousOf(1), absl::Milliseconds(300)).has_value());
  const size_t before = w0.received_count();
  ASSERT_TRUE(w0.WaitFor([](const v1::CoordinatorMessage& m) { return m.has_heartbeat_ack(); },
                         absl::Seconds(10), before));
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, HasSubstr("rendezvous_refused"));
  EXPECT_THAT(log, HasSubstr("host '6.6.6.6' is not this worker's address"));
  EXPECT_THAT(log, HasSubstr("master_addr: host '6.6.6.6'"));
  EXPECT_THAT(log, HasSubstr("host '::6'"));
  ASSERT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_FALSE(failed.attempts(0).has_rendezvous())
      << failed.attempts(0).rendezvous().DebugString();
  EXPECT_EQ(failed.attempts(0).failure_kind(), v1::FAILURE_KIND_CONFIG);
  EXPECT_THAT(failed.attempts(0).reason(), HasSubstr("rendezvous refused: worker w0"));
  EXPECT_THAT(failed.attempts(0).reason(), HasSubstr("host '6.6.6.6'"));
  EXPECT_THAT(failed.attempts(0).reason(), HasSubstr("--address"));
  EXPECT_EQ(failed.restarts(), 0) << "CONFIG: a restart cannot help";
  EXPECT_LT(took, absl::Seconds(20)) << "failed at once, not when the rendezvous timed out";
  EXPECT_FALSE(w0.ended().has_value()) << "a refused report does not end the session";
  // The stopped ranks are told to stop.
  EXPECT_TRUE(w1.WaitFor([](const v1::CoordinatorMessage& m) { return m.has_stop_ranks(); },
                         absl::Seconds(10)));
  w0.Leave();
  w1.Leave();
}

TEST(CoordinatorE2ETest, ShutdownAfterManySessionsDropAtOnce) {
  // Sixty workers heartbeating every 5 ms vanish together, then the server
  // shuts down: every session must finish (bench/coordinator once saw one
  // that did not, when its read side ended during a write; this test does
  // not reproduce that race reliably, it checks the outcome).
  std::string dir = TempDir();
  auto server = std::make_unique<coordinator::CoordinatorServer>(Options(dir));
  absl::StatusOr<std::string> addr = server->Start();
  ASSERT_TRUE(addr.ok());
  std::vector<std::unique_ptr<FakeWorker>> workers;
  std::string wt = WorkerToken(*server);
  for (int i = 0; i < 60; ++i) {
    auto channel = Net(*addr, "");
    workers.push_back(
        std::make_unique<FakeWorker>(channel, absl::StrCat("w", i), 1, absl::Milliseconds(5), wt));
    ASSERT_TRUE(workers.back()->Connect());
  }
  absl::SleepFor(absl::Milliseconds(200));
  for (auto& w : workers) w->Crash();
  absl::Notification done;
  std::thread stopper([&] {
    server->Shutdown();
    server.reset();
    done.Notify();
  });
  bool stopped = done.WaitForNotificationWithTimeout(absl::Seconds(20));
  if (!stopped) {
    ADD_FAILURE() << "coordinator shutdown hung";
    stopper.detach();
    return;
  }
  stopper.join();
}

// Starts the real binary; returns it and the address it printed.
std::pair<Subprocess, std::string> StartCoordinator(const std::string& db) {
  // This test binary is build/tests/coordinator_e2e_test.
  char self[4096] = {0};
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  std::string exe(self, n > 0 ? static_cast<size_t>(n) : 0);
  std::string bin = exe.substr(0, exe.rfind("/tests/")) + "/coordinator/trainctl-coordinator";
  int fds[2];
  EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
  SpawnOptions o;
  o.argv = {bin, "--listen=127.0.0.1:0", "--db=" + db};
  o.fds = {{1, fds[1]}};
  absl::StatusOr<Subprocess> coordinator = Subprocess::Spawn(o);
  close(fds[1]);
  EXPECT_TRUE(coordinator.ok()) << coordinator.status();
  FILE* out = fdopen(fds[0], "r");
  char line[256] = {0};
  std::string addr;
  if (fgets(line, sizeof line, out) != nullptr) {
    std::string s(line);
    auto pos = s.rfind(' ');
    addr = s.substr(pos + 1);
    while (!addr.empty() && (addr.back() == '\n' || addr.back() == '\r')) addr.pop_back();
  }
  // Keep reading in the background so the child never blocks on stdout.
  std::thread([out] {
    char buf[256];
    while (fgets(buf, sizeof buf, out) != nullptr) {
    }
    fclose(out);
  }).detach();
  return {coordinator.ok() ? std::move(*coordinator) : Subprocess(), addr};
}

TEST(CoordinatorE2ETest, SigkilledCoordinatorLosesNothing) {
  std::string dir = TempDir();
  auto [coordinator, addr] = StartCoordinator(dir + "/state.db");
  ASSERT_FALSE(addr.empty());
  absl::StatusOr<std::string> admin = auth::ReadTokenFile(dir + "/admin.token");
  ASSERT_TRUE(admin.ok()) << admin.status();
  auto stub = v1::JobService::NewStub(Net(addr, *admin));
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(Submit(stub.get(), Spec(1 + i % 2)));
  grpc::ClientContext cctx;
  v1::CancelJobRequest cancel;
  cancel.set_job_id(ids[0]);
  v1::Job cancelled;
  ASSERT_TRUE(stub->CancelJob(&cctx, cancel, &cancelled).ok());
  coordinator.Signal(SIGKILL);
  coordinator.Wait();

  auto [coordinator2, addr2] = StartCoordinator(dir + "/state.db");
  ASSERT_FALSE(addr2.empty());
  auto stub2 = v1::JobService::NewStub(Net(addr2, *admin));
  grpc::ClientContext lctx;
  v1::ListJobsResponse list;
  ASSERT_TRUE(stub2->ListJobs(&lctx, v1::ListJobsRequest(), &list).ok());
  ASSERT_EQ(list.jobs_size(), 5);
  for (const auto& j : list.jobs()) {
    EXPECT_EQ(j.state(), j.id() == ids[0] ? v1::JOB_STATE_CANCELLED : v1::JOB_STATE_PENDING)
        << j.id();
  }
  // The restarted coordinator schedules what it recovered.
  grpc::ClientContext tctx;
  v1::CreateTokenRequest treq;
  treq.set_role(v1::ROLE_WORKER);
  v1::CreateTokenResponse tresp;
  ASSERT_TRUE(v1::AuthService::NewStub(Net(addr2, *admin))->CreateToken(&tctx, treq, &tresp).ok());
  FakeWorker w(Net(addr2, ""), "w", 2, absl::Milliseconds(100), tresp.secret());
  ASSERT_TRUE(w.Connect());
  ASSERT_TRUE(w.WaitFor(IsStart));
  w.Leave();
  coordinator2.Signal(SIGTERM);
  EXPECT_TRUE(coordinator2.Wait().success()) << "clean exit on SIGTERM";
}

// Sequenced telemetry over the real Session: applied once, acknowledged
// after commit, and deduplicated across a coordinator restart.
TEST(CoordinatorE2ETest, SequencedTelemetryIsAppliedOnceAcrossARestart) {
  std::string dir = TempDir();
  auto server = std::make_unique<coordinator::CoordinatorServer>(Options(dir));
  ASSERT_TRUE(server->Start().ok());
  auto channel = server->InProcessChannel(kAdminToken);
  auto stub = v1::JobService::NewStub(channel);
  const std::string wt = WorkerToken(*server);
  auto w = std::make_unique<FakeWorker>(server->InProcessChannel(""), "w", 1,
                                        absl::Milliseconds(100), wt);
  ASSERT_TRUE(w->Connect());
  std::string id = Submit(stub.get(), Spec(1));
  ASSERT_TRUE(w->WaitFor(IsStart));

  auto log = [&](int64_t seq, const std::string& text) {
    v1::WorkerMessage m;
    m.set_seq(seq);
    v1::LogChunk* c = m.mutable_logs();
    c->set_job_id(id);
    c->set_attempt(1);
    c->set_rank(0);
    c->add_lines()->set_text(text);
    return m;
  };
  auto acked = [](int64_t seq) {
    return [seq](const v1::CoordinatorMessage& m) {
      return m.has_telemetry_ack() && m.telemetry_ack().seq() == seq;
    };
  };
  auto lines = [&](v1::JobService::Stub* s) {
    grpc::ClientContext ctx;
    v1::GetLogsRequest req;
    req.set_job_id(id);
    auto reader = s->GetLogs(&ctx, req);
    std::vector<std::string> out;
    v1::LogChunk c;
    while (reader->Read(&c)) {
      for (const auto& l : c.lines()) out.push_back(l.text());
    }
    EXPECT_TRUE(reader->Finish().ok());
    return out;
  };

  ASSERT_TRUE(w->Send(log(1, "one")));
  ASSERT_TRUE(w->Send(log(2, "two")));
  // A resend of both (as after a reconnect that lost the acks).
  ASSERT_TRUE(w->Send(log(1, "one")));
  ASSERT_TRUE(w->Send(log(2, "two")));
  ASSERT_TRUE(w->Send(log(3, "three")));
  ASSERT_TRUE(w->WaitFor(acked(3)));
  EXPECT_EQ(lines(stub.get()), (std::vector<std::string>{"one", "two", "three"}));

  // The coordinator restarts on the same database: it tells the worker how
  // far it applied, and drops a resend of what it had committed.
  w->Crash();
  w.reset();
  server->Shutdown();
  server = std::make_unique<coordinator::CoordinatorServer>(Options(dir));
  ASSERT_TRUE(server->Start().ok());
  channel = server->InProcessChannel(kAdminToken);
  stub = v1::JobService::NewStub(channel);
  w = std::make_unique<FakeWorker>(server->InProcessChannel(""), "w", 1, absl::Milliseconds(100),
                                   wt);
  v1::RunningRank rr;
  rr.set_job_id(id);
  rr.set_attempt(1);
  rr.set_rank(0);
  ASSERT_TRUE(w->Connect({rr}));
  auto reg = w->WaitFor([](const v1::CoordinatorMessage& m) { return m.has_register_ack(); });
  ASSERT_TRUE(reg.has_value());
  EXPECT_EQ(reg->register_ack().telemetry_acked_seq(), 3);
  ASSERT_TRUE(w->Send(log(3, "three")));
  ASSERT_TRUE(w->Send(log(4, "four")));
  ASSERT_TRUE(w->WaitFor(acked(4)));
  EXPECT_EQ(lines(stub.get()), (std::vector<std::string>{"one", "two", "three", "four"}));
  w->Leave();
}

}  // namespace
// Runs the coordinator binary on `db` (admin token beside it) to its exit;
// returns its wait status and output.
std::pair<int, std::string> RunCoordinatorToExit(const std::string& db) {
  char self[4096] = {0};
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  std::string exe(self, n > 0 ? static_cast<size_t>(n) : 0);
  std::string bin = exe.substr(0, exe.rfind("/tests/")) + "/coordinator/trainctl-coordinator";
  FILE* p = popen((bin + " --listen=127.0.0.1:0 --db=" + db + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
  return {pclose(p), out};
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(CoordinatorE2ETest, EmptyDbFileIsRefusedInsteadOfStartingAnEmptyCluster) {
  std::string dir = TempDir();
  const std::string db = dir + "/empty.db";
  { std::ofstream touch(db); }
  auto [status, out] = RunCoordinatorToExit(db);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status << "\n" << out;
  EXPECT_THAT(out, HasSubstr(db));
  EXPECT_THAT(out, HasSubstr("not a trainctl database (it is empty)"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("listening")));
  std::ifstream in(db, std::ios::binary | std::ios::ate);
  EXPECT_EQ(in.tellg(), 0) << "the file is left as it was";
  EXPECT_FALSE(std::filesystem::exists(dir + "/admin.token"))
      << "a refused start creates no token file";
}

TEST(CoordinatorE2ETest, DamagedDbIsRefusedAtStartAndLeftAsItWas) {
  std::string dir = TempDir();
  const std::string db = dir + "/state.db";
  {
    auto [coordinator, addr] = StartCoordinator(db);
    ASSERT_FALSE(addr.empty());
    absl::StatusOr<std::string> admin = auth::ReadTokenFile(dir + "/admin.token");
    ASSERT_TRUE(admin.ok()) << admin.status();
    auto stub = v1::JobService::NewStub(Net(addr, *admin));
    for (int i = 0; i < 200; ++i) ASSERT_FALSE(Submit(stub.get(), Spec(1)).empty());
    coordinator.Signal(SIGTERM);
    ASSERT_TRUE(coordinator.Wait().success());
  }
  std::filesystem::remove(dir + "/admin.token");
  // 4 KiB of garbage over a page in the middle of the file.
  std::string bytes = FileBytes(db);
  ASSERT_GT(bytes.size(), 8u * 4096) << "the stopped coordinator left its data in the file";
  const size_t page = (bytes.size() / 4096 / 2) * 4096;
  std::mt19937 rng(3);
  for (size_t i = page; i < page + 4096; ++i) bytes[i] = static_cast<char>(rng());
  {
    std::ofstream out(db, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  auto [status, out] = RunCoordinatorToExit(db);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status << "\n" << out;
  EXPECT_THAT(out, HasSubstr("the database is damaged"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("listening")));
  EXPECT_EQ(FileBytes(db), bytes) << "the damaged file is left byte for byte";
  EXPECT_FALSE(std::filesystem::exists(dir + "/admin.token"))
      << "a refused start creates no token file";
}

}  // namespace trainctl
