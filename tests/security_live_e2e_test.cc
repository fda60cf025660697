// Security of live calls, the dashboard and refusals (issue 25: findings 5,
// 9 and 11), end to end over TLS with real processes (a coordinator made by
// `trainctl-coordinator init`, worker daemons with their own worker tokens,
// the stand-in rank), while victim jobs still SUCCEED:
//
//  - a revoked viewer's `logs -f` and watch streams end UNAUTHENTICATED
//    within 5 s; a worker whose token is revoked is disconnected, turns
//    LOST, stays out, and its job finishes on another worker;
//  - the dashboard's port serves HTTPS with the coordinator's certificate;
//    the sign-in never redirects off the server (`next=/\evil.example`);
//    every answer carries CSP, X-Frame-Options and nosniff; /metrics needs
//    a viewer token; plain HTTP beyond loopback is refused at start;
//  - 300 bad tokens and 50 failed sign-ins make a bounded number of log
//    lines (with the count); a request that does not parse is
//    INVALID_ARGUMENT naming its type; a connection that never handshakes
//    is closed within seconds.
// See docs/security.md.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/auth/secret.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "tests/support/source_dir.h"
#include "trainctl/v1/auth.grpc.pb.h"
#include "trainctl/v1/worker_service.pb.h"

namespace trainctl {
namespace {

using trainctl::testing::Cluster;
using trainctl::testing::Process;
using trainctl::testing::SourceDir;

v1::JobSpec Spec(const std::string& name, int epochs, int max_restarts = 0) {
  ParsedJobSpec p = ParseJobSpecYaml(
      "model: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n",
      "live.yaml",
      {"name=" + name, "world_size=1", absl::StrCat("training.epochs=", epochs),
       absl::StrCat("restart.max_restarts=", max_restarts)});
  EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].message);
  return p.spec;
}

std::shared_ptr<grpc::Channel> ChannelWith(const Cluster& cluster, const std::string& token) {
  auth::ChannelSecurity security;
  security.token = token;
  security.ca_file = cluster.ca_file();
  return *auth::MakeChannel(cluster.address(), security, grpc::ChannelArguments());
}

std::string FirstLine(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Polls `done` every 50 ms until it holds or `timeout` passes.
bool Eventually(const std::function<bool()>& done, absl::Duration timeout) {
  for (absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(50))) {
    if (done()) return true;
  }
  return done();
}

v1::Worker FindWorker(Cluster& cluster, const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListWorkersRequest req;
  req.set_include_gone(true);
  v1::ListWorkersResponse resp;
  if (!cluster.workers_stub()->ListWorkers(&ctx, req, &resp).ok()) return {};
  for (const v1::Worker& w : resp.workers()) {
    if (w.id() == id) return w;
  }
  return {};
}

grpc::Status Revoke(const Cluster& cluster, const std::string& secret) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::RevokeTokenRequest req;
  req.set_id(auth::TokenIdOfSecret(secret));
  v1::Token resp;
  return v1::AuthService::NewStub(ChannelWith(cluster, cluster.admin_token()))
      ->RevokeToken(&ctx, req, &resp);
}

// One server stream read to its end on its own thread: when it ended
// (after Revoke was called) and how.
struct StreamEnd {
  grpc::Status status;
  absl::Time at;
  int messages = 0;
};

// A started TLS cluster: a coordinator with the dashboard on loopback
// (HTTPS: TLS is set) and worker w0.
class SecurityLiveE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<Cluster>(trainctl::testing::BuildDirOfThisTest(),
                                         SourceDir() + "/tests/support/fake_rank.py");
    ASSERT_TRUE(cluster_->InitTls());
    ASSERT_TRUE(cluster_->StartCoordinator({"--http_listen=127.0.0.1:0"}));
    ASSERT_TRUE(cluster_->StartWorker("w0", 1));
    ASSERT_TRUE(cluster_->WaitWorkers(1));
  }

  // "HOST:PORT" of the dashboard, from "dashboard on https://HOST:PORT/".
  std::string DashboardAddress() {
    static const std::regex re("dashboard on (https?)://([^/\\s]+)/");
    // `m` points into `log`: both live past the wait.
    std::string log;
    std::smatch m;
    if (!Eventually(
            [&] {
              log = cluster_->coordinator()->ReadLog();
              return std::regex_search(log, m, re);
            },
            absl::Seconds(10))) {
      return "";
    }
    EXPECT_EQ(m[1].str(), "https") << "with TLS the dashboard serves HTTPS";
    return m[2];
  }

  std::unique_ptr<Cluster> cluster_;
};

