#include "coordinator/rpc_stats.h"

#include <grpcpp/grpcpp.h>

#include <vector>

#include "absl/time/clock.h"
#include "common/log.h"

namespace trainctl::coordinator {
namespace {

class StatsInterceptor final : public grpc::experimental::Interceptor {
 public:
  StatsInterceptor(RpcStats* stats, std::string method)
      : stats_(stats), method_(std::move(method)), start_(absl::Now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      stats_->Record(method_, status.error_code(), absl::Now() - start_);
      // A refused request, once, with the coordinator's reason. A cancelled
      // stream (a watcher that went away) is not a refusal.
      if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
        LogEvent(LogLevel::kInfo, "coordinator", "rpc_refused",
                 {{"method", method_.substr(method_.rfind('/') + 1)},
                  {"code", GrpcCodeName(status.error_code())},
                  {"reason", status.error_message().substr(0, 300)}});
      }
    }
    methods->Proceed();
  }

 private:
  RpcStats* stats_;
  std::string method_;
  absl::Time start_;
};

class StatsFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit StatsFactory(RpcStats* stats) : stats_(stats) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new StatsInterceptor(stats_, info->method() == nullptr ? "unknown" : info->method());
  }

 private:
  RpcStats* stats_;
};

}  // namespace

std::string GrpcCodeName(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  if (code >= 0 && code < static_cast<int>(std::size(kNames))) return kNames[code];
  return std::to_string(code);
}

void RpcStats::Record(const std::string& method, int code, absl::Duration latency) {
  // "/pkg.Service/Method" → "pkg.Service/Method".
  std::string name = !method.empty() && method[0] == '/' ? method.substr(1) : method;
  LatencyHistogram* h;
  {
    absl::MutexLock lock(&mu_);
    ++calls_[{name, code}];
    std::unique_ptr<LatencyHistogram>& slot = latency_[name];
    if (slot == nullptr) slot = std::make_unique<LatencyHistogram>();
    h = slot.get();  // Never removed: stable after the lock.
  }
  h->Observe(latency);
}

void RpcStats::Write(PromWriter& w) const {
  absl::MutexLock lock(&mu_);
  w.Family("trainctl_rpcs_total", "counter", "RPCs served, by method and status code.");
  for (const auto& [key, n] : calls_) {
    w.Sample("trainctl_rpcs_total", {{"method", key.first}, {"code", GrpcCodeName(key.second)}},
             static_cast<double>(n));
  }
  w.Family("trainctl_rpc_duration_seconds", "histogram",
           "Time from an RPC's arrival to its status (a stream's whole life), by method.");
  for (const auto& [method, h] : latency_) h->Write(w, "trainctl_rpc_duration_seconds", {{"method", method}});
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RpcStats::NewInterceptorFactory() {
  return std::make_unique<StatsFactory>(this);
}

}  // namespace trainctl::coordinator
