// Certificates by purpose, end to end over TLS with real processes (issue
// 25: a join token made a coordinator; a worker's own --address was trusted
// for rendezvous; an RSA-512 CSR was signed; certificates could not be
// revoked). Each attack is replayed against a cluster set up as
// docs/security.md says, and refused, while a victim job still SUCCEEDS.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <sys/wait.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/auth/pki.h"
#include "common/auth/secret.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "tests/support/fake_worker.h"
#include "tests/support/source_dir.h"
#include "trainctl/client.h"
#include "trainctl/v1/auth.grpc.pb.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using trainctl::testing::Cluster;
using trainctl::testing::FakeWorker;
using trainctl::testing::Process;
using trainctl::testing::SourceDir;

v1::JobSpec Spec(const std::string& name, int epochs, int world = 1) {
  ParsedJobSpec p = ParseJobSpecYaml(
      "model: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n",
      "certs.yaml",
      {"name=" + name, absl::StrCat("world_size=", world),
       absl::StrCat("training.epochs=", epochs)});
  EXPECT_TRUE(p.ok());
  return p.spec;
}

std::chrono::system_clock::time_point Soon(int s = 10) {
  return std::chrono::system_clock::now() + std::chrono::seconds(s);
}

std::shared_ptr<grpc::Channel> Tls(const std::string& address, const std::string& ca,
                                   const std::string& token = "", const std::string& cert_file = "",
                                   const std::string& key_file = "") {
  auth::ChannelSecurity security;
  security.token = token;
  security.ca_file = ca;
  security.cert_file = cert_file;
  security.key_file = key_file;
  return *auth::MakeChannel(address, security, grpc::ChannelArguments());
}

// A token made by the cluster's admin with `addresses` authorised.
std::string CreateToken(Cluster& cluster, v1::Role role, const std::string& name,
                        const std::vector<std::string>& addresses = {}) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Soon());
  v1::CreateTokenRequest req;
  req.set_role(role);
  req.set_name(name);
  for (const std::string& a : addresses) req.add_addresses(a);
  v1::CreateTokenResponse resp;
  grpc::Status s =
      v1::AuthService::NewStub(Tls(cluster.address(), cluster.ca_file(), cluster.admin_token()))
          ->CreateToken(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp.secret();
}

grpc::Status Join(Cluster& cluster, const std::string& token, const std::string& csr,
                  const std::vector<std::string>& addresses, v1::JoinResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Soon());
  v1::JoinRequest req;
  req.set_csr_pem(csr);
  for (const std::string& a : addresses) req.add_addresses(a);
  return v1::AuthService::NewStub(Tls(cluster.address(), cluster.ca_file(), token))
      ->Join(&ctx, req, resp);
}

// Whether the certificate names `host` (an IP address or a DNS name).
bool CertNames(const std::string& cert_pem, const std::string& host) {
  BIO* bio = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (x == nullptr) return false;
  bool named = X509_check_ip_asc(x, host.c_str(), 0) == 1 ||
               X509_check_host(x, host.c_str(), 0, 0, nullptr) == 1;
  X509_free(x);
  return named;
}

// Opens a Session (mutual TLS with `cert_file`) and registers; the status the
// coordinator ends it with (OK once it acknowledged the registration).
grpc::Status RegisterWithCert(const std::string& address, const std::string& ca,
                              const std::string& cert_file, const std::string& key_file) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Soon());
  auto stream =
      v1::WorkerService::NewStub(Tls(address, ca, "", cert_file, key_file))->Session(&ctx);
  v1::WorkerMessage reg;
  reg.mutable_register_()->set_hostname("h");
  reg.mutable_register_()->add_slots()->set_kind(v1::Slot::KIND_CPU);
  stream->Write(reg);
  v1::CoordinatorMessage in;
  if (stream->Read(&in) && in.has_register_ack()) {
    ctx.TryCancel();
    stream->Finish();
    return grpc::Status::OK;
  }
  return stream->Finish();
}

