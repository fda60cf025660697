// trainctl-coordinator, composed: the one place that wires the state store,
// event loop, worker registry, metrics hub, the job owners (built together
// by JobOwners, jobs/job_owners.h) and the gRPC services (members declared
// in dependency order, Ray's gcs_server habit).
//
// Start() opens the database, recovers every manager from it, and serves.
// Used by the coordinator's main, by `trainctl run` (embedded), and by tests.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "common/http_server.h"
#include "coordinator/api/services.h"
#include "coordinator/auth/live_calls.h"
#include "coordinator/auth/token_authority.h"
#include "coordinator/core/refusal_log.h"
#include "coordinator/core/rpc_stats.h"
#include "coordinator/jobs/job_owners.h"
#include "coordinator/store/state_store.h"
#include "coordinator/telemetry/metrics_hub.h"
#include "coordinator/telemetry/telemetry_ledger.h"
#include "coordinator/web/dashboard.h"
#include "coordinator/workers/worker_registry.h"

namespace grpc {
class Channel;
class Server;
class ServerCredentials;
}  // namespace grpc

namespace trainctl::coordinator {

class HealthService;

struct CoordinatorOptions {
  // host:port to listen on; port 0 picks a free port.
  std::string listen = "127.0.0.1:0";
  // SQLite database path.
  std::string db_path = "trainctl.db";
  // When set, the store instead (StateStore::OpenSpec: "sqlite:PATH" or a
  // PostgreSQL connection URI); db_path is then unused.
  std::string store_spec;
  RegistryOptions registry;
  JobManagerOptions jobs;
  StoreOptions store;
  // How often leases, hangs and timeouts are checked.
  absl::Duration check_interval = absl::Milliseconds(200);
  // host:port of the HTTP endpoint serving /metrics (Prometheus) and the
  // web dashboard (coordinator/web/dashboard.h); empty: none. With TLS (a
  // certificate below) it serves HTTPS with the same certificate; plain
  // HTTP only on a loopback address, unless `insecure`.
  std::string http_listen;
  // /metrics without a token (else it needs viewer or better).
  bool metrics_open = false;
  // A connection must finish its TLS and HTTP/2 handshake within this, or
  // it is closed (gRPC's default holds an idle one 120 s).
  absl::Duration handshake_timeout = absl::Seconds(5);
  // Largest message accepted or sent, in bytes.
  int max_message_bytes = 16 << 20;
  // The bootstrap admin secret (--admin-token-file). Empty: Start() makes a
  // random one (admin_token() tells it), as `trainctl run` and tests want.
  std::string admin_token;
  // Runs in Start() once the store is open and recovered, before the server
  // listens; an error ends the start. The binary writes a new admin token
  // file here: a coordinator that answers (health SERVING) has it in place.
  std::function<absl::Status()> before_serving;
  // TLS (PEM contents, not paths): with a certificate and key the server
  // speaks only TLS, and requests (does not require: joining workers have
  // none yet) client certificates signed by tls_ca_pem. Without them it
  // serves plaintext, and only on a loopback address unless `insecure`.
  std::string tls_cert_pem;
  std::string tls_key_pem;
  std::string tls_ca_pem;
  // The cluster CA's private key (PEM): with it (and TLS) the coordinator
  // signs joining workers' certificates (AuthService.Join). Empty: Join is
  // refused.
  std::string tls_ca_key_pem;
  // Bytes a fetch (trainctl fetch) asks a worker for at a time (1..1 MiB).
  int32_t fetch_chunk_bytes = 1 << 20;
  // How long a worker has to answer one piece of a fetch.
  absl::Duration fetch_answer_timeout = absl::Seconds(30);
  // Largest code archive a client may upload (--max-code-bytes).
  int64_t max_code_bytes = int64_t{64} << 20;
  // An uploaded archive no stored job names is deleted this long after its
  // upload (checked every code_gc_interval).
  absl::Duration unreferenced_code_grace = absl::Hours(1);
  absl::Duration code_gc_interval = absl::Minutes(5);
  // How long a joined worker's certificate is valid.
  absl::Duration worker_cert_validity = absl::Hours(24 * 365);
  bool insecure = false;
  const Clock* clock = SystemClock::Get();
};

// "127.x.y.z:P", "localhost:P", "[::1]:P", "unix:...".
bool IsLoopbackListen(const std::string& listen);

// The gRPC services a coordinator serves (full names), each with its own
// health status besides the server's "" (SERVING when active, NOT_SERVING
// on a standby).
std::vector<std::string> CoordinatorServiceNames();

// What the active and the standby server share: the listening port on
// `options.listen` with the credentials it asks for (TLS with its
// certificate, or plaintext where that is allowed: loopback, or `insecure`;
// else FailedPrecondition naming the listen address), the message size
// bounds, keepalive and the handshake timeout. `*port` is set by
// BuildAndStart, as grpc::ServerBuilder::AddListeningPort says.
absl::Status ConfigureCoordinatorListener(const CoordinatorOptions& options,
                                          grpc::ServerBuilder& builder, int* port);

class CoordinatorServer {
 public:
  explicit CoordinatorServer(CoordinatorOptions options);
  ~CoordinatorServer();

