// The contract's stand-in standby (standby_stand_in.h).
#include "tests/support/standby_stand_in.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"

namespace trainctl::testing {

namespace {
constexpr char kActiveKey[] = "trainctl-active-coordinator";
}  // namespace

using Mode = StandbyStandIn::Mode;

class StandbyStandIn::Service final : public grpc::CallbackGenericService {
 public:
  Service(std::string active, Mode mode) : active_(std::move(active)), mode_(mode) {}

  void set_active(std::string active) {
    absl::MutexLock lock(&mu_);
    active_ = std::move(active);
  }
  int64_t calls(const std::string& method) {
    absl::MutexLock lock(&mu_);
    if (method.empty()) return total_;
    auto it = by_method_.find(method);
    return it == by_method_.end() ? 0 : it->second;
  }

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    std::string active;
    {
      absl::MutexLock lock(&mu_);
      active = active_;
      ++total_;
      ++by_method_[ctx->method()];
    }
    class Refuse final : public grpc::ServerGenericBidiReactor {
     public:
      Refuse(grpc::GenericCallbackServerContext* ctx, const std::string& active, Mode mode) {
        if (mode == Mode::kLostAnswer) {
          Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed"));
          return;
        }
        if (!active.empty()) ctx->AddTrailingMetadata(kActiveKey, active);
        Finish(grpc::Status(
            grpc::StatusCode::UNAVAILABLE,
            active.empty()
                ? "standby coordinator; no active coordinator is known yet"
                : absl::StrCat("standby coordinator; the active coordinator is at ", active)));
      }
      void OnDone() override { delete this; }
    };
    return new Refuse(ctx, active, mode_);
  }

 private:
  absl::Mutex mu_;
  std::string active_ ABSL_GUARDED_BY(mu_);
  const Mode mode_;
  int64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> by_method_ ABSL_GUARDED_BY(mu_);
};

StandbyStandIn::StandbyStandIn(std::string active, Mode mode)
    : service_(std::make_unique<Service>(std::move(active), mode)) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterCallbackGenericService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) return;
  address_ = absl::StrCat("127.0.0.1:", port);
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
      health != nullptr) {
    health->SetServingStatus(false);
  }
}

StandbyStandIn::~StandbyStandIn() {
  if (server_ != nullptr)
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

void StandbyStandIn::set_active(std::string active) { service_->set_active(std::move(active)); }
int64_t StandbyStandIn::calls() { return service_->calls(""); }
int64_t StandbyStandIn::calls(const std::string& method) { return service_->calls(method); }

}  // namespace trainctl::testing