// A TLS server with `cert`/`key` posing as the coordinator: it records the
// `authorization` of every JobService.ListJobs and WorkerService.Session call
// that gets through the handshake.
class FakeCoordinator {
 public:
  FakeCoordinator(const std::string& cert_pem, const std::string& key_pem)
      : jobs_(this), workers_(this) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({key_pem, cert_pem});
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(ssl), &port_);
    builder.RegisterService(&jobs_);
    builder.RegisterService(&workers_);
    server_ = builder.BuildAndStart();
  }
  ~FakeCoordinator() {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  // Every `authorization` received ("-" for a call without one).
  std::vector<std::string> tokens() {
    absl::MutexLock lock(&mu_);
    return tokens_;
  }

 private:
  void Record(grpc::CallbackServerContext* ctx) {
    auto it = ctx->client_metadata().find("authorization");
    absl::MutexLock lock(&mu_);
    tokens_.push_back(it == ctx->client_metadata().end()
                          ? "-"
                          : std::string(it->second.data(), it->second.size()));
  }

  class Jobs : public v1::JobService::CallbackService {
   public:
    explicit Jobs(FakeCoordinator* owner) : owner_(owner) {}
    grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx, const v1::ListJobsRequest*,
                                       v1::ListJobsResponse*) override {
      owner_->Record(ctx);
      grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
      r->Finish(grpc::Status::OK);
      return r;
    }

   private:
    FakeCoordinator* owner_;
  };
  class Refuse : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
   public:
    Refuse() { Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake coordinator")); }
    void OnDone() override { delete this; }
  };
  class Workers : public v1::WorkerService::CallbackService {
   public:
    explicit Workers(FakeCoordinator* owner) : owner_(owner) {}
    grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* Session(
        grpc::CallbackServerContext* ctx) override {
      owner_->Record(ctx);
      return new Refuse();
    }

   private:
    FakeCoordinator* owner_;
  };

  Jobs jobs_;
  Workers workers_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  std::vector<std::string> tokens_ ABSL_GUARDED_BY(mu_);
};

// Runs the real CLI; its wait status, or -1 when it did not finish.
int RunCli(const std::string& log, const std::vector<std::string>& args) {
  std::vector<std::string> argv{trainctl::testing::BuildDirOfThisTest() + "/client/trainctl"};
  argv.insert(argv.end(), args.begin(), args.end());
  Process cli(argv, log);
  if (!cli.Start()) return -1;
  return cli.Wait(absl::Seconds(60));
}

bool ExitedOk(int status) { return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// Polls until `done` holds; false after `timeout`.
bool Eventually(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(30)) {
  for (absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline;) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return done();
}

// Finding 1: a join token bought a certificate with server-auth usage under
// the CA every client trusts, and a fake server with it received the
// admin's token. Now the certificate is for client authentication only: the
// CLI, the client library and a worker daemon each fail the handshake with
// it, even dialling a name it carries (127.0.0.1, authorised with the join
// token), and send nothing. A server with the coordinator's own certificate
// (the control) does receive them, so the test can see a leak.
TEST(SecurityCertsE2ETest, AJoinedWorkersCertificateIsNotACoordinator) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.InitTls());
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.StartWorker("real", 1));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  const std::string victim = cluster.Submit(Spec("slow-victim", 3));
  ASSERT_FALSE(victim.empty());
  const std::string ca = cluster.ca_file();

  // The attacker holds a join token the admin authorised for 127.0.0.1 and
  // asks for the coordinator's names too.
  const std::string join = CreateToken(cluster, v1::ROLE_JOIN, "attacker", {"127.0.0.1"});
  const std::string key = *auth::NewPrivateKey();
  v1::JoinResponse joined;
  grpc::Status s = Join(cluster, join, *auth::NewCsr(key, "trainctl-coordinator"),
                        {"localhost", "127.0.0.1", "trainctl-coordinator"}, &joined);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(CertNames(joined.cert_pem(), "127.0.0.1")) << "authorised with the token";
  EXPECT_FALSE(CertNames(joined.cert_pem(), "localhost")) << "asked for, not authorised";
  EXPECT_FALSE(CertNames(joined.cert_pem(), "trainctl-coordinator"));

  FakeCoordinator evil(joined.cert_pem(), key);
  FakeCoordinator control(*auth::ReadFile(cluster.dir() + "/tls/coordinator.crt"),
                          *auth::ReadFile(cluster.dir() + "/tls/coordinator.key"));
  const std::string admin = cluster.admin_token();

  // The CLI.
  int st = RunCli(cluster.dir() + "/cli-control.log",
                  {"--coordinator=" + control.address(), "--ca=" + ca, "--token=" + admin,
                   "--timeout=20", "list"});
  EXPECT_TRUE(ExitedOk(st)) << *auth::ReadFile(cluster.dir() + "/cli-control.log");
  EXPECT_THAT(control.tokens(), ::testing::Contains("Bearer " + admin))
      << "control: a real server gets the token";
  st = RunCli(cluster.dir() + "/cli-evil.log", {"--coordinator=" + evil.address(), "--ca=" + ca,
                                                "--token=" + admin, "--timeout=10", "list"});
  EXPECT_FALSE(ExitedOk(st)) << "the CLI took a worker's certificate for the coordinator";
  EXPECT_TRUE(evil.tokens().empty()) << "the CLI sent its token to a joined worker's server";

  // The client library.
  ClientOptions options;
  options.address = evil.address();
  options.token = admin;
  options.ca_file = ca;
  options.timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (client.ok()) {
    EXPECT_FALSE((*client)->List().ok()) << "the client library trusted a worker's certificate";
  } else {
    EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable) << client.status();
  }
  EXPECT_TRUE(evil.tokens().empty());

  // A worker daemon (with its worker token).
  auto worker_at = [&](const FakeCoordinator& target, const std::string& name) {
    return std::make_unique<Process>(
        std::vector<std::string>{
            trainctl::testing::BuildDirOfThisTest() + "/worker/daemon/trainctl-worker",
            "--coordinator=" + target.address(), "--ca=" + ca,
            "--token_file=" + cluster.WorkerTokenFile("real"),
            "--work_dir=" + cluster.dir() + "/" + name, "--address=127.0.0.1", "--slots=1",
            "--rank_binary=" + SourceDir() + "/tests/support/fake_rank.py"},
        cluster.dir() + "/" + name + ".log");
  };
  std::unique_ptr<Process> to_control = worker_at(control, "worker-to-control");
  ASSERT_TRUE(to_control->Start());
  const std::string worker_token = *auth::ReadTokenFile(cluster.WorkerTokenFile("real"));
  EXPECT_TRUE(Eventually([&] {
    std::vector<std::string> t = control.tokens();
    return std::find(t.begin(), t.end(), "Bearer " + worker_token) != t.end();
  })) << "control: a worker reaches a real server";
  to_control->Kill(SIGKILL);
  std::unique_ptr<Process> to_evil = worker_at(evil, "worker-to-evil");
  ASSERT_TRUE(to_evil->Start());
  EXPECT_TRUE(Eventually([&] {
    return to_evil->ReadLog().find("coordinator_unreachable") != std::string::npos;
  })) << to_evil->ReadLog();
  to_evil->Kill(SIGKILL);
  EXPECT_TRUE(evil.tokens().empty()) << "a worker sent its token to a joined worker's server";

  v1::Job done = cluster.WaitState(victim, v1::JOB_STATE_SUCCEEDED, absl::Seconds(90));
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.state_reason();
}

