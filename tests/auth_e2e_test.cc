// Authentication and roles end to end: a real coordinator and a real worker
// daemon on loopback (every hop carries a token), attacked by clients and
// fake workers with missing, wrong, revoked and expired tokens, while a
// victim job runs to SUCCEEDED. See docs/security.md.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/auth/pki.h"
#include "common/auth/secret.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "tests/support/source_dir.h"
#include "trainctl/v1/auth.grpc.pb.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using trainctl::testing::Cluster;
using trainctl::testing::SourceDir;

v1::JobSpec Spec(const std::string& name, int epochs) {
  ParsedJobSpec p = ParseJobSpecYaml(
      "model: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n",
      "auth.yaml", {"name=" + name, "world_size=1", absl::StrCat("training.epochs=", epochs)});
  EXPECT_TRUE(p.ok());
  return p.spec;
}

std::shared_ptr<grpc::Channel> ChannelWith(const std::string& address, const std::string& token) {
  auth::ChannelSecurity security;
  security.token = token;
  return *auth::MakeChannel(address, security, grpc::ChannelArguments());
}

std::chrono::system_clock::time_point Soon() {
  return std::chrono::system_clock::now() + std::chrono::seconds(5);
}

grpc::Status Submit(const std::string& address, const std::string& token, const v1::JobSpec& spec,
                    std::string* id = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Soon());
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  v1::SubmitJobResponse resp;
  grpc::Status s =
      v1::JobService::NewStub(ChannelWith(address, token))->SubmitJob(&ctx, req, &resp);
  if (id != nullptr) *id = resp.job().id();
  return s;
}

grpc::Status GetJob(const std::string& address, const std::string& token, const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Soon());
  v1::GetJobRequest req;
  req.set_job_id(id);
  v1::Job job;
  return v1::JobService::NewStub(ChannelWith(address, token))->GetJob(&ctx, req, &job);
}

grpc::Status GetMetrics(const std::string& address, const std::string& token,
                        const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Soon());
  v1::GetMetricsRequest req;
  req.set_job_id(id);
  v1::GetMetricsResponse resp;
  return v1::JobService::NewStub(ChannelWith(address, token))->GetMetrics(&ctx, req, &resp);
}

grpc::Status Cancel(const std::string& address, const std::string& token, const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Soon());
  v1::CancelJobRequest req;
  req.set_job_id(id);
  v1::Job job;
  return v1::JobService::NewStub(ChannelWith(address, token))->CancelJob(&ctx, req, &job);
}

// Opens a Session with `token` and registers as `worker_id`; the status the
// coordinator ends it with (OK when it acknowledged the registration).
grpc::Status RegisterAs(const std::string& address, const std::string& token,
                        const std::string& worker_id, auth::ChannelSecurity security = {}) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Soon());
  security.token = token;
  auto stub =
      v1::WorkerService::NewStub(*auth::MakeChannel(address, security, grpc::ChannelArguments()));
  auto stream = stub->Session(&ctx);
  v1::WorkerMessage reg;
  reg.mutable_register_()->set_worker_id(worker_id);
  reg.mutable_register_()->set_hostname("evil");
  reg.mutable_register_()->set_address("6.6.6.6");
  v1::Slot* slot = reg.mutable_register_()->add_slots();
  slot->set_kind(v1::Slot::KIND_CPU);
  stream->Write(reg);
  v1::CoordinatorMessage in;
  if (stream->Read(&in) && in.has_register_ack()) {
    ctx.TryCancel();
    stream->Finish();
    return grpc::Status::OK;
  }
  return stream->Finish();
}

