// The worker-session protocol (WorkerSession) over a fake transport that
// records what the coordinator answers, with the real owners it talks to:
// a SQLite store in a temporary directory, the registry, the job manager,
// the telemetry ledger and batcher, tokens and live calls, and a fake
// clock. The test thread plays the loop (the EventLoop is stopped), as the
// job manager's tests do.
#include "coordinator/api/worker_session.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/jobs/job_manager_fixture.h"

namespace trainctl::coordinator {
namespace {

// Records what the session sends and how it closed the stream (the first
// Close decides, as in SessionReactor).
class FakeTransport final : public SessionTransport {
 public:
  bool Send(const v1::CoordinatorMessage& msg) override {
    if (closed) return false;
    sent.push_back(msg);
    return true;
  }
  void Close(const absl::Status& s) override {
    if (closed) return;
    closed = true;
    status = s;
  }
  bool Unhandled() const override { return false; }

  std::vector<v1::RegisterAck> RegisterAcks() const {
    std::vector<v1::RegisterAck> out;
    for (const auto& m : sent)
      if (m.has_register_ack()) out.push_back(m.register_ack());
    return out;
  }
  std::vector<int64_t> HeartbeatAcks() const {
    std::vector<int64_t> out;
    for (const auto& m : sent)
      if (m.has_heartbeat_ack()) out.push_back(m.heartbeat_ack().seq());
    return out;
  }
  std::vector<int64_t> TelemetryAcks() const {
    std::vector<int64_t> out;
    for (const auto& m : sent)
      if (m.has_telemetry_ack()) out.push_back(m.telemetry_ack().seq());
    return out;
  }
  int StartRanks() const {
    int n = 0;
    for (const auto& m : sent) n += m.has_start_ranks();
    return n;
  }

  std::vector<v1::CoordinatorMessage> sent;
  bool closed = false;
  absl::Status status;
};

// One open stream: its transport and the session over it.
struct Stream {
  FakeTransport transport;
  std::unique_ptr<WorkerSession> session;
};

v1::WorkerMessage RegisterMsg(const std::string& id, const std::string& address = "") {
  v1::WorkerMessage m;
  v1::Register* reg = m.mutable_register_();
  reg->set_worker_id(id);
  reg->set_hostname("host-" + id);
  reg->set_address(address);
  reg->add_slots()->set_kind(v1::Slot::KIND_CPU);
  return m;
}

v1::WorkerMessage HeartbeatMsg(int64_t seq) {
  v1::WorkerMessage m;
  m.mutable_heartbeat()->set_seq(seq);
  return m;
}

v1::WorkerMessage RunningMsg(const std::string& job, int64_t seq) {
  v1::WorkerMessage m;
  m.set_seq(seq);
  v1::RankStatus* st = m.mutable_rank_status();
  st->set_job_id(job);
  st->set_attempt(1);
  st->set_rank(0);
  st->set_state(v1::RANK_STATE_RUNNING);
  return m;
}

// Rank 0's point: a train window at `step`, or the end of epoch 0 (an
// event, so not batched).
v1::WorkerMessage MetricsMsg(const std::string& job, int64_t seq, int64_t step,
                             v1::MetricPoint::Kind kind = v1::MetricPoint::KIND_TRAIN) {
  v1::WorkerMessage m;
  m.set_seq(seq);
  v1::MetricBatch* b = m.mutable_metrics();
  b->set_job_id(job);
  b->set_attempt(1);
  v1::MetricPoint* p = b->add_points();
  p->set_rank(0);
  p->set_kind(kind);
  p->set_step(step);
  p->set_steps_per_epoch(100);
  p->set_loss(0.5);
  return m;
}

v1::WorkerMessage ProgressMsg(const std::string& job, int64_t seq, int64_t step) {
  v1::WorkerMessage m;
  m.set_seq(seq);
  v1::RankProgress* p = m.mutable_progress();
  p->set_job_id(job);
  p->set_attempt(1);
  p->set_rank(0);
  p->set_step(step);
  return m;
}

v1::WorkerMessage LogsMsg(const std::string& job, int64_t seq, const std::string& text) {
  v1::WorkerMessage m;
  m.set_seq(seq);
  v1::LogChunk* c = m.mutable_logs();
  c->set_job_id(job);
  c->set_attempt(1);
  c->set_rank(0);
  v1::LogLine* l = c->add_lines();
  l->set_rank(0);
  l->set_stream(v1::LogLine::STREAM_STDOUT);
  l->set_text(text);
  return m;
}

class WorkerSessionTest : public JobManagerTest {
 protected:
  void SetUp() override {
    JobManagerTest::SetUp();
    // The test thread is the loop: with the loop's own thread gone, its
    // checks pass here and what is posted is dropped (the test drains the
    // batcher itself).
    loop_.StopAndJoin();
    ledger_ = std::make_unique<TelemetryLedger>(store_.get(), &owners_->book);
    auth_ = std::make_unique<TokenAuthority>(store_.get(), &clock_);
    ASSERT_TRUE(auth_->Load().ok());
    live_ = std::make_unique<LiveCalls>(auth_.get());
    ctx_.loop = &loop_;
    ctx_.store = store_.get();
    ctx_.registry = registry_.get();
    ctx_.SetJobOwners(owners_.get());
    ctx_.hub = &hub_;
    ctx_.telemetry = ledger_.get();
    ctx_.auth = auth_.get();
    ctx_.live = live_.get();
    batcher_ = std::make_unique<TelemetryBatcher>(ctx_);
    ctx_.batcher = batcher_.get();
  }
  void TearDown() override {
    streams_.clear();
    batcher_.reset();
    live_.reset();
    auth_.reset();
    ledger_.reset();
    JobManagerTest::TearDown();
  }