// Finding 11 (Join signed an RSA-512 CSR) and finding 6 (a worker that
// joined with --address 6.6.6.6 reported 6.6.6.6:6666 and it was delivered
// to ranks). A weak key is refused naming the field, and the token stays
// usable; a worker's own address is never trusted for rendezvous (neither a
// joined worker's asked-for SAN nor a token worker's registered --address);
// real workers on loopback still meet through the IP they connect from, and
// their victim job SUCCEEDS.
TEST(SecurityCertsE2ETest, WeakKeysAndSelfChosenRendezvousAddressesAreRefused) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.InitTls());
  ASSERT_TRUE(cluster.StartCoordinator());
  const std::string addr = cluster.address();
  const std::string ca = cluster.ca_file();

  const std::string join = CreateToken(cluster, v1::ROLE_JOIN, "weak");
  absl::StatusOr<std::string> rsa512 = auth::NewRsaCsrForTest(512, "weak");
  ASSERT_TRUE(rsa512.ok()) << rsa512.status();
  v1::JoinResponse joined;
  grpc::Status s = Join(cluster, join, *rsa512, {}, &joined);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("csr_pem: an RSA key of 512 bits is too weak"));

  // The same token, a strong key, and an address the admin never authorised.
  const std::string key = *auth::NewPrivateKey();
  s = Join(cluster, join, *auth::NewCsr(key, "w"), {"6.6.6.6"}, &joined);
  ASSERT_TRUE(s.ok()) << "a refused join leaves the token usable: " << s.error_message();
  EXPECT_FALSE(CertNames(joined.cert_pem(), "6.6.6.6"));
  ASSERT_TRUE(auth::WritePrivateFile(cluster.dir() + "/j.key", key).ok());
  ASSERT_TRUE(auth::WritePrivateFile(cluster.dir() + "/j.crt", joined.cert_pem()).ok());

  // Two rogue workers hold the two ranks of a job: the joined one, and a
  // token worker (its token names no address) that registers 6.6.6.6.
  FakeWorker cert_worker(Tls(addr, ca, "", cluster.dir() + "/j.crt", cluster.dir() + "/j.key"),
                         joined.worker_id(), 1);
  FakeWorker token_worker(Tls(addr, ca), "rogue-token", 1, absl::Milliseconds(100),
                          CreateToken(cluster, v1::ROLE_WORKER, "rogue"));
  token_worker.set_address("6.6.6.6");
  ASSERT_TRUE(cert_worker.Connect());
  ASSERT_TRUE(token_worker.Connect());
  const std::string attack = cluster.Submit(Spec("attack", 1, 2));
  ASSERT_FALSE(attack.empty());
  auto start = [](const v1::CoordinatorMessage& m) { return m.has_start_ranks(); };
  auto rendezvous = [](const v1::CoordinatorMessage& m) { return m.has_rendezvous(); };
  std::optional<v1::CoordinatorMessage> c_start = cert_worker.WaitFor(start, absl::Seconds(20));
  ASSERT_TRUE(c_start.has_value());
  ASSERT_TRUE(token_worker.WaitFor(start, absl::Seconds(20)).has_value());
  const bool cert_is_rank0 = c_start->start_ranks().ranks(0).rank() == 0;
  FakeWorker& rank0 = cert_is_rank0 ? cert_worker : token_worker;
  FakeWorker& rank1 = cert_is_rank0 ? token_worker : cert_worker;
  for (FakeWorker* w : {&cert_worker, &token_worker}) {
    v1::WorkerMessage rdv;
    rdv.mutable_rendezvous()->set_job_id(attack);
    rdv.mutable_rendezvous()->set_attempt(1);
    rdv.mutable_rendezvous()->mutable_info()->set_gloo_store_address("6.6.6.6:6666");
    const size_t before = w->received_count();
    ASSERT_TRUE(w->Send(rdv));
    // A session's messages are handled in order: once a later heartbeat is
    // answered, the report was handled.
    ASSERT_TRUE(w->WaitFor([](const v1::CoordinatorMessage& m) { return m.has_heartbeat_ack(); },
                           absl::Seconds(10), before));
  }
  const std::string log = cluster.coordinator()->ReadLog();
  EXPECT_THAT(log, HasSubstr("rendezvous_refused"));
  EXPECT_THAT(log, HasSubstr("host '6.6.6.6' is not this worker's address"));
  for (const std::string& id : {joined.worker_id(), std::string("rogue-token")}) {
    bool refused = false;
    for (absl::string_view line : absl::StrSplit(log, '\n')) {
      refused |= absl::StrContains(line, "rendezvous_refused") && absl::StrContains(line, id);
    }
    EXPECT_TRUE(refused) << id << "'s forged report was not refused:\n" << log;
  }
  // Rank 0's forged report fails the attempt at once as CONFIG, naming its
  // worker (the ranks could never meet); no address reached rank 1.
  v1::Job attacked = cluster.WaitState(attack, v1::JOB_STATE_FAILED, absl::Seconds(20));
  EXPECT_EQ(attacked.state(), v1::JOB_STATE_FAILED) << attacked.state_reason();
  EXPECT_FALSE(attacked.attempts(0).has_rendezvous());
  EXPECT_EQ(attacked.attempts(0).failure_kind(), v1::FAILURE_KIND_CONFIG);
  EXPECT_THAT(attacked.attempts(0).reason(), HasSubstr("rendezvous refused: worker " + rank0.id()));
  EXPECT_FALSE(rank1.WaitFor(rendezvous, absl::Milliseconds(300)).has_value())
      << "a forged rendezvous address reached a rank";
  cert_worker.Leave();
  token_worker.Leave();

  // The real victim, on real daemons (token workers whose tokens name no
  // address): they meet at 127.0.0.1, the IP their sessions come from.
  // The daemons may still be registering (and the rogues leaving) at the
  // submit: the job waits for the capacity rather than being refused as one
  // the cluster as it is can never run.
  ASSERT_TRUE(cluster.StartWorker("a", 1));
  ASSERT_TRUE(cluster.StartWorker("b", 1));
  v1::JobSpec victim_spec = Spec("victim", 2, 2);
  victim_spec.mutable_scheduling()->set_wait_for_capacity(true);
  const std::string victim = cluster.Submit(victim_spec);
  ASSERT_FALSE(victim.empty());
  v1::Job done = cluster.WaitState(victim, v1::JOB_STATE_SUCCEEDED, absl::Seconds(90));
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.state_reason();
  EXPECT_THAT(done.attempts(done.attempts_size() - 1).rendezvous().gloo_store_address(),
              HasSubstr("127.0.0.1:"));
}

