// grpc.health.v1.Health for the active coordinator, answered from a
// predicate asked at each call: SERVING only while the coordinator surely
// holds its store (StateStore::lease_confirmed, and not deposed). gRPC's
// default health service answers from a status set beforehand, so a
// coordinator stopped past its lease (SIGSTOP, a stall) answered SERVING
// for the moment after SIGCONT before it found out it had been deposed,
// while the new active also said SERVING.
//
// Served as a generic service: only Check is answered (HealthCheckResponse
// SERVING or NOT_SERVING for "" and for each of `services`; NOT_FOUND for
// another name). Watch is UNIMPLEMENTED, which the health protocol tells
// clients to read as "health checking is not offered here" (client-side
// health checking then treats the server as healthy); probes (Docker's
// HEALTHCHECK, Kubernetes' grpc probe, grpc_health_probe) use Check. Any
// other method the server has no service for is UNIMPLEMENTED, as without
// this service.
//
// Thread-safe: `serving` is called on gRPC's threads; it must not block.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <grpcpp/generic/async_generic_service.h>

namespace trainctl::coordinator {

class HealthService final : public grpc::CallbackGenericService {
 public:
  HealthService(std::vector<std::string> services, std::function<bool()> serving)
      : services_(std::move(services)), serving_(std::move(serving)) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

  // The HealthCheckRequest's service name from its wire bytes; false when
  // they do not parse. (The health proto is not part of the build: its two
  // messages are one field each.)
  static bool ParseRequest(const std::string& bytes, std::string* service);
  // A HealthCheckResponse's wire bytes for `status` (1 SERVING, 2 NOT_SERVING).
  static std::string Response(int status);

 private:
  class Call;
  const std::vector<std::string> services_;
  const std::function<bool()> serving_;
};

}  // namespace trainctl::coordinator
