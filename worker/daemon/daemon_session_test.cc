// The worker daemon's session against a fake coordinator (a real gRPC
// server on a loopback port whose Session handler is scripted here): the
// outbox keeps a report the coordinator never acknowledged across an outage
// and resends it under its seq, a registration lists the running ranks
// and the ends not yet acknowledged, the worker keeps its id, messages are
// handed on, and a goodbye ends the session.
#include "worker/daemon/daemon_session.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/safe_file.h"

namespace trainctl::worker {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// Deadlines are generous: CI machines are loaded. Every wait ends on an event.
constexpr absl::Duration kWait = absl::Seconds(30);

class FakeCoordinator final : public v1::WorkerService::Service {
 public:
  struct Received {
    int session;
    v1::WorkerMessage msg;
  };

  grpc::Status Session(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) override {
    v1::WorkerMessage in;
    if (!stream->Read(&in) || !in.has_register_())
      return {grpc::StatusCode::INVALID_ARGUMENT, "register first"};
    int session;
    int64_t acked;
    {
      absl::MutexLock lock(&mu_);
      session = static_cast<int>(registers_.size()) + 1;
      registers_.push_back(in.register_());
      acked = acked_;
    }
    // A coordinator that is not ready yet (the first try is refused).
    if (session == 1 && refuse_first_)
      return {grpc::StatusCode::UNAVAILABLE, "coordinator starting"};
    v1::CoordinatorMessage ack;
    ack.mutable_register_ack()->set_worker_id("w-1");
    ack.mutable_register_ack()->set_heartbeat_interval_ms(heartbeat_ms_);
    ack.mutable_register_ack()->set_telemetry_acked_seq(acked);
    if (!stream->Write(ack)) return grpc::Status::OK;
    if (session == 1 && send_stop_) {
      v1::CoordinatorMessage stop;
      stop.mutable_stop_ranks()->set_job_id("job-1");
      stop.mutable_stop_ranks()->set_attempt(1);
      stream->Write(stop);
    }
    while (stream->Read(&in)) {
      if (in.has_heartbeat()) {
        absl::MutexLock lock(&mu_);
        ++heartbeats_;
        continue;
      }
      bool cut_off = false;
      {
        absl::MutexLock lock(&mu_);
        received_.push_back({session, in});
        cut_off = session == 1 && drop_first_session_at_checkpoint_ && in.has_checkpoint();
        if (in.has_goodbye()) return grpc::Status::OK;  // as the coordinator: it ends the session
        if (!cut_off && session > 1 && in.seq() > 0) acked_ = std::max(acked_, in.seq());
      }
      // The coordinator goes away before it acknowledged anything.
      if (cut_off) return {grpc::StatusCode::UNAVAILABLE, "coordinator restarting"};
      if (session > 1 && in.seq() > 0) {
        v1::CoordinatorMessage a;
        a.mutable_telemetry_ack()->set_seq(in.seq());
        stream->Write(a);
      }
    }
    return grpc::Status::OK;
  }

  // Waits until `done` holds of what was received; false after kWait.
  bool WaitFor(const std::function<bool(const std::vector<Received>&,
                                        const std::vector<v1::Register>&)>& done) {
    absl::MutexLock lock(&mu_);
    auto cond = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done(received_, registers_); };
    return mu_.AwaitWithTimeout(absl::Condition(&cond), kWait);
  }
  std::vector<Received> received() {
    absl::MutexLock lock(&mu_);
    return received_;
  }
  std::vector<v1::Register> registers() {
    absl::MutexLock lock(&mu_);
    return registers_;
  }

  // Heartbeats come from a thread the session starts once registered.
  bool WaitForHeartbeat(int64_t n = 1) {
    absl::MutexLock lock(&mu_);
    auto cond = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return heartbeats_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&cond), kWait);
  }
  int64_t heartbeats() {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }

  bool drop_first_session_at_checkpoint_ = false;
  bool send_stop_ = false;
  bool refuse_first_ = false;
  int heartbeat_ms_ = 50;

 private:
  absl::Mutex mu_;
  std::vector<v1::Register> registers_ ABSL_GUARDED_BY(mu_);
  std::vector<Received> received_ ABSL_GUARDED_BY(mu_);
  int64_t acked_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
};

class DaemonSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/daemon_session_test.", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void StartCoordinator() {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&fake_);
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    options_.coordinator = absl::StrCat("127.0.0.1:", port);
    options_.hostname = "host-a";
    options_.reconnect_min = absl::Milliseconds(10);
    options_.reconnect_max = absl::Milliseconds(100);
  }
  std::unique_ptr<DaemonSession> NewSession(SessionHooks hooks) {
    return std::make_unique<DaemonSession>(options_, dir_ + "/worker-id", std::move(hooks));
  }
  void TearDown() override {
    if (session_) session_->Stop();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    fs::remove_all(dir_);
  }

  static v1::WorkerMessage RankEnd(int32_t rank, int32_t pid) {
    v1::WorkerMessage m;
    v1::RankStatus* s = AboutRank(m.mutable_rank_status(), "job-1", 1, rank);
    s->set_state(v1::RANK_STATE_SUCCEEDED);
    s->set_pid(pid);
    return m;
  }
  static v1::WorkerMessage Checkpoint() {
    v1::WorkerMessage m;
    v1::CheckpointReport* c = AboutRank(m.mutable_checkpoint(), "job-1", 1, 0);
    c->mutable_record()->set_path("/ck/job-1.ckpt-epoch-000001.pt");
    c->mutable_record()->set_epochs_done(1);
    return m;
  }

  std::string dir_;
  FaultFileEnv fault_env_;  // options_.file_env in tests of a failing disk
  FakeClock clock_;         // options_.clock in tests of the session's waits
  DaemonOptions options_;
  FakeCoordinator fake_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<DaemonSession> session_;
};

