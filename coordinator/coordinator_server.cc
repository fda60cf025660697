#include "coordinator/coordinator_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/auth/secret.h"
#include "common/status_macros.h"

namespace trainctl::coordinator {

bool IsLoopbackListen(const std::string& listen) {
  if (absl::StartsWith(listen, "unix:")) return true;
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

CoordinatorServer::CoordinatorServer(CoordinatorOptions options) : options_(std::move(options)) {}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

absl::StatusOr<std::string> CoordinatorServer::Start() {
  TRAINCTL_ASSIGN_OR_RETURN(store_, StateStore::Open(options_.db_path, options_.store));
  TRAINCTL_ASSIGN_OR_RETURN(StoreSnapshot snapshot, store_->LoadAll());
  registry_ = std::make_unique<WorkerRegistry>(store_.get(), options_.clock, options_.registry);
  jobs_ = std::make_unique<JobManager>(store_.get(), registry_.get(), &hub_, options_.clock,
                                       options_.jobs);
  jobs_->SetDeferral([this](std::function<void()> fn) { loop_.Post(std::move(fn)); });
  telemetry_ = std::make_unique<TelemetryLedger>(store_.get());
  tokens_ = std::make_unique<TokenAuthority>(store_.get(), options_.clock);
  TRAINCTL_RETURN_IF_ERROR(tokens_->Load());
  if (options_.admin_token.empty()) options_.admin_token = auth::NewSecret("admin");
  tokens_->SetBootstrapAdmin(options_.admin_token);
  absl::Status recovered;
  loop_.RunSync([&] {
    registry_->Recover(snapshot.workers);
    recovered = jobs_->Recover(snapshot);
    telemetry_->Recover(snapshot);
  });
  TRAINCTL_RETURN_IF_ERROR(recovered);

  ServiceContext ctx{&loop_, store_.get(), registry_.get(), jobs_.get(), &hub_};
  ctx.telemetry = telemetry_.get();
  ctx.auth = tokens_.get();
  job_service_ = std::make_unique<JobServiceImpl>(ctx);
  worker_service_ = std::make_unique<WorkerServiceImpl>(ctx);
  auth_service_ = std::make_unique<AuthServiceImpl>(ctx);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (!options_.tls_cert_pem.empty()) {
    grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = options_.tls_ca_pem;
    ssl.pem_key_cert_pairs.push_back({options_.tls_key_pem, options_.tls_cert_pem});
    creds = grpc::SslServerCredentials(ssl);
  } else {
    if (!IsLoopbackListen(options_.listen) && !options_.insecure) {
      return absl::FailedPreconditionError(absl::StrCat(
          "listen: ", options_.listen, " is not a loopback address and no TLS certificate is set: "
          "serve TLS (--tls-dir, made by `trainctl-coordinator init`) or pass --insecure"));
    }
    creds = grpc::InsecureServerCredentials();
  }
  builder.AddListeningPort(options_.listen, creds, &port);
  builder.RegisterService(job_service_.get());
  builder.RegisterService(worker_service_.get());
  builder.RegisterService(auth_service_.get());
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  builder.SetMaxSendMessageSize(options_.max_message_bytes);
  // Keepalive: find dead peers on idle streams; accept the workers' pings.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.listen));
  }

  loop_.Every(options_.check_interval, [this] {
    for (const std::string& id : registry_->ExpireLeases()) jobs_->OnWorkerLost(id);
    jobs_->Tick();
    registry_->ForgetGone([this](const std::string& id) { return !jobs_->BusySlots(id).empty(); });
  });
  std::string host = options_.listen.substr(0, options_.listen.rfind(':'));
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<std::string> CoordinatorServer::IssueToken(v1::Role role, const std::string& name,
                                                          absl::Duration ttl) {
  v1::CreateTokenRequest req;
  req.set_role(role);
  req.set_name(name);
  req.mutable_ttl()->set_seconds(absl::ToInt64Seconds(ttl));
  absl::StatusOr<v1::CreateTokenResponse> r = absl::InternalError("not run");
  loop_.RunSync([&] { r = tokens_->Create(req, Principal{"embedded", "embedded", v1::ROLE_ADMIN}); });
  if (!r.ok()) return r.status();
  return r->secret();
}

std::shared_ptr<grpc::Channel> CoordinatorServer::InProcessChannel(const std::string& token) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  return server_->experimental().InProcessChannelWithInterceptors(args, auth::BearerInterceptors(token));
}

void CoordinatorServer::Wait() {
  if (server_) server_->Wait();
}

void CoordinatorServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (server_) {
    // Streams (sessions, watchers) are cancelled after the deadline.
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  loop_.StopAndJoin();
}

}  // namespace trainctl::coordinator