// RegisterAs for an id a session of this test held just before: the
// coordinator frees the id when it sees that session's cancel, which comes
// after RegisterAs returned (on a loaded machine, later still); until then a
// new session for it is refused as ALREADY_EXISTS.
grpc::Status RegisterAgainAs(const std::string& address, const std::string& token,
                             const std::string& worker_id, const auth::ChannelSecurity& security) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (true) {
    grpc::Status s = RegisterAs(address, token, worker_id, security);
    if (s.error_code() != grpc::StatusCode::ALREADY_EXISTS ||
        std::chrono::steady_clock::now() > deadline) {
      return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

TEST(AuthE2ETest, TokensAndRolesAreEnforcedWhileAVictimJobSucceeds) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.StartWorker("real", 2));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  const std::string addr = cluster.address();

  const std::string alice = cluster.CreateToken(v1::ROLE_SUBMITTER, "alice");
  const std::string bob = cluster.CreateToken(v1::ROLE_SUBMITTER, "bob");
  const std::string viewer = cluster.CreateToken(v1::ROLE_VIEWER, "carol");
  const std::string intruder_worker = cluster.CreateToken(v1::ROLE_WORKER, "intruder");
  const std::string shortlived = cluster.CreateToken(v1::ROLE_SUBMITTER, "brief", /*ttl_s=*/1);
  ASSERT_FALSE(alice.empty() || bob.empty() || viewer.empty() || intruder_worker.empty() ||
               shortlived.empty());

  std::string victim;
  ASSERT_TRUE(Submit(addr, alice, Spec("slow-victim", 3), &victim).ok());

  // No token, a garbage token.
  grpc::Status s = GetJob(addr, "", victim);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("no token"));
  s = GetMetrics(addr, "", victim);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "GetMetrics without a token";
  s = GetJob(addr, "tct_t-00000000_" + std::string(64, 'f'), victim);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("unknown token"));

  // A viewer reads but may not submit, cancel or manage tokens.
  EXPECT_TRUE(GetJob(addr, viewer, victim).ok());
  s = Submit(addr, viewer, Spec("nope", 1));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("SubmitJob needs role admin or submitter"));
  EXPECT_EQ(Cancel(addr, viewer, victim).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  {
    grpc::ClientContext ctx;
    v1::CreateTokenRequest req;
    req.set_role(v1::ROLE_ADMIN);
    v1::CreateTokenResponse resp;
    s = v1::AuthService::NewStub(ChannelWith(addr, alice))->CreateToken(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << "a submitter cannot mint an admin";
    EXPECT_THAT(s.error_message(), HasSubstr("needs role admin"));
  }

  // Another submitter may not cancel alice's job.
  s = Cancel(addr, bob, victim);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("belongs to 'alice'"));

  // A revoked token stops working at once.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(Soon());
    v1::ListTokensRequest list;
    v1::ListTokensResponse tokens;
    auto admin = v1::AuthService::NewStub(ChannelWith(addr, cluster.admin_token()));
    ASSERT_TRUE(admin->ListTokens(&ctx, list, &tokens).ok());
    std::string bob_id;
    for (const v1::Token& t : tokens.tokens()) {
      if (t.name() == "bob") bob_id = t.id();
    }
    ASSERT_EQ(bob_id, auth::TokenIdOfSecret(bob));
    grpc::ClientContext rctx;
    v1::RevokeTokenRequest revoke;
    revoke.set_id(bob_id);
    v1::Token revoked;
    ASSERT_TRUE(admin->RevokeToken(&rctx, revoke, &revoked).ok());
    EXPECT_TRUE(revoked.revoked());
  }
  s = GetJob(addr, bob, victim);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("revoked"));

  // An expired token (ttl 1 s).
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  do {
    s = GetJob(addr, shortlived, victim);
    if (!s.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < deadline);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("expired"));

  // Client tokens on the worker service, and a worker token on the job service.
  s = RegisterAs(addr, alice, "fake-1");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("Session needs role worker"));
  EXPECT_EQ(RegisterAs(addr, "", "fake-1").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(GetJob(addr, intruder_worker, victim).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  // A worker token may not take the real worker's id (its rank and job).
  std::string real_id;
  {
    grpc::ClientContext ctx;
    v1::ListWorkersResponse workers;
    ASSERT_TRUE(cluster.workers_stub()->ListWorkers(&ctx, v1::ListWorkersRequest(), &workers).ok());
    ASSERT_EQ(workers.workers_size(), 1);
    real_id = workers.workers(0).id();
  }
  s = RegisterAs(addr, intruder_worker, real_id);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("belongs to another token"));
  // Its own, new id is fine (it is a real worker token), but gets nothing of the victim's.
  EXPECT_TRUE(RegisterAs(addr, intruder_worker, "").ok());

  // The owner may cancel its own job; the victim is untouched throughout.
  std::string own;
  ASSERT_TRUE(Submit(addr, alice, Spec("own", 50), &own).ok());
  EXPECT_TRUE(Cancel(addr, alice, own).ok());

  v1::Job done = cluster.WaitState(victim, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.state_reason();
  EXPECT_EQ(done.owner(), "alice");
  EXPECT_EQ(done.owner_token_id(), auth::TokenIdOfSecret(alice));
}

// After a coordinator restart the bindings and tokens hold: the real worker
// comes back under its id, a fake with another token cannot take it first.
TEST(AuthE2ETest, WorkerIdsStayBoundAcrossACoordinatorRestart) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.StartWorker("real", 1));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  const std::string intruder = cluster.CreateToken(v1::ROLE_WORKER, "intruder");
  std::string real_id;
  {
    grpc::ClientContext ctx;
    v1::ListWorkersResponse workers;
    ASSERT_TRUE(cluster.workers_stub()->ListWorkers(&ctx, v1::ListWorkersRequest(), &workers).ok());
    real_id = workers.workers(0).id();
  }
  std::string victim = cluster.Submit(Spec("slow-victim", 3));
  ASSERT_FALSE(victim.empty());
  ASSERT_EQ(cluster.WaitState(victim, v1::JOB_STATE_RUNNING, absl::Seconds(30)).state(),
            v1::JOB_STATE_RUNNING);
  cluster.KillCoordinator(SIGKILL);
  cluster.worker("real")->Kill(SIGSTOP);  // Silent while the fake races it.
  ASSERT_TRUE(cluster.StartCoordinator());
  grpc::Status s = RegisterAs(cluster.address(), intruder, real_id);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("belongs to another token"));
  cluster.worker("real")->Kill(SIGCONT);
  v1::Job done = cluster.WaitState(victim, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.state_reason();
}