  // A worker token's principal (ROLE_WORKER), as Authenticate gives it.
  Principal WorkerToken(const std::string& name, std::string* token_id = nullptr) {
    v1::CreateTokenRequest req;
    req.set_name(name);
    req.set_role(v1::ROLE_WORKER);
    absl::StatusOr<v1::CreateTokenResponse> made = auth_->Create(req, Principal{});
    EXPECT_TRUE(made.ok()) << made.status();
    if (token_id != nullptr) *token_id = made->token().id();
    absl::StatusOr<Principal> who = auth_->Authenticate("Bearer " + made->secret());
    EXPECT_TRUE(who.ok()) << who.status();
    return *who;
  }
  // A certificate worker's credentials (CN `id`).
  static WorkerCaller Cert(const std::string& id) {
    WorkerCaller c;
    c.who.token_id = TokenAuthority::CertBinding(id);
    c.who.role = v1::ROLE_WORKER;
    c.cert_id = id;
    c.cert_serial = "0a1b";
    return c;
  }
  static WorkerCaller Token(Principal who) {
    WorkerCaller c;
    c.who = std::move(who);
    return c;
  }

  // A session opened by `caller` from `peer` (an in-process one by default).
  Stream& Connect(WorkerCaller caller, const std::string& peer = "inproc") {
    auto s = std::make_unique<Stream>();
    s->session = std::make_unique<WorkerSession>(ctx_, &s->transport, peer, std::move(caller));
    s->session->Open();
    streams_.push_back(std::move(s));
    return *streams_.back();
  }
  // A token worker `id`, registered.
  Stream& Registered(const std::string& id) {
    tokens_[id] = WorkerToken(id + "-token");
    Stream& s = Connect(Token(tokens_[id]));
    s.session->Handle(RegisterMsg(id));
    EXPECT_EQ(s.transport.RegisterAcks().size(), 1u) << s.transport.status;
    return s;
  }
  // A 1-rank job placed on worker `worker` (its session `s`), RUNNING.
  std::string RunningOn(Stream& s) {
    absl::StatusOr<v1::Job> job = jobs_->Submit(Spec(1));
    EXPECT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(s.transport.StartRanks(), 1);
    s.session->Handle(RunningMsg(job->id(), 1));
    EXPECT_EQ(Get(job->id()).state(), v1::JOB_STATE_RUNNING);
    return job->id();
  }
  std::vector<std::string> StoredLines(const std::string& job) {
    absl::StatusOr<std::vector<v1::LogLine>> lines =
        store_->telemetry().ListLogs(job, 1, std::nullopt, 0);
    EXPECT_TRUE(lines.ok()) << lines.status();
    std::vector<std::string> out;
    if (lines.ok())
      for (const v1::LogLine& l : *lines) out.push_back(l.text());
    return out;
  }

