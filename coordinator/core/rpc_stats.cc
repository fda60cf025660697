#include "coordinator/core/rpc_stats.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>

#include <vector>

#include "absl/time/clock.h"
#include "common/log.h"
#include "coordinator/core/peer_address.h"

namespace trainctl::coordinator {
namespace {

class StatsInterceptor final : public grpc::experimental::Interceptor {
 public:
  StatsInterceptor(RpcStats* stats, RefusalLog* refusals, std::string method, std::string peer)
      : stats_(stats),
        refusals_(refusals),
        method_(std::move(method)),
        peer_(std::move(peer)),
        start_(absl::Now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      grpc::Status status = methods->GetSendStatus();
      grpc::Status explained = ExplainUnparsedRequest(method_, status);
      if (explained.error_code() != status.error_code()) {
        methods->ModifySendStatus(explained);
        status = explained;
      }
      stats_->Record(method_, status.error_code(), absl::Now() - start_);
      // A refused request, with the coordinator's reason, bounded per peer.
      // A cancelled stream (a watcher that went away) is not a refusal.
      if (refusals_ != nullptr && !status.ok() &&
          status.error_code() != grpc::StatusCode::CANCELLED) {
        refusals_->Note(peer_, {{"method", method_.substr(method_.rfind('/') + 1)},
                                {"code", GrpcCodeName(status.error_code())},
                                {"reason", status.error_message().substr(0, 300)}});
      }
    }
    methods->Proceed();
  }

 private:
  RpcStats* stats_;
  RefusalLog* refusals_;
  std::string method_;
  // The caller's IP address (what refusals are counted by).
  std::string peer_;
  absl::Time start_;
};

class StatsFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  StatsFactory(RpcStats* stats, RefusalLog* refusals) : stats_(stats), refusals_(refusals) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    std::string peer;
    if (info->server_context() != nullptr) {
      const std::string full = info->server_context()->peer();
      peer = PeerIp(full);
      if (peer.empty()) peer = full;  // an in-process or unix peer: its name
    }
    return new StatsInterceptor(
        stats_, refusals_, info->method() == nullptr ? "unknown" : info->method(), std::move(peer));
  }

 private:
  RpcStats* stats_;
  RefusalLog* refusals_;
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
  for (const auto& [method, h] : latency_)
    h->Write(w, "trainctl_rpc_duration_seconds", {{"method", method}});
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
RpcStats::NewInterceptorFactory(RefusalLog* refusals) {
  return std::make_unique<StatsFactory>(this, refusals);
}

grpc::Status ExplainUnparsedRequest(const std::string& method, const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNIMPLEMENTED || !status.error_message().empty())
    return status;
  // "/pkg.Service/Method" -> "pkg.Service.Method".
  if (method.size() < 2 || method[0] != '/') return status;
  std::string full = method.substr(1);
  const size_t slash = full.rfind('/');
  if (slash == std::string::npos) return status;
  full[slash] = '.';
  const google::protobuf::MethodDescriptor* m =
      google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(full);
  // Unknown here: a method this server does not have (a true UNIMPLEMENTED).
  if (m == nullptr) return status;
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      "request: not a valid " + m->input_type()->full_name() +
                          " (the message does not parse as protobuf)");
}

}  // namespace trainctl::coordinator