grpc::Status GetJobOver(const std::string& address, const std::string& token, const std::string& ca,
                        const std::string& id) {
  auth::ChannelSecurity security;
  security.token = token;
  security.ca_file = ca;
  grpc::ClientContext ctx;
  ctx.set_deadline(Soon());
  v1::GetJobRequest req;
  req.set_job_id(id);
  v1::Job job;
  return v1::JobService::NewStub(*auth::MakeChannel(address, security, grpc::ChannelArguments()))
      ->GetJob(&ctx, req, &job);
}

// Over TLS (`trainctl-coordinator init`, --tls_dir): a real worker joins with
// the CA and a worker token; plaintext clients and clients trusting another
// CA get nothing; tokens and roles still hold; the victim job succeeds.
TEST(AuthE2ETest, TlsRefusesPlaintextAndForeignCas) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.InitTls());
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.StartWorker("real", 1));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  const std::string addr = cluster.address();
  std::string victim = cluster.Submit(Spec("slow-victim", 3));
  ASSERT_FALSE(victim.empty());

  EXPECT_TRUE(GetJobOver(addr, cluster.admin_token(), cluster.ca_file(), victim).ok());
  // Plaintext to a TLS port: no answer.
  grpc::Status s = GetJobOver(addr, cluster.admin_token(), "", victim);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  // A client that trusts another CA refuses the coordinator's certificate.
  absl::StatusOr<auth::KeyAndCert> other = auth::NewCa("someone else's CA", absl::Hours(1));
  ASSERT_TRUE(other.ok());
  const std::string other_ca = cluster.dir() + "/other-ca.crt";
  ASSERT_TRUE(auth::WritePrivateFile(other_ca, other->cert_pem).ok());
  s = GetJobOver(addr, cluster.admin_token(), other_ca, victim);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  // TLS does not replace tokens: none, or a client token on the worker service.
  s = GetJobOver(addr, "", cluster.ca_file(), victim);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const std::string viewer = cluster.CreateToken(v1::ROLE_VIEWER, "carol");
  ASSERT_FALSE(viewer.empty());
  {
    auth::ChannelSecurity security;
    security.token = viewer;
    security.ca_file = cluster.ca_file();
    grpc::ClientContext ctx;
    ctx.set_deadline(Soon());
    auto stream =
        v1::WorkerService::NewStub(*auth::MakeChannel(addr, security, grpc::ChannelArguments()))
            ->Session(&ctx);
    v1::CoordinatorMessage in;
    EXPECT_FALSE(stream->Read(&in));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }

  // Mutual TLS: a worker certificate the cluster CA signed names the worker;
  // it registers as that id only, with no token. A certificate from another
  // CA does not get through the handshake.
  auto write_cert = [&](const auth::KeyAndCert& ca, const std::string& cn,
                        const std::string& stem) {
    std::string key = *auth::NewPrivateKey();
    absl::StatusOr<std::string> cert = auth::SignCsr(ca, *auth::NewCsr(key, cn), cn, {},
                                                     absl::Hours(1), auth::CertPurpose::kClient);
    EXPECT_TRUE(cert.ok()) << cert.status();
    EXPECT_TRUE(auth::WritePrivateFile(stem + ".key", key).ok());
    EXPECT_TRUE(auth::WritePrivateFile(stem + ".crt", *cert).ok());
    auth::ChannelSecurity security;
    security.ca_file = cluster.ca_file();
    security.cert_file = stem + ".crt";
    security.key_file = stem + ".key";
    return security;
  };
  auth::KeyAndCert cluster_ca{*auth::ReadFile(cluster.dir() + "/tls/ca.key"),
                              *auth::ReadFile(cluster.ca_file())};
  auth::ChannelSecurity mine =
      write_cert(cluster_ca, "cert-worker", cluster.dir() + "/cert-worker");
  std::string real_id;
  {
    grpc::ClientContext ctx;
    v1::ListWorkersResponse workers;
    ASSERT_TRUE(cluster.workers_stub()->ListWorkers(&ctx, v1::ListWorkersRequest(), &workers).ok());
    real_id = workers.workers(0).id();
  }
  s = RegisterAs(addr, "", real_id, mine);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << "another worker's id";
  EXPECT_THAT(s.error_message(), HasSubstr("certificate is for 'cert-worker'"));
  EXPECT_TRUE(RegisterAs(addr, "", "cert-worker", mine).ok()) << "its own id, no token needed";
  s = RegisterAgainAs(addr, "", "", mine);
  EXPECT_TRUE(s.ok()) << "no id asked: the certificate's: " << s.error_message();
  auth::ChannelSecurity forged = write_cert(*other, "cert-worker", cluster.dir() + "/forged");
  s = RegisterAs(addr, "", "cert-worker", forged);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  // Without a certificate and without a token: refused.
  auth::ChannelSecurity bare;
  bare.ca_file = cluster.ca_file();
  EXPECT_EQ(RegisterAs(addr, "", "cert-worker", bare).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  v1::Job done = cluster.WaitState(victim, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.state_reason();
}

// AuthService.Join with `token` over TLS (the cluster CA) for a new key's CSR.
grpc::Status JoinWith(const std::string& address, const std::string& ca_file,
                      const std::string& token, const std::string& worker_id,
                      v1::JoinResponse* resp = nullptr) {
  auth::ChannelSecurity security;
  security.token = token;
  security.ca_file = ca_file;
  grpc::ClientContext ctx;
  ctx.set_deadline(Soon());
  v1::JoinRequest req;
  req.set_worker_id(worker_id);
  req.set_csr_pem(*auth::NewCsr(*auth::NewPrivateKey(), "whatever"));
  v1::JoinResponse ignored;
  return v1::AuthService::NewStub(*auth::MakeChannel(address, security, grpc::ChannelArguments()))
      ->Join(&ctx, req, resp != nullptr ? resp : &ignored);
}

// TLS bootstrap: a real worker daemon joins with a one-time join token (its
// key stays in its work dir, mode 0600), runs a job to SUCCEEDED under the
// id its certificate names, and after a SIGKILL comes back on the stored
// certificate though the token is spent. The token cannot be reused; an
// expired, a worker-role or a plaintext join is refused; a joined worker
// cannot register as another worker, and nobody can join as a known id.
TEST(AuthE2ETest, WorkerJoinsWithAOneTimeTokenAndKeepsItsCertificate) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.InitTls());
  ASSERT_TRUE(cluster.StartCoordinator());
  const std::string addr = cluster.address();
  const std::string join = cluster.CreateToken(v1::ROLE_JOIN, "rack-3");
  ASSERT_FALSE(join.empty());
  const std::string join_file = cluster.dir() + "/join.token";
  ASSERT_TRUE(auth::WritePrivateFile(join_file, join + "\n").ok());
  ASSERT_TRUE(cluster.StartWorker("joined", 1, false, {"--join_token_file=" + join_file}));
  ASSERT_TRUE(cluster.WaitWorkers(1)) << cluster.worker("joined")->ReadLog();

  const std::string work = cluster.dir() + "/worker-joined";
  absl::StatusOr<std::string> cert = auth::ReadFile(work + "/worker.crt");
  ASSERT_TRUE(cert.ok()) << cert.status();
  std::string joined_id = *auth::CertCommonName(*cert);
  for (const char* f : {"/worker.crt", "/worker.key"}) {
    struct stat st;
    ASSERT_EQ(stat((work + f).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << f;
  }
  {
    grpc::ClientContext ctx;
    v1::ListWorkersResponse workers;
    ASSERT_TRUE(cluster.workers_stub()->ListWorkers(&ctx, v1::ListWorkersRequest(), &workers).ok());
    ASSERT_EQ(workers.workers_size(), 1);
    EXPECT_EQ(workers.workers(0).id(), joined_id) << "registered as its certificate's id";
  }
  std::string victim = cluster.Submit(Spec("on-joined", 3));
  ASSERT_FALSE(victim.empty());

  // The join token is spent.
  grpc::Status s = JoinWith(addr, cluster.ca_file(), join, "");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("already used"));
  // An expired one.
  const std::string brief = cluster.CreateToken(v1::ROLE_JOIN, "brief", /*ttl_s=*/1);
  ASSERT_FALSE(brief.empty());
  absl::SleepFor(absl::Milliseconds(1500));  // past its expiry (whole seconds on the server)
  s = JoinWith(addr, cluster.ca_file(), brief, "late");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("expired"));
  // Not a join token; no token; plaintext.
  const std::string worker_token = cluster.CreateToken(v1::ROLE_WORKER, "plain-worker");
  s = JoinWith(addr, cluster.ca_file(), worker_token, "");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("Join needs role join"));
  EXPECT_EQ(JoinWith(addr, cluster.ca_file(), "", "").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Nobody joins as a known worker (that would be a second key for its id);
  // a refused join leaves the token usable.
  const std::string second = cluster.CreateToken(v1::ROLE_JOIN, "second");
  s = JoinWith(addr, cluster.ca_file(), second, joined_id);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(s.error_message(), HasSubstr("already known"));
  s = JoinWith(addr, cluster.ca_file(), second, "bad/id");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("worker_id"));
  v1::JoinResponse other;
  s = JoinWith(addr, cluster.ca_file(), second, "other-worker", &other);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(other.worker_id(), "other-worker");
  EXPECT_EQ(*auth::CertCommonName(other.cert_pem()), "other-worker");
  // A token worker cannot take an id a certificate was issued for.
  s = RegisterAs(addr, worker_token, "other-worker", [&] {
    auth::ChannelSecurity tls;
    tls.ca_file = cluster.ca_file();
    return tls;
  }());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);

  // The joined worker's certificate registers only as itself.
  auth::ChannelSecurity joined;
  joined.ca_file = cluster.ca_file();
  joined.cert_file = work + "/worker.crt";
  joined.key_file = work + "/worker.key";
  s = RegisterAs(addr, "", "other-worker", joined);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("certificate is for '" + joined_id + "'"));

  v1::Job done = cluster.WaitState(victim, v1::JOB_STATE_SUCCEEDED, absl::Seconds(90));
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.state_reason();
  ASSERT_GE(done.attempts_size(), 1);
  EXPECT_EQ(done.attempts(done.attempts_size() - 1).ranks(0).worker_id(), joined_id);
  // Its rendezvous report named its own address (a name in its certificate).
  EXPECT_EQ(done.attempts(done.attempts_size() - 1).rendezvous().master_addr(), "127.0.0.1");

  // A restart reuses the stored certificate: the spent token is not needed
  // (its file is even gone), and the next job runs on the same worker id.
  cluster.KillWorker("joined", SIGKILL);
  ASSERT_EQ(std::remove(join_file.c_str()), 0);
  ASSERT_TRUE(cluster.StartWorker("joined", 1, false, {"--join_token_file=" + join_file}));
  std::string after = cluster.Submit(Spec("after-restart", 1));
  ASSERT_FALSE(after.empty());
  done = cluster.WaitState(after, v1::JOB_STATE_SUCCEEDED, absl::Seconds(90));
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED)
      << done.state_reason() << cluster.worker("joined")->ReadLog();
  ASSERT_GE(done.attempts_size(), 1);
  EXPECT_EQ(done.attempts(done.attempts_size() - 1).ranks(0).worker_id(), joined_id);
  EXPECT_EQ(*auth::ReadFile(work + "/worker.crt"), *cert) << "the same certificate, not a new join";
  EXPECT_THAT(cluster.worker("joined")->ReadLog(), ::testing::Not(HasSubstr("already used")));
}

