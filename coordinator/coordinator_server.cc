#include "coordinator/coordinator_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace trainctl::coordinator {

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
  absl::Status recovered;
  loop_.RunSync([&] {
    registry_->Recover(snapshot.workers);
    recovered = jobs_->Recover(snapshot);
    telemetry_->Recover(snapshot);
  });
  TRAINCTL_RETURN_IF_ERROR(recovered);

  ServiceContext ctx{&loop_, store_.get(), registry_.get(), jobs_.get(), &hub_};
  ctx.telemetry = telemetry_.get();
  job_service_ = std::make_unique<JobServiceImpl>(ctx);
  worker_service_ = std::make_unique<WorkerServiceImpl>(ctx);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options_.listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(job_service_.get());
  builder.RegisterService(worker_service_.get());
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

std::shared_ptr<grpc::Channel> CoordinatorServer::InProcessChannel() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  return server_->InProcessChannel(args);
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