// Certificate revocation: `trainctl worker revoke ID` ends the joined
// worker's live session, marks it LOST at once so its rank is rescheduled
// (the victim SUCCEEDS on another worker), and refuses its certificate from
// then on, also after a coordinator restart. Only an admin may revoke.
TEST(SecurityCertsE2ETest, ARevokedWorkerCertificateIsDropped) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.InitTls());
  ASSERT_TRUE(cluster.StartCoordinator());
  const std::string ca = cluster.ca_file();
  const std::string join_file = cluster.dir() + "/join.token";
  ASSERT_TRUE(
      auth::WritePrivateFile(join_file, CreateToken(cluster, v1::ROLE_JOIN, "rack-1") + "\n").ok());
  ASSERT_TRUE(cluster.StartWorker("joined", 1, false, {"--join_token_file=" + join_file}));
  ASSERT_TRUE(cluster.WaitWorkers(1, absl::Seconds(30))) << cluster.worker("joined")->ReadLog();
  const std::string work = cluster.dir() + "/worker-joined";
  const std::string joined_id = *auth::CertCommonName(*auth::ReadFile(work + "/worker.crt"));

  const std::string victim = cluster.Submit(Spec("slow-victim", 15));
  ASSERT_FALSE(victim.empty());
  v1::Job running = cluster.WaitState(victim, v1::JOB_STATE_RUNNING, absl::Seconds(60));
  ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.state_reason();
  ASSERT_EQ(running.attempts(0).ranks(0).worker_id(), joined_id);
  ASSERT_TRUE(cluster.StartWorker("spare", 1));
  ASSERT_TRUE(cluster.WaitWorkers(2));

  // Only an admin revokes.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(Soon());
    v1::RevokeWorkerRequest req;
    req.set_worker_id(joined_id);
    v1::RevokeWorkerResponse resp;
    grpc::Status s =
        v1::AuthService::NewStub(
            Tls(cluster.address(), ca, CreateToken(cluster, v1::ROLE_SUBMITTER, "mallory")))
            ->RevokeWorker(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  }
  const absl::Time revoked_at = absl::Now();
  const std::string cli_log = cluster.dir() + "/revoke.log";
  int st = RunCli(cli_log, {"--coordinator=" + cluster.address(), "--ca=" + ca,
                            "--token=" + cluster.admin_token(), "worker", "revoke", joined_id});
  ASSERT_TRUE(ExitedOk(st)) << *auth::ReadFile(cli_log);
  EXPECT_THAT(*auth::ReadFile(cli_log), HasSubstr("worker " + joined_id + " revoked"));

  auto state_of = [&](const std::string& id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(Soon());
    v1::ListWorkersRequest req;
    req.set_include_gone(true);
    v1::ListWorkersResponse resp;
    if (!cluster.workers_stub()->ListWorkers(&ctx, req, &resp).ok())
      return v1::WORKER_STATE_UNSPECIFIED;
    for (const v1::Worker& w : resp.workers()) {
      if (w.id() == id) return w.state();
    }
    return v1::WORKER_STATE_UNSPECIFIED;
  };
  ASSERT_TRUE(
      Eventually([&] { return state_of(joined_id) == v1::WORKER_STATE_LOST; }, absl::Seconds(10)));
  EXPECT_LT(absl::Now() - revoked_at, absl::Seconds(10)) << "LOST at once, not after a lease";
  grpc::Status s =
      RegisterWithCert(cluster.address(), ca, work + "/worker.crt", work + "/worker.key");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("was revoked"));

  v1::Job done = cluster.WaitState(victim, v1::JOB_STATE_SUCCEEDED, absl::Seconds(120));
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.state_reason();
  EXPECT_NE(done.attempts(done.attempts_size() - 1).ranks(0).worker_id(), joined_id);
  EXPECT_NE(state_of(joined_id), v1::WORKER_STATE_ALIVE);

  // Persisted: a restarted coordinator still refuses it.
  cluster.KillCoordinator(SIGTERM);
  ASSERT_TRUE(cluster.StartCoordinator());
  s = RegisterWithCert(cluster.address(), ca, work + "/worker.crt", work + "/worker.key");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("was revoked"));
}