// `init --listen HOST:PORT` writes the port the coordinator will listen on
// into the CLI config (it wrote 7070 whatever --listen said).
TEST(AuthE2ETest, InitWritesTheListenPortIntoTheCliConfig) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  const std::string dir = cluster.dir() + "/tls-9443";
  const std::string cmd =
      absl::StrCat(trainctl::testing::BuildDirOfThisTest(),
                   "/coordinator/trainctl-coordinator init --dir=", dir, " --db=", cluster.dir(),
                   "/state.db --listen=0.0.0.0:9443 > ", cluster.dir(), "/init.log 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  absl::StatusOr<std::string> config = auth::ReadFile(dir + "/trainctl.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_THAT(*config, ::testing::MatchesRegex("(.|\n)*coordinator: \"[^\"]+:9443\"(.|\n)*"));
}

// Join needs TLS: the certificate is never sent in clear.
TEST(AuthE2ETest, JoinOverPlaintextIsRefused) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.StartCoordinator());
  const std::string join = cluster.CreateToken(v1::ROLE_JOIN, "clear");
  ASSERT_FALSE(join.empty());
  grpc::Status s = JoinWith(cluster.address(), "", join, "");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("needs TLS"));
}

// Secure by default: plaintext only on loopback; elsewhere it takes
// --insecure, and a warning at every start.
TEST(AuthE2ETest, PlaintextOnANonLoopbackAddressNeedsInsecure) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  EXPECT_FALSE(cluster.StartCoordinator({"--listen=0.0.0.0:0"}));
  std::ifstream refused(cluster.dir() + "/coordinator-0.log");
  std::string text((std::istreambuf_iterator<char>(refused)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("is not a loopback address and no TLS certificate is set"));
  ASSERT_TRUE(cluster.StartCoordinator({"--listen=0.0.0.0:0", "--insecure"}));
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  std::string warned;
  while (absl::Now() < deadline && warned.find("WARNING") == std::string::npos) {
    std::ifstream log(cluster.dir() + "/coordinator-1.log");
    warned.assign((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_THAT(warned, HasSubstr("WARNING: --insecure: serving plaintext"));
}

}  // namespace
}  // namespace trainctl