TEST_F(SecurityLiveE2ETest, RevokedViewerStreamsEndAndRevokedWorkerIsDropped) {
  const std::string victim = cluster_->Submit(Spec("victim-chatty", 25, /*max_restarts=*/3));
  ASSERT_FALSE(victim.empty());
  v1::Job running = cluster_->WaitState(victim, v1::JOB_STATE_RUNNING, absl::Seconds(60));
  ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.DebugString();
  ASSERT_GT(running.attempts_size(), 0);
  const std::string w0_id = running.attempts(0).ranks(0).worker_id();
  ASSERT_FALSE(w0_id.empty());

  // A viewer follows the logs and watches the job: both streams are live.
  const std::string viewer = cluster_->CreateToken(v1::ROLE_VIEWER, "live-viewer");
  ASSERT_FALSE(viewer.empty());
  auto jobs = v1::JobService::NewStub(ChannelWith(*cluster_, viewer));
  absl::Notification logs_flowing, watch_flowing;
  grpc::ClientContext logs_ctx, watch_ctx;
  logs_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(90));
  watch_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(90));
  auto follow_logs = std::async(std::launch::async, [&] {
    v1::GetLogsRequest req;
    req.set_job_id(victim);
    req.set_follow(true);
    auto stream = jobs->GetLogs(&logs_ctx, req);
    StreamEnd end;
    v1::LogChunk chunk;
    while (stream->Read(&chunk)) {
      if (++end.messages == 1) logs_flowing.Notify();
    }
    end.status = stream->Finish();
    end.at = absl::Now();
    return end;
  });
  auto watch = std::async(std::launch::async, [&] {
    v1::WatchJobRequest req;
    req.set_job_id(victim);
    auto stream = jobs->WatchJob(&watch_ctx, req);
    StreamEnd end;
    v1::JobUpdate update;
    while (stream->Read(&update)) {
      if (++end.messages == 1) watch_flowing.Notify();
    }
    end.status = stream->Finish();
    end.at = absl::Now();
    return end;
  });
  ASSERT_TRUE(logs_flowing.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "no log line reached the follower";
  ASSERT_TRUE(watch_flowing.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "the watch sent nothing";

  ASSERT_TRUE(Revoke(*cluster_, viewer).ok());
  const absl::Time revoked = absl::Now();
  for (auto* f : {&follow_logs, &watch}) {
    ASSERT_EQ(f->wait_for(std::chrono::seconds(30)), std::future_status::ready)
        << "a revoked stream kept going";
    StreamEnd end = f->get();
    EXPECT_EQ(end.status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << end.status.error_message();
    EXPECT_NE(end.status.error_message().find("revoked"), std::string::npos)
        << end.status.error_message();
    EXPECT_LT(end.at - revoked, absl::Seconds(5))
        << "the stream outlived its token by " << (end.at - revoked);
  }

  // A second worker to take the job; then w0's token is revoked.
  ASSERT_TRUE(cluster_->StartWorker("w1", 1));
  ASSERT_TRUE(cluster_->WaitWorkers(2));
  ASSERT_TRUE(Revoke(*cluster_, FirstLine(cluster_->WorkerTokenFile("w0"))).ok());
  EXPECT_TRUE(
      Eventually([&] { return FindWorker(*cluster_, w0_id).state() == v1::WORKER_STATE_LOST; },
                 absl::Seconds(15)))
      << "the revoked worker is still "
      << v1::WorkerState_Name(FindWorker(*cluster_, w0_id).state());
  EXPECT_TRUE(Eventually(
      [&] {
        return cluster_->coordinator()->ReadLog().find("worker_session_revoked") !=
               std::string::npos;
      },
      absl::Seconds(5)));

  // The victim restarts on w1 and succeeds; w0, which keeps reconnecting
  // with its revoked token, never comes back.
  v1::Job done = cluster_->WaitState(victim, v1::JOB_STATE_SUCCEEDED, absl::Seconds(120));
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.DebugString();
  ASSERT_GE(done.attempts_size(), 2);
  EXPECT_NE(done.attempts(done.attempts_size() - 1).ranks(0).worker_id(), w0_id);
  EXPECT_EQ(FindWorker(*cluster_, w0_id).state(), v1::WORKER_STATE_LOST);
}

TEST_F(SecurityLiveE2ETest, DashboardServesHttpsWithHeadersAndNoOpenRedirect) {
  const std::string addr = DashboardAddress();
  ASSERT_FALSE(addr.empty()) << cluster_->coordinator()->ReadLog();
  const std::string viewer = cluster_->CreateToken(v1::ROLE_VIEWER, "dash-viewer");
  ASSERT_FALSE(viewer.empty());
  const std::string host = addr.substr(0, addr.rfind(':'));
  const int port = std::stoi(addr.substr(addr.rfind(':') + 1));
  httplib::SSLClient https(host, port);
  https.set_ca_cert_path(cluster_->ca_file().c_str());
  https.enable_server_certificate_verification(true);
  https.set_connection_timeout(10);
  https.set_read_timeout(10);

  // Every answer carries the headers: a page, an API refusal, a 404.
  for (const char* path : {"/login", "/api/jobs", "/no-such-page"}) {
    auto r = https.Get(path);
    ASSERT_TRUE(r) << path << ": " << httplib::to_string(r.error());
    EXPECT_NE(r->get_header_value("Content-Security-Policy").find("default-src 'self'"),
              std::string::npos)
        << path;
    EXPECT_NE(r->get_header_value("Content-Security-Policy").find("frame-ancestors 'none'"),
              std::string::npos)
        << path;
    EXPECT_EQ(r->get_header_value("X-Frame-Options"), "DENY") << path;
    EXPECT_EQ(r->get_header_value("X-Content-Type-Options"), "nosniff") << path;
  }

  // /metrics: no token 401, a worker's token 403, a viewer's 200.
  auto anonymous = https.Get("/metrics");
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->status, 401);
  EXPECT_EQ(anonymous->body.find("trainctl_"), std::string::npos) << "no metric without a token";
  auto as_worker = https.Get(
      "/metrics", {{"Authorization", "Bearer " + FirstLine(cluster_->WorkerTokenFile("w0"))}});
  ASSERT_TRUE(as_worker);
  EXPECT_EQ(as_worker->status, 403);
  auto as_viewer = https.Get("/metrics", {{"Authorization", "Bearer " + viewer}});
  ASSERT_TRUE(as_viewer);
  EXPECT_EQ(as_viewer->status, 200);
  EXPECT_NE(as_viewer->body.find("trainctl_coordinator_up 1"), std::string::npos)
      << as_viewer->body;

  // The sign-in returns only to a path on this server.
  auto sign_in = [&](const std::string& next) {
    httplib::Params form{{"token", viewer}, {"next", next}};
    auto r = https.Post("/login", form);
    EXPECT_TRUE(r) << next;
    return r ? r->status == 303 ? r->get_header_value("Location")
                                : "status " + std::to_string(r->status)
             : "";
  };
  EXPECT_EQ(sign_in("/\\evil.example"), "/");
  EXPECT_EQ(sign_in("//evil.example"), "/");
  EXPECT_EQ(sign_in("https://evil.example/"), "/");
  EXPECT_EQ(sign_in("/\t/evil.example"), "/");
  EXPECT_EQ(sign_in("/jobs/some-job"), "/jobs/some-job");
  {
    httplib::Params form{{"token", viewer}, {"next", "/"}};
    auto r = https.Post("/login", form);
    ASSERT_TRUE(r);
    const std::string cookie = r->get_header_value("Set-Cookie");
    EXPECT_NE(cookie.find("HttpOnly"), std::string::npos) << cookie;
    EXPECT_NE(cookie.find("Secure"), std::string::npos)
        << "over HTTPS the cookie is Secure: " << cookie;
  }

  // A sign-in form posted from another site is refused (login CSRF); the
  // dashboard's own page posts with its own Origin.
  {
    httplib::Params form{{"token", viewer}, {"next", "/"}};
    for (const httplib::Headers& from : {httplib::Headers{{"Origin", "https://evil.example"}},
                                         httplib::Headers{{"Sec-Fetch-Site", "cross-site"}},
                                         httplib::Headers{{"Origin", "null"}}}) {
      auto r = https.Post("/login", from, form);
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 403) << from.begin()->first << ": " << from.begin()->second;
      EXPECT_EQ(r->get_header_value("Set-Cookie"), "") << "no cookie for a cross-site form";
    }
    auto same = https.Post(
        "/login",
        httplib::Headers{{"Origin", "https://" + addr}, {"Sec-Fetch-Site", "same-origin"}}, form);
    ASSERT_TRUE(same);
    EXPECT_EQ(same->status, 303) << same->body;
  }

  // Plain HTTP to the HTTPS port gets no dashboard.
  {
    httplib::Client plain(host, port);
    plain.set_connection_timeout(5);
    plain.set_read_timeout(5);
    auto r = plain.Get("/metrics", {{"Authorization", "Bearer " + viewer}});
    EXPECT_TRUE(!r || r->status != 200) << "plain HTTP was served";
  }

  // Failed sign-ins are logged, bounded: per client address one line at
  // once (here the worker token's /metrics above, in the same 10 s), the
  // rest as one line with their count when the 10 s are over.
  for (int i = 0; i < 50; ++i) {
    httplib::Params form{{"token", absl::StrCat("tct_t-0badf00d_", i)}, {"next", "/"}};
    auto r = https.Post("/login", form);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
  }
  auto counted = [&] {
    static const std::regex re("http_auth_refused peer=127\\.0\\.0\\.1 count=([0-9]+)");
    const std::string log = cluster_->coordinator()->ReadLog();
    int total = 0;
    for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
         ++it) {
      total += std::stoi((*it)[1].str());
    }
    return total;
  };
  ASSERT_TRUE(Eventually([&] { return counted() >= 51; }, absl::Seconds(30)))
      << "the failed sign-ins were not all counted:\n"
      << cluster_->coordinator()->ReadLog();
  EXPECT_NE(cluster_->coordinator()->ReadLog().find("what=sign-in"), std::string::npos);
  EXPECT_LE(Count(cluster_->coordinator()->ReadLog(), "http_auth_refused"), 3)
      << cluster_->coordinator()->ReadLog();

  // Without TLS, the dashboard beyond loopback needs --insecure.
  Process plain(
      {trainctl::testing::BuildDirOfThisTest() + "/coordinator/trainctl-coordinator",
       "--listen=127.0.0.1:0", "--db=" + cluster_->dir() + "/plain.db", "--http_listen=0.0.0.0:0"},
      cluster_->dir() + "/plain-coordinator.log");
  ASSERT_TRUE(plain.Start());
  const int status = plain.Wait(absl::Seconds(30));
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) != 0) << plain.ReadLog();
  EXPECT_NE(plain.ReadLog().find("--http-listen"), std::string::npos) << plain.ReadLog();
}

