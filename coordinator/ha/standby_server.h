// What a standby coordinator serves on its --listen port while another
// coordinator holds the PostgreSQL store (docs/operator.md, "High
// availability"): the standard health service saying NOT_SERVING for ""
// and for every service the active one serves, and for every other method
// UNAVAILABLE with the message `standby coordinator; the active coordinator
// is at HOST:PORT` (or `...; no active coordinator is known yet`) and the
// trailing metadata `trainctl-active-coordinator: HOST:PORT` (absent when
// unknown). Clients follow that hint; the key and the code are a contract
// (client/ reads them). No token is checked: the answer says only where
// the active coordinator is, which its clients know anyway.
//
// Used by AwaitLeadership (await_leadership.h) until this process takes
// the lock; then Shutdown() frees the port for the real server.
//
// Threading: SetActive may be called from any thread while gRPC's threads
// answer calls; Start and Shutdown from one thread.
#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/server/coordinator_server.h"

namespace grpc {
class CallbackGenericService;
class Server;
}  // namespace grpc

namespace trainctl::coordinator {

// The trailing metadata key naming the active coordinator.
inline constexpr char kActiveCoordinatorKey[] = "trainctl-active-coordinator";

// The UNAVAILABLE message a standby answers with, for `active` ("" unknown).
std::string StandbyMessage(const std::string& active);

class StandbyServer {
 public:
  // Listens as `options` say (listen, TLS, keepalive, message size).
  explicit StandbyServer(const CoordinatorOptions& options);
  ~StandbyServer();
  StandbyServer(const StandbyServer&) = delete;
  StandbyServer& operator=(const StandbyServer&) = delete;

  // Serves; the bound port.
  absl::StatusOr<int> Start();
  // Where the active coordinator is ("" unknown), for the next answers.
  void SetActive(const std::string& address);
  std::string active() const;
  // Stops serving and closes the port (calls are cut after 1 s). Idempotent.
  void Shutdown();

 private:
  class Generic;

  const CoordinatorOptions options_;
  mutable absl::Mutex mu_;
  std::string active_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Generic> generic_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace trainctl::coordinator
