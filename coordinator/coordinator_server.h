// trainctl-coordinator, composed: the one place that wires the state store,
// event loop, worker registry, metrics hub, job manager and gRPC services
// (members declared in dependency order, Ray's gcs_server habit).
//
// Start() opens the database, recovers every manager from it, and serves.
// Used by the coordinator's main, by `trainctl run` (embedded), and by tests.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "common/http_server.h"
#include "coordinator/job_manager.h"
#include "coordinator/metrics_hub.h"
#include "coordinator/rpc_stats.h"
#include "coordinator/services.h"
#include "coordinator/store/state_store.h"
#include "coordinator/telemetry_ledger.h"
#include "coordinator/worker_registry.h"

namespace grpc {
class Channel;
class Server;
}

namespace trainctl::coordinator {

struct CoordinatorOptions {
  // host:port to listen on; port 0 picks a free port.
  std::string listen = "127.0.0.1:0";
  // SQLite database path.
  std::string db_path = "trainctl.db";
  RegistryOptions registry;
  JobManagerOptions jobs;
  StoreOptions store;
  // How often leases, hangs and timeouts are checked.
  absl::Duration check_interval = absl::Milliseconds(200);
  // host:port of the HTTP endpoint serving /metrics (Prometheus); empty:
  // none.
  std::string http_listen;
  // Largest message accepted or sent, in bytes.
  int max_message_bytes = 16 << 20;
  const Clock* clock = SystemClock::Get();
};

class CoordinatorServer {
 public:
  explicit CoordinatorServer(CoordinatorOptions options);
  ~CoordinatorServer();

  // Opens the store, recovers, starts serving. Returns the bound "host:port".
  absl::StatusOr<std::string> Start();
  // Blocks until Shutdown() is called (from another thread or a signal).
  void Wait();
  // Stops accepting calls, ends streams, stops the loop. Idempotent.
  void Shutdown();

  // A channel to this server that skips the network (tests, embedded use).
  std::shared_ptr<grpc::Channel> InProcessChannel();
  // Runs fn on the control-plane loop and waits (tests and tools).
  void RunOnLoop(const std::function<void()>& fn) { loop_.RunSync(fn); }
  JobManager* jobs() { return jobs_.get(); }
  // The /metrics page (Prometheus text format); callable from any thread
  // but the loop's (it waits for a snapshot taken on the loop).
  std::string MetricsPage();
  // The bound HTTP "host:port" once started with http_listen; else empty.
  const std::string& http_address() const { return http_address_; }
  WorkerRegistry* registry() { return registry_.get(); }

 private:
  CoordinatorOptions options_;
  std::unique_ptr<StateStore> store_;
  EventLoop loop_;
  std::unique_ptr<WorkerRegistry> registry_;
  MetricsHub hub_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<TelemetryLedger> telemetry_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<grpc::Server> server_;
  RpcStats rpc_stats_;
  // Declared last: stopped (destroyed) first, before what it reads.
  HttpServer http_;
  std::string http_address_;
  bool shut_down_ = false;
};

}  // namespace trainctl::coordinator