TEST_F(SecurityLiveE2ETest, RefusalsAreLoggedBoundedAndBadRequestsExplained) {
  const std::string victim = cluster_->Submit(Spec("refusal-victim", 3));
  ASSERT_FALSE(victim.empty());
  const std::string before = cluster_->coordinator()->ReadLog();
  const int refused_before = Count(before, "rpc_refused");

  // 300 calls with bad tokens, as fast as they go.
  auto anonymous = v1::JobService::NewStub(ChannelWith(*cluster_, ""));
  for (int i = 0; i < 300; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx.AddMetadata("authorization", absl::StrCat("Bearer tct_t-0badf00d_", i));
    v1::GetJobRequest req;
    req.set_job_id(victim);
    v1::Job job;
    ASSERT_EQ(anonymous->GetJob(&ctx, req, &job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // One line at once; the count follows once the 10 s interval is over.
  auto counted = [&] {
    static const std::regex re("rpc_refused peer=127\\.0\\.0\\.1 count=([0-9]+)");
    const std::string log = cluster_->coordinator()->ReadLog().substr(before.size());
    int total = 0;
    for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
         ++it) {
      total += std::stoi((*it)[1].str());
    }
    return total;
  };
  ASSERT_TRUE(Eventually([&] { return counted() >= 300; }, absl::Seconds(30)))
      << "every refusal is counted: " << cluster_->coordinator()->ReadLog().substr(before.size());
  const int lines = Count(cluster_->coordinator()->ReadLog(), "rpc_refused") - refused_before;
  EXPECT_GE(lines, 1);
  EXPECT_LE(lines, 3) << "300 refusals made " << lines << " lines";

  // A request that does not parse: INVALID_ARGUMENT naming its type.
  {
    grpc::GenericStub generic(ChannelWith(*cluster_, cluster_->admin_token()));
    // Field 1 (job_id, a string) claiming ~2^63 bytes.
    const std::string garbage("\x0a\xff\xff\xff\xff\xff\xff\xff\xff\x7f", 10);
    grpc::Slice slice(garbage);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, "/trainctl.v1.JobService/GetJob", grpc::StubOptions(), &request,
                      &response, [&](grpc::Status s) { done.set_value(s); });
    grpc::Status s = done.get_future().get();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find("trainctl.v1.GetJobRequest"), std::string::npos)
        << s.error_message();
  }

  // A worker session whose first message does not parse, or is not a
  // register: INVALID_ARGUMENT (a garbage first message ended OK, #45 item 7).
  {
    class OneMessage : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
     public:
      explicit OneMessage(const std::string& bytes) : slice_(bytes), out_(&slice_, 1) {}
      void Go() {
        StartWrite(&out_);
        StartRead(&in_);
        StartCall();
      }
      void OnWriteDone(bool) override { StartWritesDone(); }
      void OnDone(const grpc::Status& s) override { done_.set_value(s); }
      grpc::Status Wait() { return done_.get_future().get(); }

     private:
      grpc::Slice slice_;
      grpc::ByteBuffer out_, in_;
      std::promise<grpc::Status> done_;
    };
    grpc::GenericStub generic(ChannelWith(*cluster_, FirstLine(cluster_->WorkerTokenFile("w0"))));
    v1::WorkerMessage heartbeat;
    heartbeat.mutable_heartbeat();
    const std::string cases[] = {std::string("\x0a\xff\xff\xff\xff\xff\xff\xff\xff\x7f", 10),
                                 heartbeat.SerializeAsString()};
    for (const std::string& first : cases) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
      OneMessage call(first);
      generic.PrepareBidiStreamingCall(&ctx, "/trainctl.v1.WorkerService/Session",
                                       grpc::StubOptions(), &call);
      call.Go();
      grpc::Status s = call.Wait();
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    }
  }

  // A connection that never handshakes is closed in seconds (gRPC's
  // default would hold it 120 s).
  {
    const std::string addr = cluster_->address();
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1))));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    const absl::Time opened = absl::Now();
    bool closed = false;
    while (!closed && absl::Now() - opened < absl::Seconds(60)) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 500) > 0) {
        char buf[256];
        closed = read(fd, buf, sizeof(buf)) <= 0;
      }
    }
    close(fd);
    EXPECT_TRUE(closed);
    EXPECT_LT(absl::Now() - opened, absl::Seconds(20))
        << "an idle pre-handshake connection was held";
  }

  v1::Job done = cluster_->WaitState(victim, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.DebugString();
}

}  // namespace
}  // namespace trainctl
