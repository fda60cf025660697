// Counts the coordinator's RPCs by method and status code, with a latency
// histogram per method, for its /metrics page. Fed by a gRPC server
// interceptor (NewInterceptorFactory), so handlers stay unaware of it.
//
// Latency is from the call's arrival to its status being sent: for a unary
// call the handler's time; for a stream (Session, WatchJob, GetLogs) the
// stream's life.
//
// The same interceptor makes two answers of gRPC itself say what happened:
//  - refusals are logged through a RefusalLog (one line per peer per
//    interval, with a count), never one line each;
//  - a request that does not parse: gRPC 1.51's callback handlers
//    (grpcpp/impl/codegen/server_callback_handlers.h) finish it with
//    UNIMPLEMENTED and an empty message before any handler runs. For a
//    method this server knows (its proto is in the generated pool) the
//    interceptor turns that into INVALID_ARGUMENT naming the request type.
//
// Thread-safe: an absl::Mutex guards the maps; histograms are atomics.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include <grpcpp/support/server_interceptor.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/prometheus.h"
#include "coordinator/core/refusal_log.h"

namespace trainctl::coordinator {

class RpcStats {
 public:
  // `method` as gRPC names it ("/trainctl.v1.JobService/GetJob").
  void Record(const std::string& method, int code, absl::Duration latency);
  // trainctl_rpcs_total{method,code} and trainctl_rpc_duration_seconds{method}.
  void Write(PromWriter& w) const;

  // An interceptor factory for grpc::ServerBuilder::experimental()
  // .SetInterceptorCreators; `this` and `refusals` (nullptr: refusals are
  // not logged) must outlive the server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewInterceptorFactory(
      RefusalLog* refusals = nullptr);

 private:
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> calls_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<LatencyHistogram>> latency_ ABSL_GUARDED_BY(mu_);
};

// "OK", "NOT_FOUND", ... for a grpc::StatusCode value.
std::string GrpcCodeName(int code);

// What a call of `method` ("/pkg.Service/Method") finished with `status`
// should answer instead: INVALID_ARGUMENT naming the request type for the
// empty UNIMPLEMENTED that gRPC sends when a known method's request does
// not parse; else `status` unchanged.
grpc::Status ExplainUnparsedRequest(const std::string& method, const grpc::Status& status);

}  // namespace trainctl::coordinator