TEST_F(DaemonSessionTest, AReportCutOffByACoordinatorOutageIsResentUnderItsSeqAfterTheReconnect) {
  fake_.drop_first_session_at_checkpoint_ = true;
  StartCoordinator();
  SessionHooks hooks;
  hooks.running_ranks = [] {
    v1::RunningRank r;
    AboutRank(&r, "job-1", 1, 0)->set_pid(42);
    return std::vector<v1::RunningRank>{r};
  };
  hooks.on_message = [](const v1::CoordinatorMessage&) {};
  session_ = NewSession(std::move(hooks));
  session_->Start();
  ASSERT_TRUE(fake_.WaitFor([](auto&, auto& regs) { return !regs.empty(); }));
  // Rank 1 ended, then rank 0 wrote a checkpoint: the coordinator goes away
  // on reading the checkpoint, having acknowledged neither.
  session_->Send(RankEnd(1, 43), true);
  session_->Send(Checkpoint(), true);
  ASSERT_TRUE(fake_.WaitFor([](const std::vector<FakeCoordinator::Received>& got, auto& regs) {
    for (const auto& r : got) {
      if (r.session > 1 && r.msg.has_checkpoint()) return true;
    }
    return false;
  })) << "the checkpoint report was not resent";
  session_->AwaitAcknowledged(kWait);

  std::vector<v1::Register> regs = fake_.registers();
  ASSERT_GE(regs.size(), 2u);
  EXPECT_EQ(regs[0].worker_id(), "");
  EXPECT_EQ(regs[0].hostname(), "host-a");
  // The second registration: the id the first was given, rank 0 (running)
  // and rank 1 (its end not acknowledged: running as far as the
  // coordinator knows; the end follows on the stream).
  EXPECT_EQ(regs[1].worker_id(), "w-1");
  std::vector<std::string> running;
  for (const v1::RunningRank& r : regs[1].running())
    running.push_back(absl::StrCat(r.rank(), "@", r.pid()));
  EXPECT_THAT(running, ElementsAre("0@42", "1@43"));

  // Resent in order, under the seqs they were first sent with.
  int64_t end_seq = 0, ck_seq = 0;
  std::vector<std::string> second;
  for (const FakeCoordinator::Received& r : fake_.received()) {
    if (r.session == 1 && r.msg.has_rank_status()) end_seq = r.msg.seq();
    if (r.session == 1 && r.msg.has_checkpoint()) ck_seq = r.msg.seq();
    if (r.session == 2)
      second.push_back(
          absl::StrCat(r.msg.has_checkpoint() ? "checkpoint" : "end", "#", r.msg.seq()));
  }
  ASSERT_GT(end_seq, 0);
  EXPECT_EQ(ck_seq, end_seq + 1);
  EXPECT_THAT(second,
              ElementsAre(absl::StrCat("end#", end_seq), absl::StrCat("checkpoint#", ck_seq)));

  // The id is kept for the next start (0600: the ranks cannot read it).
  std::ifstream in(dir_ + "/worker-id");
  std::string id;
  in >> id;
  EXPECT_EQ(id, "w-1");
  EXPECT_EQ(fs::status(dir_ + "/worker-id").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
}

TEST_F(DaemonSessionTest, AKeptIdIsUsedMessagesAreHandedOnAndAGoodbyeEndsTheSession) {
  std::ofstream(dir_ + "/worker-id") << "w-9\n";
  fake_.send_stop_ = true;
  StartCoordinator();
  absl::Mutex mu;
  std::vector<v1::CoordinatorMessage> handed;
  SessionHooks hooks;
  hooks.running_ranks = [] { return std::vector<v1::RunningRank>{}; };
  hooks.on_message = [&](const v1::CoordinatorMessage& m) {
    absl::MutexLock lock(&mu);
    handed.push_back(m);
  };
  session_ = NewSession(std::move(hooks));
  session_->Start();
  {
    absl::MutexLock lock(&mu);
    auto got = [&] { return !handed.empty(); };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&got), kWait));
    EXPECT_TRUE(handed[0].has_stop_ranks());  // the ack stays with the session
  }
  EXPECT_EQ(fake_.registers()[0].worker_id(), "w-9");
  EXPECT_TRUE(session_->connected());
  EXPECT_EQ(session_->worker_id(), "w-1");
  ::testing::internal::CaptureStderr();
  session_->SayGoodbye("worker shutting down", kWait);
  EXPECT_FALSE(session_->connected());
  std::vector<FakeCoordinator::Received> got = fake_.received();
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.back().msg.goodbye().reason(), "worker shutting down");
  EXPECT_EQ(got.back().msg.seq(), 0);  // not telemetry
  // The end the goodbye asked for: no reconnect, and no warning.
  const absl::Time deadline = absl::Now() + kWait;
  while (!session_->closed() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(session_->closed()) << log;
  EXPECT_THAT(log, HasSubstr("session_closed")) << log;
  EXPECT_THAT(log, Not(HasSubstr("session_ended"))) << log;
  EXPECT_EQ(fake_.registers().size(), 1u);
}

TEST_F(DaemonSessionTest, AnIdThatCannotBeKeptIsSaidAndTheSessionGoesOn) {
  // The disk is full when the registration's id is written (the file
  // seam, common/file_env.h, at the write).
  fault_env_.Inject({FileOp::kWrite, fs::canonical(dir_).string() + "/worker-id", ENOSPC});
  options_.file_env = &fault_env_;
  StartCoordinator();
  SessionHooks hooks;
  hooks.running_ranks = [] { return std::vector<v1::RunningRank>{}; };
  hooks.on_message = [](const v1::CoordinatorMessage&) {};
  session_ = NewSession(std::move(hooks));
  ::testing::internal::CaptureStderr();
  session_->Start();
  const bool beat = fake_.WaitForHeartbeat();  // the id was written (or not) before the first
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(beat);
  EXPECT_THAT(log, ::testing::HasSubstr("worker_id_not_saved"));
  EXPECT_THAT(log, ::testing::HasSubstr("worker_id=w-1"));
  EXPECT_FALSE(fs::exists(dir_ + "/worker-id"));
  // Nothing half written is left beside it either.
  for (const auto& e : fs::directory_iterator(dir_)) ADD_FAILURE() << "left behind: " << e.path();
  EXPECT_TRUE(session_->connected());
  EXPECT_EQ(session_->worker_id(), "w-1");
  session_->Send(Checkpoint(), true);
  EXPECT_TRUE(fake_.WaitFor(
      [](const std::vector<FakeCoordinator::Received>& got, auto&) { return !got.empty(); }));
}