// #25 (renewal): a joined worker renews its certificate while a third of
// its validity is left, for the same id and the names the admin authorised,
// with no token; after the first certificate has expired the worker still
// connects (a coordinator restart makes it present the renewed one). A
// certificate renews only itself, and a revoked one cannot renew.
TEST(SecurityCertsE2ETest, AJoinedWorkerRenewsItsCertificateBeforeItExpires) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.InitTls());
  // 43 s (back-dated 10 s): renewed when less than 18 s is left.
  const std::vector<std::string> short_certs = {"--worker_cert_days=0.0005"};
  ASSERT_TRUE(cluster.StartCoordinator(short_certs));
  const std::string ca = cluster.ca_file();
  const std::string join_file = cluster.dir() + "/join.token";
  ASSERT_TRUE(auth::WritePrivateFile(
                  join_file, CreateToken(cluster, v1::ROLE_JOIN, "rack-1", {"127.0.0.1"}) + "\n")
                  .ok());
  ASSERT_TRUE(cluster.StartWorker("joined", 1, false, {"--join_token_file=" + join_file}));
  ASSERT_TRUE(cluster.WaitWorkers(1, absl::Seconds(30))) << cluster.worker("joined")->ReadLog();
  const std::string work = cluster.dir() + "/worker-joined";
  const std::string first = *auth::ReadFile(work + "/worker.crt");
  const std::string id = *auth::CertCommonName(first);
  const auth::CertValidity first_valid = *auth::CertValidityOf(first);
  ASSERT_LT(first_valid.not_after - first_valid.not_before, absl::Seconds(60));

  std::string renewed;
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<std::string> now = auth::ReadFile(work + "/worker.crt");
        if (!now.ok() || *now == first) return false;
        renewed = *now;
        return true;
      },
      absl::Seconds(60)))
      << cluster.worker("joined")->ReadLog();
  EXPECT_EQ(*auth::CertCommonName(renewed), id) << "the same worker";
  EXPECT_NE(*auth::CertSerialHex(renewed), *auth::CertSerialHex(first));
  EXPECT_GT(auth::CertValidityOf(renewed)->not_after, first_valid.not_after);
  EXPECT_TRUE(CertNames(renewed, "127.0.0.1")) << "the authorised name is kept";
  // The worker writes the file first and logs after it: wait for the line.
  EXPECT_TRUE(Eventually(
      [&] { return absl::StrContains(cluster.worker("joined")->ReadLog(), "certificate_renewed"); },
      absl::Seconds(30)))
      << cluster.worker("joined")->ReadLog();
  EXPECT_TRUE(Eventually(
      [&] {
        return absl::StrContains(cluster.coordinator()->ReadLog(),
                                 "worker_cert_renewed worker_id=" + id);
      },
      absl::Seconds(30)))
      << cluster.coordinator()->ReadLog();

  // Past the first certificate's end: a new session presents the renewed one.
  const absl::Duration left = first_valid.not_after + absl::Seconds(1) - absl::Now();
  if (left > absl::ZeroDuration()) absl::SleepFor(left);
  cluster.KillCoordinator(SIGTERM);
  ASSERT_TRUE(cluster.StartCoordinator(short_certs));
  const std::string job = cluster.Submit(Spec("after-renewal", 1));
  v1::Job done = cluster.WaitState(job, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED)
      << done.state_reason() << cluster.worker("joined")->ReadLog();
  EXPECT_EQ(done.attempts(0).ranks(0).worker_id(), id);

  // A certificate renews only itself; a revoked one not at all.
  const std::string key = *auth::NewPrivateKey();
  auto renew = [&](const std::string& as) {
    grpc::ClientContext ctx;
    ctx.set_deadline(Soon());
    v1::JoinRequest req;
    req.set_worker_id(as);
    req.set_csr_pem(*auth::NewCsr(key, "x"));
    v1::JoinResponse resp;
    return v1::AuthService::NewStub(
               Tls(cluster.address(), ca, "", work + "/worker.crt", work + "/worker.key"))
        ->Join(&ctx, req, &resp);
  };
  grpc::Status s = renew("someone-else");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  grpc::ClientContext rctx;
  rctx.set_deadline(Soon());
  v1::RevokeWorkerRequest revoke;
  revoke.set_worker_id(id);
  v1::RevokeWorkerResponse revoked;
  ASSERT_TRUE(v1::AuthService::NewStub(Tls(cluster.address(), ca, cluster.admin_token()))
                  ->RevokeWorker(&rctx, revoke, &revoked)
                  .ok());
  s = renew("");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("was revoked"));
}

}  // namespace
}  // namespace trainctl