  EventLoop loop_;  // stopped: the test thread is the loop
  std::unique_ptr<TelemetryLedger> ledger_;
  std::unique_ptr<TokenAuthority> auth_;
  std::unique_ptr<LiveCalls> live_;
  std::unique_ptr<TelemetryBatcher> batcher_;
  ServiceContext ctx_{};
  std::vector<std::unique_ptr<Stream>> streams_;
  std::map<std::string, Principal> tokens_;  // Registered's, by worker id
};

TEST_F(WorkerSessionTest, ARegisterIsAckedAndHeartbeatsAreAnswered) {
  Stream& s = Registered("w1");
  const v1::RegisterAck ack = s.transport.RegisterAcks().at(0);
  EXPECT_EQ(ack.worker_id(), "w1");
  EXPECT_EQ(ack.heartbeat_interval_ms(),
            absl::ToInt64Milliseconds(registry_->options().heartbeat_interval));
  EXPECT_EQ(ack.lease_timeout_ms(), 3000);
  EXPECT_EQ(ack.telemetry_acked_seq(), 0);
  EXPECT_EQ(ack.address_refused(), "");
  EXPECT_EQ(s.session->worker_id(), "w1");
  EXPECT_TRUE(registry_->Connected("w1"));
  EXPECT_TRUE(registry_->OwnsSession("w1", s.session.get()));
  // The id is bound to the token that registered it.
  EXPECT_TRUE(auth_->WorkerBound("w1"));

  s.session->Handle(HeartbeatMsg(7));
  s.session->Handle(HeartbeatMsg(8));
  EXPECT_THAT(s.transport.HeartbeatAcks(), ElementsAre(7, 8));
  EXPECT_FALSE(s.transport.closed) << s.transport.status;

  // A second register on the same session is refused.
  s.session->Handle(RegisterMsg("w1"));
  EXPECT_EQ(s.transport.status.code(), absl::StatusCode::kFailedPrecondition) << s.transport.status;
}

// The fleet's heartbeats a second bounded at 1: each registration past the
// first lengthens the terms, and a worker registered earlier learns them from
// its next heartbeat's answer (then only once).
class WorkerSessionTermsTest : public WorkerSessionTest {
 protected:
  void SetUp() override {
    max_heartbeats_per_sec_ = 1;
    WorkerSessionTest::SetUp();
  }
};

TEST_F(WorkerSessionTermsTest, AGrownFleetsTermsReachEarlierWorkersInTheirHeartbeatAcks) {
  Stream& w1 = Registered("w1");
  EXPECT_EQ(w1.transport.RegisterAcks().at(0).heartbeat_interval_ms(), 1000);
  EXPECT_EQ(w1.transport.RegisterAcks().at(0).lease_timeout_ms(), 3000);
  Stream& w2 = Registered("w2");
  EXPECT_EQ(w2.transport.RegisterAcks().at(0).heartbeat_interval_ms(), 2000);
  EXPECT_EQ(w2.transport.RegisterAcks().at(0).lease_timeout_ms(), 6000);

  w1.session->Handle(HeartbeatMsg(1));
  w1.session->Handle(HeartbeatMsg(2));
  w2.session->Handle(HeartbeatMsg(1));
  std::vector<v1::HeartbeatAck> acks;
  for (const auto& m : w1.transport.sent)
    if (m.has_heartbeat_ack()) acks.push_back(m.heartbeat_ack());
  ASSERT_EQ(acks.size(), 2u);
  EXPECT_EQ(acks[0].heartbeat_interval_ms(), 2000);
  EXPECT_EQ(acks[0].lease_timeout_ms(), 6000);
  EXPECT_EQ(acks[1].heartbeat_interval_ms(), 0);  // unchanged since
  for (const auto& m : w2.transport.sent) {
    if (m.has_heartbeat_ack()) {
      EXPECT_EQ(m.heartbeat_ack().heartbeat_interval_ms(), 0);
    }
  }
}

TEST_F(WorkerSessionTest, AnotherTokensWorkerIdIsRefused) {
  Registered("w1");
  Stream& thief = Connect(Token(WorkerToken("other")));
  thief.session->Handle(RegisterMsg("w1"));
  EXPECT_EQ(thief.transport.status.code(), absl::StatusCode::kPermissionDenied)
      << thief.transport.status;
  EXPECT_TRUE(thief.transport.RegisterAcks().empty());
  EXPECT_EQ(thief.session->worker_id(), "");
}

TEST_F(WorkerSessionTest, ACertificateWorkerRegistersOnlyAsItsCertificatesId) {
  Stream& wrong = Connect(Cert("c1"));
  wrong.session->Handle(RegisterMsg("someone-else"));
  EXPECT_EQ(wrong.transport.status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(wrong.transport.status.message()),
              HasSubstr("certificate is for 'c1'; it may not register as 'someone-else'"));
  EXPECT_EQ(registry_->Find("someone-else"), nullptr);

  // No id (or its own): it is the certificate's.
  Stream& right = Connect(Cert("c1"));
  right.session->Handle(RegisterMsg(""));
  ASSERT_EQ(right.transport.RegisterAcks().size(), 1u) << right.transport.status;
  EXPECT_EQ(right.transport.RegisterAcks()[0].worker_id(), "c1");
  EXPECT_TRUE(registry_->Connected("c1"));
}

TEST_F(WorkerSessionTest, AnAddressThatIsNotTheWorkersIsRefusedAtRegistration) {
  // From 10.1.2.3, a token vouching for no address, registering 6.6.6.6:
  // registered, with the reason its address is refused.
  Stream& s = Connect(Token(WorkerToken("w1-token")), "ipv4:10.1.2.3:5555");
  s.session->Handle(RegisterMsg("w1", "6.6.6.6"));
  ASSERT_EQ(s.transport.RegisterAcks().size(), 1u) << s.transport.status;
  EXPECT_NE(s.transport.RegisterAcks()[0].address_refused(), "");
  EXPECT_EQ(registry_->Find("w1")->address_refused(),
            s.transport.RegisterAcks()[0].address_refused());

  // Its session's own address is accepted.
  Stream& t = Connect(Token(WorkerToken("w2-token")), "ipv4:10.1.2.4:5555");
  t.session->Handle(RegisterMsg("w2", "10.1.2.4"));
  ASSERT_EQ(t.transport.RegisterAcks().size(), 1u) << t.transport.status;
  EXPECT_EQ(t.transport.RegisterAcks()[0].address_refused(), "");
}

TEST_F(WorkerSessionTest, AFirstMessageThatIsNotARegisterIsInvalidArgument) {
  for (const v1::WorkerMessage& first :
       {HeartbeatMsg(1), v1::WorkerMessage(), RunningMsg("j", 1)}) {
    Stream& s = Connect(Token(WorkerToken(absl::StrCat("t", streams_.size()))));
    s.session->Handle(first);
    EXPECT_EQ(s.transport.status.code(), absl::StatusCode::kInvalidArgument)
        << first.ShortDebugString();
    EXPECT_THAT(std::string(s.transport.status.message()),
                HasSubstr("first message of a session must be register"));
    EXPECT_TRUE(s.transport.sent.empty());
    // The worker's side ends after it: the verdict stands.
    s.session->ReadsEnded();
    EXPECT_EQ(s.transport.status.code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST_F(WorkerSessionTest, AStreamThatEndsBeforeAnyMessageIsInvalidArgument) {
  // No message read: the stream ended, or its first message did not parse.
  Stream& s = Connect(Token(WorkerToken("t")));
  s.session->ReadsEnded();
  EXPECT_EQ(s.transport.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.transport.status, WorkerSession::NoRegisterRead());
  EXPECT_THAT(std::string(s.transport.status.message()), HasSubstr("no register message was read"));

  // A registered worker's end is OK, and its worker waits for a reconnect.
  Stream& w = Registered("w1");
  w.session->ReadsEnded();
  EXPECT_TRUE(w.transport.status.ok()) << w.transport.status;
  EXPECT_FALSE(registry_->Connected("w1"));
  EXPECT_EQ(registry_->Find("w1")->state(), v1::WORKER_STATE_ALIVE);
}

TEST_F(WorkerSessionTest, AGoodbyeLeaves) {
  Stream& s = Registered("w1");
  v1::WorkerMessage bye;
  bye.mutable_goodbye()->set_reason("stopping");
  s.session->Handle(bye);
  EXPECT_TRUE(s.transport.closed);
  EXPECT_TRUE(s.transport.status.ok()) << s.transport.status;
  EXPECT_EQ(registry_->Find("w1")->state(), v1::WORKER_STATE_LEFT);
}

TEST_F(WorkerSessionTest, ACertificateRevokedMidSessionEndsItAndExpelsTheWorker) {
  Stream& s = Connect(Cert("c1"));
  s.session->Handle(RegisterMsg("c1"));
  ASSERT_EQ(s.transport.RegisterAcks().size(), 1u) << s.transport.status;
  s.session->Handle(HeartbeatMsg(1));
  ASSERT_THAT(s.transport.HeartbeatAcks(), ElementsAre(1));

  ASSERT_TRUE(auth_->RevokeWorkerCert("c1").ok());
  // The next message finds it revoked: PERMISSION_DENIED, no answer, the
  // worker LOST at once (not after its lease).
  s.session->Handle(HeartbeatMsg(2));
  EXPECT_EQ(s.transport.status.code(), absl::StatusCode::kPermissionDenied) << s.transport.status;
  EXPECT_THAT(s.transport.HeartbeatAcks(), ElementsAre(1));
  EXPECT_EQ(registry_->Find("c1")->state(), v1::WORKER_STATE_LOST);

  // It does not come back on a new session either.
  Stream& again = Connect(Cert("c1"));
  again.session->Handle(RegisterMsg("c1"));
  EXPECT_EQ(again.transport.status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(again.transport.RegisterAcks().empty());
}

TEST_F(WorkerSessionTest, ARevokedTokenEndsTheSessionAtOnceAndLaterMessagesAreDropped) {
  std::string token_id;
  Stream& s = Connect(Token(WorkerToken("w1-token", &token_id)));
  s.session->Handle(RegisterMsg("w1"));
  ASSERT_EQ(s.transport.RegisterAcks().size(), 1u) << s.transport.status;
  EXPECT_EQ(live_->size(), 1u);

  ASSERT_TRUE(auth_->Revoke(token_id).ok());
  EXPECT_EQ(live_->Sweep(), 1);
  EXPECT_EQ(s.transport.status.code(), absl::StatusCode::kUnauthenticated) << s.transport.status;
  EXPECT_EQ(live_->size(), 0u);

  const size_t sent = s.transport.sent.size();
  s.session->Handle(HeartbeatMsg(1));
  EXPECT_EQ(s.transport.sent.size(), sent);
  s.session->Done();
  EXPECT_FALSE(registry_->Connected("w1"));
}

TEST_F(WorkerSessionTest, SequencedReportsAreAckedAfterTheirCommitAndResendsAreAckedAgain) {
  Stream& s = Registered("w1");
  const std::string job = RunningOn(s);  // rank status seq 1
  EXPECT_THAT(s.transport.TelemetryAcks(), ElementsAre(1));
  // A resend of seq 1 is a duplicate: not applied again, acknowledged again.
  s.session->Handle(RunningMsg(job, 1));
  EXPECT_THAT(s.transport.TelemetryAcks(), ElementsAre(1, 1));
  // Batched logs: acknowledged when the group commits (the batcher's drain).
  s.session->Handle(LogsMsg(job, 2, "epoch 1"));
  EXPECT_THAT(s.transport.TelemetryAcks(), ElementsAre(1, 1));
  batcher_->Drain();
  EXPECT_THAT(s.transport.TelemetryAcks(), ElementsAre(1, 1, 2));
  EXPECT_THAT(StoredLines(job), ElementsAre("epoch 1"));

  // A reconnect (with the same token) learns how far it got.
  s.session->ReadsEnded();
  s.session->Done();
  Stream& back = Connect(Token(tokens_.at("w1")));
  back.session->Handle(RegisterMsg("w1"));
  ASSERT_EQ(back.transport.RegisterAcks().size(), 1u) << back.transport.status;
  EXPECT_EQ(back.transport.RegisterAcks()[0].telemetry_acked_seq(), 2);
}

TEST_F(WorkerSessionTest, TelemetryAStoreFailureKeptOutIsHeldAndRetriedWithBackoff) {
  Stream& s = Registered("w1");
  const std::string job = RunningOn(s);
  int writes_refused = 0;
  store_->SetWriteFaultForTest([&](int64_t, absl::string_view) {
    ++writes_refused;
    return true;
  });
  s.session->Handle(LogsMsg(job, 2, "a"));
  batcher_->Drain();
  EXPECT_EQ(s.session->held(), 1u);
  EXPECT_GT(writes_refused, 0);
  // A later sequenced message waits behind it, unapplied and unacknowledged.
  s.session->Handle(LogsMsg(job, 3, "b"));
  EXPECT_EQ(s.session->held(), 2u);
  EXPECT_THAT(s.transport.TelemetryAcks(), ElementsAre(1));
  EXPECT_FALSE(s.transport.closed) << s.transport.status;

  // Heartbeats go on; the first retry waits kFirstRetry.
  const int before = writes_refused;
  s.session->Handle(HeartbeatMsg(1));
  EXPECT_THAT(s.transport.HeartbeatAcks(), ElementsAre(1));
  EXPECT_EQ(writes_refused, before);
  clock_.Advance(WorkerSession::kFirstRetry);
  s.session->Handle(HeartbeatMsg(2));
  EXPECT_GT(writes_refused, before) << "retried once the backoff passed";
  EXPECT_EQ(s.session->held(), 2u);

  // Failed again: the wait doubles.
  const int after_retry = writes_refused;
  store_->SetWriteFaultForTest(nullptr);
  clock_.Advance(WorkerSession::kFirstRetry);
  s.session->Handle(HeartbeatMsg(3));
  EXPECT_EQ(s.session->held(), 2u) << "not retried before twice kFirstRetry";
  EXPECT_EQ(writes_refused, after_retry);
  clock_.Advance(WorkerSession::kFirstRetry);
  s.session->Handle(HeartbeatMsg(4));
  EXPECT_EQ(s.session->held(), 0u);
  EXPECT_THAT(s.transport.HeartbeatAcks(), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(s.transport.TelemetryAcks(), ElementsAre(1, 3));
  EXPECT_THAT(StoredLines(job), ElementsAre("a", "b"));
  EXPECT_FALSE(s.transport.closed) << s.transport.status;
}

// The group commit runs off the loop (TelemetryBatcher): a group in the
// writer is neither acknowledged, nor counted as applied, nor folded into
// the job until its commit is heard on the loop; what arrives meanwhile is
// the next group, acknowledged after it, in order.
TEST_F(WorkerSessionTest, TelemetryIsAckedAppliedAndFoldedOnlyAfterItsGroupCommits) {
  Stream& s = Registered("w1");
  const std::string job = RunningOn(s);  // rank status seq 1
  s.session->Handle(LogsMsg(job, 2, "a"));
  s.session->Handle(MetricsMsg(job, 3, 42));
  batcher_->SendQueued();  // the loop turn's group, to the writer
  s.session->Handle(LogsMsg(job, 4, "b"));
  EXPECT_THAT(s.transport.TelemetryAcks(), ElementsAre(1));
  EXPECT_EQ(ledger_->Applied("w1"), 1);
  EXPECT_NE(Get(job).progress().step(), 42);

  batcher_->Drain();
  EXPECT_THAT(s.transport.TelemetryAcks(), ElementsAre(1, 3, 4));
  EXPECT_EQ(ledger_->Applied("w1"), 4);
  EXPECT_EQ(Get(job).progress().step(), 42);
  EXPECT_THAT(StoredLines(job), ElementsAre("a", "b"));
  absl::StatusOr<std::vector<v1::MetricPoint>> points = store_->telemetry().ListMetrics(job, 0);
  ASSERT_TRUE(points.ok()) << points.status();
  ASSERT_EQ(points->size(), 1u);
  EXPECT_EQ((*points)[0].step(), 42);

  // A resend of what was committed is a duplicate: acknowledged, not stored again.
  s.session->Handle(LogsMsg(job, 4, "b"));
  batcher_->Drain();
  EXPECT_THAT(s.transport.TelemetryAcks(), ElementsAre(1, 3, 4, 4));
  EXPECT_THAT(StoredLines(job), ElementsAre("a", "b"));
}

// Records the metric points the hub publishes to a watcher of the job.
class PointRecorder final : public JobSubscriber {
 public:
  void Offer(const v1::JobUpdate& u) override {
    for (const v1::MetricPoint& p : u.metrics().points()) steps.push_back(p.step());
  }
  void JobEnded() override {}
  std::vector<int64_t> steps;
};

// A group is committed on the writer's thread and published on the loop
// after. A stream that reads the store and then subscribes (WatchJob's
// history, GetLogs' backlog) does so inside ReadPublished: the group being
// written is committed and published first, and what is queued goes to
// the writer only after the read, so each point reaches the stream once,
// from the store or from the hub.
TEST_F(WorkerSessionTest, AReadOfTheStoreWaitsUntilEveryCommittedPointIsPublished) {
  Stream& s = Registered("w1");
  const std::string job = RunningOn(s);
  PointRecorder before;  // subscribed all along
  hub_.Subscribe(job, &before);
  s.session->Handle(MetricsMsg(job, 2, 10));
  batcher_->SendQueued();                     // step 10's group, to the writer
  s.session->Handle(MetricsMsg(job, 3, 20));  // queued behind it

  // The window: step 10 committed (the writer's thread), not yet published
  // (its done runs on the loop, which is this thread).
  auto stored_steps = [&] {
    std::vector<int64_t> steps;
    absl::StatusOr<std::vector<v1::MetricPoint>> points = store_->telemetry().ListMetrics(job, 0);
    EXPECT_TRUE(points.ok()) << points.status();
    if (points.ok())
      for (const v1::MetricPoint& p : *points) steps.push_back(p.step());
    return steps;
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (stored_steps().empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_THAT(stored_steps(), ElementsAre(10));
  EXPECT_TRUE(before.steps.empty());

  PointRecorder watcher;
  std::vector<int64_t> history;
  batcher_->ReadPublished([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    EXPECT_THAT(before.steps, ElementsAre(10));  // published before the read
    history = stored_steps();
    hub_.Subscribe(job, &watcher);
  });
  EXPECT_THAT(history, ElementsAre(10));  // step 20 was not sent to the writer yet

  batcher_->Drain();
  EXPECT_THAT(watcher.steps, ElementsAre(20));  // only what the history did not have
  EXPECT_THAT(before.steps, ElementsAre(10, 20));
  EXPECT_THAT(s.transport.TelemetryAcks(), ElementsAre(1, 2, 3));
  hub_.Unsubscribe(job, &watcher);
  hub_.Unsubscribe(job, &before);
}

// A commit that fails applies nothing -- no seq advances, so the resend is
// not taken for a duplicate -- and the session gets back the failed group
// with what it queued after it (a later message never commits before an
// earlier one), holds them and applies them in order once the store is back.
TEST_F(WorkerSessionTest, AFailedGroupHandsBackItsMessagesAndThoseQueuedAfterThem) {
  Stream& s = Registered("w1");
  const std::string job = RunningOn(s);
  store_->SetWriteFaultForTest(
      [](int64_t, absl::string_view op) { return absl::StartsWith(op, "CommitGroup"); });
  s.session->Handle(LogsMsg(job, 2, "a"));
  batcher_->SendQueued();
  s.session->Handle(LogsMsg(job, 3, "b"));
  batcher_->Drain();
  EXPECT_EQ(s.session->held(), 2u);
  EXPECT_THAT(s.transport.TelemetryAcks(), ElementsAre(1));
  EXPECT_EQ(ledger_->Applied("w1"), 1);
  EXPECT_TRUE(StoredLines(job).empty());
  EXPECT_FALSE(s.transport.closed) << s.transport.status;

  store_->SetWriteFaultForTest(nullptr);
  clock_.Advance(WorkerSession::kFirstRetry);
  s.session->Handle(HeartbeatMsg(1));
  EXPECT_EQ(s.session->held(), 0u);
  EXPECT_THAT(s.transport.TelemetryAcks(), ElementsAre(1, 3));
  EXPECT_THAT(StoredLines(job), ElementsAre("a", "b"));
}

// A report that does not go through the batcher -- here rank 0's epoch end,
// whose event is a job commit in one transaction with its point -- waits
// for the worker's queued telemetry: applied and acknowledged in the order
// sent. So does the end of its stream.
TEST_F(WorkerSessionTest, AReportThatIsNotBatchedWaitsForTheWorkersQueuedTelemetry) {
  Stream& s = Registered("w1");
  const std::string job = RunningOn(s);
  s.session->Handle(LogsMsg(job, 2, "a"));
  s.session->Handle(MetricsMsg(job, 3, 99, v1::MetricPoint::KIND_EPOCH_END));
  EXPECT_THAT(s.transport.TelemetryAcks(), ElementsAre(1, 2, 3));
  EXPECT_THAT(StoredLines(job), ElementsAre("a"));
  absl::StatusOr<std::vector<v1::Event>> events = store_->jobs().ListEvents(job, 0, 100);
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_TRUE(std::any_of(events->begin(), events->end(),
                          [](const v1::Event& e) { return e.type() == "epoch_end"; }));

  // Queued, then the stream ends: what the worker sent is applied first, and
  // its reconnect's RegisterAck counts it.
  s.session->Handle(LogsMsg(job, 4, "b"));
  s.session->ReadsEnded();
  EXPECT_THAT(s.transport.TelemetryAcks(), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(StoredLines(job), ElementsAre("a", "b"));
  s.session->Done();
  Stream& back = Connect(Token(tokens_.at("w1")));
  back.session->Handle(RegisterMsg("w1"));
  ASSERT_EQ(back.transport.RegisterAcks().size(), 1u) << back.transport.status;
  EXPECT_EQ(back.transport.RegisterAcks()[0].telemetry_acked_seq(), 4);
}

// Progress heartbeats are memory only, batched so that they keep their
// place behind the worker's metrics and logs: applied after the group's
// commit.
TEST_F(WorkerSessionTest, ProgressIsAppliedInItsPlaceAfterTheGroupCommits) {
  Stream& s = Registered("w1");
  const std::string job = RunningOn(s);
  s.session->Handle(LogsMsg(job, 2, "a"));
  s.session->Handle(ProgressMsg(job, 3, 17));
  EXPECT_THAT(s.transport.TelemetryAcks(), ElementsAre(1));
  EXPECT_NE(Get(job).attempts(0).ranks(0).last_step(), 17);
  batcher_->Drain();
  EXPECT_THAT(s.transport.TelemetryAcks(), ElementsAre(1, 3));
  EXPECT_EQ(Get(job).attempts(0).ranks(0).last_step(), 17);
}

}  // namespace
}  // namespace trainctl::coordinator
