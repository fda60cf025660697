#include "coordinator/ha/standby_server.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace trainctl::coordinator {

std::string StandbyMessage(const std::string& active) {
  return active.empty()
             ? "standby coordinator; no active coordinator is known yet"
             : absl::StrCat("standby coordinator; the active coordinator is at ", active);
}

// Every method the server has no service for: UNAVAILABLE with the hint.
class StandbyServer::Generic final : public grpc::CallbackGenericService {
 public:
  explicit Generic(StandbyServer* owner) : owner_(owner) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    class Refusal final : public grpc::ServerGenericBidiReactor {
     public:
      Refusal(grpc::GenericCallbackServerContext* ctx, const std::string& active) {
        if (!active.empty()) ctx->AddTrailingMetadata(kActiveCoordinatorKey, active);
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, StandbyMessage(active)));
      }
      void OnDone() override { delete this; }
    };
    return new Refusal(ctx, owner_->active());
  }

 private:
  StandbyServer* owner_;
};

StandbyServer::StandbyServer(const CoordinatorOptions& options) : options_(options) {}

StandbyServer::~StandbyServer() { Shutdown(); }

absl::StatusOr<int> StandbyServer::Start() {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  TRAINCTL_RETURN_IF_ERROR(ConfigureCoordinatorListener(options_, builder, &port));
  generic_ = std::make_unique<Generic>(this);
  builder.RegisterCallbackGenericService(generic_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    server_.reset();
    return absl::UnavailableError(absl::StrCat("standby: cannot listen on ", options_.listen));
  }
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health != nullptr) {
    health->SetServingStatus("", false);
    for (const std::string& name : CoordinatorServiceNames()) health->SetServingStatus(name, false);
  }
  return port;
}

void StandbyServer::SetActive(const std::string& address) {
  absl::MutexLock lock(&mu_);
  active_ = address;
}

std::string StandbyServer::active() const {
  absl::MutexLock lock(&mu_);
  return active_;
}

void StandbyServer::Shutdown() {
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_->Wait();
  server_.reset();
}

}  // namespace trainctl::coordinator