  // Opens the store, recovers, starts serving. Returns the bound "host:port".
  absl::StatusOr<std::string> Start();
  // Before Start: the store to use, already opened (a standby that took
  // the PostgreSQL store's lock, coordinator/main.cc), instead of opening
  // it. Recovery from it is the same as from one Start opens.
  void AdoptStore(std::unique_ptr<StateStore> store) { store_ = std::move(store); }
  // Blocks until Shutdown() is called (from another thread or a signal).
  void Wait();
  // Stops accepting calls, ends streams, stops the loop. Idempotent.
  void Shutdown();

  // A channel to this server that skips the network (tests, embedded use),
  // sending `token` as its bearer token ("" = none).
  std::shared_ptr<grpc::Channel> InProcessChannel(const std::string& token);
  // Runs fn on the control-plane loop and waits (tests and tools).
  void RunOnLoop(const std::function<void()>& fn) { loop_.RunSync(fn); }
  JobOwners* job_owners() { return job_owners_.get(); }
  // The /metrics page (Prometheus text format); callable from any thread
  // but the loop's (it waits for a snapshot taken on the loop).
  std::string MetricsPage();
  // The bound HTTP "host:port" once started with http_listen; else empty.
  const std::string& http_address() const { return http_address_; }
  // "https" or "http": how http_address() is served.
  const char* http_scheme() const { return http_.tls() ? "https" : "http"; }
  WorkerRegistry* registry() { return registry_.get(); }
  // The defined queues (loop only; the scheduler's QueueInput reads Specs()).
  QueueRegistry* queues() { return queues_.get(); }
  TokenAuthority* tokens() { return tokens_.get(); }
  // Creates a token (on the loop) and returns its secret: how embedded use
  // and tests hand tokens to their workers and clients.
  absl::StatusOr<std::string> IssueToken(v1::Role role, const std::string& name,
                                         absl::Duration ttl = absl::ZeroDuration());
  // The bootstrap admin secret in force (set after Start()).
  const std::string& admin_token() const { return options_.admin_token; }

 private:
  // The parts of Start(), in order: open the store and recover every owner
  // from it; build the gRPC services over them; listen (returns the bound
  // port); check leases, timeouts and fetches on the loop.
  absl::Status RecoverOwners();
  void MakeServices();
  absl::StatusOr<int> Serve();
  void StartHousekeeping();
  // Deletes code archives no stored job names, past their grace (loop).
  void DeleteUnreferencedCode();
  // The dashboard and /metrics on http_listen.
  absl::Status ServeHttp();

  CoordinatorOptions options_;
  std::unique_ptr<StateStore> store_;
  EventLoop loop_;
  std::unique_ptr<WorkerRegistry> registry_;
  MetricsHub hub_;
  std::unique_ptr<JobOwners> job_owners_;
  std::unique_ptr<QueueRegistry> queues_;
  std::unique_ptr<TelemetryLedger> telemetry_;
  std::unique_ptr<TokenAuthority> tokens_;
  // Streams and sessions to end when their token lapses (loop only).
  std::unique_ptr<LiveCalls> live_;
  std::unique_ptr<WorkerEnroller> enroller_;
  std::unique_ptr<ArtifactFetches> fetches_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<AuthServiceImpl> auth_service_;
  std::unique_ptr<QueueServiceImpl> queue_service_;
  std::unique_ptr<HealthService> health_;  // outlives server_
  std::unique_ptr<grpc::Server> server_;
  // Housekeeping found the store's lease unconfirmed (logged once per run).
  bool lease_unconfirmed_ = false;
  RpcStats rpc_stats_;
  // Refused calls and sign-ins, logged at most once per client per 10 s.
  RefusalLog rpc_refusals_{"coordinator", "rpc_refused"};
  RefusalLog http_refusals_{"coordinator", "http_auth_refused"};
  std::unique_ptr<Dashboard> dashboard_;
  std::unique_ptr<SignInCodes> sign_in_;
  // Declared last: stopped (destroyed) first, before what it reads.
  HttpServer http_;
  std::string http_address_;
  bool shut_down_ = false;
};

}  // namespace trainctl::coordinator