// The session's waits run on the daemon's clock (DaemonOptions::clock):
// with a FakeClock, heartbeats an hour apart and an acknowledgement wait of
// an hour end when the clock is advanced, not when real time passes (the
// test would time out long before an hour). Each step first waits until
// the waiters are inside their waits (FakeClock::AwaitWaiters), so their
// deadlines are taken before the clock moves.
TEST_F(DaemonSessionTest, HeartbeatsAndTheAcknowledgementWaitRunOnTheInjectedClock) {
  options_.clock = &clock_;
  fake_.heartbeat_ms_ = 3600 * 1000;
  StartCoordinator();
  SessionHooks hooks;
  hooks.running_ranks = [] { return std::vector<v1::RunningRank>{}; };
  hooks.on_message = [](const v1::CoordinatorMessage&) {};
  session_ = NewSession(std::move(hooks));
  session_->Start();
  ASSERT_TRUE(fake_.WaitForHeartbeat(1));
  // Only the heartbeat thread waits on the clock now (the session thread
  // reads the stream): the next beat is due an hour of fake time from now.
  ASSERT_TRUE(clock_.AwaitWaiters(1, kWait));
  EXPECT_EQ(fake_.heartbeats(), 1);
  clock_.Advance(absl::Hours(1));
  ASSERT_TRUE(fake_.WaitForHeartbeat(2)) << "advancing the clock did not send the next heartbeat";

  // The first session's coordinator acknowledges nothing: AwaitAcknowledged
  // waits its whole timeout, an hour of the fake clock.
  session_->Send(Checkpoint(), true);
  ASSERT_TRUE(fake_.WaitFor(
      [](const std::vector<FakeCoordinator::Received>& got, auto&) { return !got.empty(); }));
  absl::Notification returned;
  std::thread waiter([&] {
    session_->AwaitAcknowledged(absl::Hours(1));
    returned.Notify();
  });
  ASSERT_TRUE(clock_.AwaitWaiters(2, kWait));  // the heartbeat thread and the waiter
  EXPECT_FALSE(returned.HasBeenNotified());
  clock_.Advance(absl::Hours(1));
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(kWait))
      << "the acknowledgement wait ignored the clock";
  waiter.join();
  EXPECT_TRUE(session_->connected());
  EXPECT_TRUE(fake_.WaitForHeartbeat(3));
}

// The reconnect backoff, too: a refused first try is retried when the fake
// clock has moved past the backoff (at least half of reconnect_min, an
// hour), and not before.
TEST_F(DaemonSessionTest, TheReconnectBackoffRunsOnTheInjectedClock) {
  options_.clock = &clock_;
  fake_.refuse_first_ = true;
  StartCoordinator();
  options_.reconnect_min = absl::Hours(1);
  options_.reconnect_max = absl::Hours(1);
  SessionHooks hooks;
  hooks.running_ranks = [] { return std::vector<v1::RunningRank>{}; };
  hooks.on_message = [](const v1::CoordinatorMessage&) {};
  session_ = NewSession(std::move(hooks));
  ::testing::internal::CaptureStderr();
  session_->Start();
  ASSERT_TRUE(fake_.WaitFor([](auto&, auto& regs) { return regs.size() == 1; }));
  // Never registered: no heartbeat thread; the one waiter is the backoff.
  const bool waiting = clock_.AwaitWaiters(1, kWait);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(waiting) << log;
  EXPECT_THAT(log, HasSubstr("coordinator_unreachable")) << log;
  EXPECT_EQ(fake_.registers().size(), 1u);
  EXPECT_FALSE(session_->connected());
  clock_.Advance(absl::Hours(1));
  EXPECT_TRUE(fake_.WaitFor([](auto&, auto& regs) { return regs.size() == 2; }))
      << "no retry after the backoff";
  EXPECT_TRUE(fake_.WaitForHeartbeat(1));
}

}  // namespace
}  // namespace trainctl::worker
