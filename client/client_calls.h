// What client.cc and client_streams.cc share (internal to the client
// library, not installed): where calls go (Endpoints), the gRPC status rule
// (FromGrpc), and the one helper every unary call goes through (Call).
// Not thread-safe, as Client.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/coordinator_failover.h"
#include "trainctl/client.h"

namespace trainctl {
namespace client_internal {

inline std::chrono::system_clock::time_point Deadline(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
}

// gRPC status -> absl::Status with the same code. Connection problems name
// the address; everything else keeps the coordinator's message as it is.
absl::Status FromGrpc(const grpc::Status& s, const std::string& address);

// Where calls go: Connect's list of coordinators (one channel per address,
// the failover rule of common/coordinator_failover.h), or FromChannel's one
// channel (no failover: it is the caller's).
struct Endpoints {
  ClientOptions options;
  std::unique_ptr<CoordinatorChannels> coordinators;
  std::shared_ptr<grpc::Channel> fixed;

  // The channel to use now and the address it reaches (for messages).
  absl::StatusOr<std::pair<std::shared_ptr<grpc::Channel>, std::string>> Current() {
    if (fixed != nullptr) return std::make_pair(fixed, options.address);
    std::string address = coordinators->rotation().Current();
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = coordinators->Get(address);
    if (!channel.ok()) return channel.status();
    return std::make_pair(*channel, address);
  }
  // A stream that ended with `status` before delivering anything, on
  // `address`: where to open it next (the hint, else the next address).
  void StreamFailed(const std::string& address, const grpc::Status& status,
                    const grpc::ClientContext& ctx) {
    if (fixed != nullptr) return;
    if (std::optional<std::string> hint = ActiveCoordinatorHint(status, ctx); hint.has_value()) {
      coordinators->rotation().Follow(*hint);
      return;
    }
    coordinators->Forget(address);
    coordinators->rotation().Unreachable(address);
  }
  void Answered(const std::string& address) {
    if (fixed == nullptr) coordinators->rotation().Answered(address);
  }
};

// One unary call under the client's deadline with the failover rule:
// `rpc` is the stub's method (&v1::JobService::Stub::GetJob); the call's
// status with the address named.
template <typename Stub, typename Request, typename Response>
absl::Status Unary(Endpoints& e,
                   grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
                   const Request& req, Response* resp, Idempotency idempotency) {
  if (e.fixed != nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(e.options.timeout));
    Stub stub(e.fixed);
    return FromGrpc((stub.*rpc)(&ctx, req, resp), e.options.address);
  }
  std::string address;
  grpc::Status s = CallWithFailover(
      *e.coordinators, absl::Now() + e.options.timeout, idempotency,
      [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* ctx) {
        Stub stub(channel);
        resp->Clear();
        return (stub.*rpc)(ctx, req, resp);
      },
      &address);
  return FromGrpc(s, address);
}

}  // namespace client_internal

struct Client::Stubs {
  client_internal::Endpoints endpoints;

  // A unary call (client_internal::Unary) answered with its response:
  // `rpc` is the stub's method (&v1::QueueService::Stub::GetQueue).
  template <typename Stub, typename Request, typename Response>
  absl::StatusOr<Response> Call(grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&,
                                                          Response*),
                                const Request& req, Idempotency idempotency) {
    Response resp;
    if (absl::Status s = client_internal::Unary(endpoints, rpc, req, &resp, idempotency); !s.ok())
      return s;
    return resp;
  }
};

}  // namespace trainctl
