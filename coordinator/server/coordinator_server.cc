#include "coordinator/server/coordinator_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/auth/secret.h"
#include "common/grpc_keepalive.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/queues/queue_status.h"
#include "coordinator/server/health_service.h"

namespace trainctl::coordinator {

// The clients' rule for sending a token in clear text is the same one.
bool IsLoopbackListen(const std::string& listen) { return auth::IsLoopbackAddress(listen); }

CoordinatorServer::CoordinatorServer(CoordinatorOptions options)
    : options_(std::move(options)), loop_(options_.clock) {}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

absl::StatusOr<std::string> CoordinatorServer::Start() {
  TRAINCTL_RETURN_IF_ERROR(RecoverOwners());
  MakeServices();
  if (options_.before_serving) TRAINCTL_RETURN_IF_ERROR(options_.before_serving());
  TRAINCTL_ASSIGN_OR_RETURN(int port, Serve());
  StartHousekeeping();
  if (!options_.http_listen.empty()) TRAINCTL_RETURN_IF_ERROR(ServeHttp());
  std::string host = options_.listen.substr(0, options_.listen.rfind(':'));
  return absl::StrCat(host, ":", port);
}

absl::Status CoordinatorServer::ServeHttp() {
  // The dashboard takes tokens (a sign-in form, bearer headers): in clear
  // text only where nobody else can listen, or when the operator says so.
  if (!options_.tls_cert_pem.empty()) {
    if (absl::Status s = http_.EnableTls(options_.tls_cert_pem, options_.tls_key_pem); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--http-listen: ", s.message()));
    }
  } else if (!IsLoopbackListen(options_.http_listen) && !options_.insecure) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--http-listen: ", options_.http_listen,
        " is not a loopback address and no TLS certificate is set: "
        "the dashboard would take tokens in clear text; serve TLS (--tls-dir) or pass --insecure"));
  }
  Dashboard::Deps deps{&loop_, store_.get(), registry_.get(), &job_owners_->queries, tokens_.get()};
  deps.refusals = &http_refusals_;
  deps.secure_cookie = http_.tls();
  deps.sign_in = sign_in_.get();
  deps.queues = queues_.get();
  dashboard_ = std::make_unique<Dashboard>(deps);
  dashboard_->RegisterMetrics(
      http_, [this] { return MetricsPage(); }, options_.metrics_open);
  dashboard_->Register(http_);
  TRAINCTL_ASSIGN_OR_RETURN(http_address_, http_.Start(options_.http_listen));
  int port = 0;
  if (!absl::SimpleAtoi(http_address_.substr(http_address_.rfind(':') + 1), &port)) port = 0;
  sign_in_->SetEndpoint({port, http_.tls()});
  return absl::OkStatus();
}

absl::Status CoordinatorServer::RecoverOwners() {
  if (store_ == nullptr) {
    TRAINCTL_ASSIGN_OR_RETURN(store_,
                              options_.store_spec.empty()
                                  ? StateStore::Open(options_.db_path, options_.store)
                                  : StateStore::OpenSpec(options_.store_spec, options_.store));
  }
  TRAINCTL_ASSIGN_OR_RETURN(StoreSnapshot snapshot, store_->LoadAll());
  registry_ = std::make_unique<WorkerRegistry>(store_.get(), options_.clock, options_.registry);
  registry_->BindToLoop(&loop_);
  job_owners_ = std::make_unique<JobOwners>(store_.get(), registry_.get(), &hub_, options_.clock,
                                            options_.jobs);
  job_owners_->BindToLoop(&loop_);
  job_owners_->placer.SetDeferral([this](std::function<void()> fn) {
    loop_.Post([this, fn = std::move(fn)] {
      AssertOnLoop(&loop_, "a deferred scheduling pass");
      fn();
    });
  });
  queues_ = std::make_unique<QueueRegistry>(store_.get(), options_.clock);
  queues_->BindToLoop(&loop_);
  // The placer reads the queues at every pass (docs/queues.md).
  job_owners_->placer.SetQueueSource([this] {
    AssertOnLoop(&loop_, "the placer's queue source");
    return queues_->Specs();
  });
  telemetry_ = std::make_unique<TelemetryLedger>(store_.get(), &job_owners_->book);
  tokens_ = std::make_unique<TokenAuthority>(store_.get(), options_.clock);
  TRAINCTL_RETURN_IF_ERROR(tokens_->Load());
  if (options_.admin_token.empty()) options_.admin_token = auth::NewSecret("admin");
  tokens_->SetBootstrapAdmin(options_.admin_token);
  absl::Status recovered;
  loop_.RunSync([&] {
    AssertOnLoop(&loop_, "recovery");
    recovered = queues_->Load();
    if (!recovered.ok()) return;
    registry_->Recover(snapshot.workers);
    recovered = job_owners_->manager.Recover(snapshot);
    telemetry_->Recover(snapshot);
  });
  return recovered;
}

void CoordinatorServer::MakeServices() {
  ServiceContext ctx{&loop_, store_.get(), registry_.get(), nullptr, &hub_};
  ctx.SetJobOwners(job_owners_.get());
  ctx.telemetry = telemetry_.get();
  ctx.auth = tokens_.get();
  ctx.queues = queues_.get();
  live_ = std::make_unique<LiveCalls>(tokens_.get());
  live_->BindToLoop(&loop_);
  ctx.live = live_.get();
  // A revocation ends that token's streams and sessions now, not at the
  // next periodic sweep.
  tokens_->OnRevoke([this](const std::string&) {
    loop_.Post([this] {
      AssertOnLoop(&loop_, "a revocation's sweep");
      live_->Sweep();
    });
  });
  fetches_ = std::make_unique<ArtifactFetches>(registry_.get(), options_.clock,
                                               options_.fetch_answer_timeout);
  ctx.fetches = fetches_.get();
  ctx.fetch_chunk_bytes = std::clamp<int32_t>(options_.fetch_chunk_bytes, 1, 1 << 20);
  ctx.max_code_bytes = options_.max_code_bytes;
  sign_in_ = std::make_unique<SignInCodes>(options_.clock);
  ctx.sign_in = sign_in_.get();
  if (!options_.tls_ca_key_pem.empty() && !options_.tls_cert_pem.empty()) {
    enroller_ = std::make_unique<WorkerEnroller>(
        auth::KeyAndCert{options_.tls_ca_key_pem, options_.tls_ca_pem}, tokens_.get(),
        registry_.get(), options_.clock, options_.worker_cert_validity);
    ctx.enroller = enroller_.get();
  }
  worker_service_ = std::make_unique<WorkerServiceImpl>(ctx);
  // The job streams read the store with the worker sessions' telemetry
  // published (OpenJobStream).
  ctx.batcher = worker_service_->batcher();
  job_service_ = std::make_unique<JobServiceImpl>(ctx);
  auth_service_ = std::make_unique<AuthServiceImpl>(ctx);
  queue_service_ = std::make_unique<QueueServiceImpl>(ctx);
}

std::vector<std::string> CoordinatorServiceNames() {
  return {v1::JobService::service_full_name(), v1::WorkerService::service_full_name(),
          v1::AuthService::service_full_name(), v1::QueueService::service_full_name()};
}

namespace {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> CoordinatorCredentials(
    const CoordinatorOptions& options) {
  if (!options.tls_cert_pem.empty()) {
    grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = options.tls_ca_pem;
    ssl.pem_key_cert_pairs.push_back({options.tls_key_pem, options.tls_cert_pem});
    return grpc::SslServerCredentials(ssl);
  }
  if (!IsLoopbackListen(options.listen) && !options.insecure) {
    return absl::FailedPreconditionError(absl::StrCat(
        "listen: ", options.listen,
        " is not a loopback address and no TLS certificate is set: "
        "serve TLS (--tls-dir, made by `trainctl-coordinator init`) or pass --insecure"));
  }
  return grpc::InsecureServerCredentials();
}

}  // namespace

absl::Status ConfigureCoordinatorListener(const CoordinatorOptions& options,
                                          grpc::ServerBuilder& builder, int* port) {
  TRAINCTL_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds,
                            CoordinatorCredentials(options));
  builder.AddListeningPort(options.listen, creds, port);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // Keepalive: find dead peers on idle streams; accept the workers' pings.
  SetServerKeepalive(builder);
  // A connection that never finishes its handshake (a scanner, or someone
  // holding sockets open) is dropped after this, not gRPC's 120 s. gRPC
  // 1.51 has no per-peer cap on unfinished handshakes (docs/security.md).
  builder.AddChannelArgument(
      GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.handshake_timeout)));
  return absl::OkStatus();
}

absl::StatusOr<int> CoordinatorServer::Serve() {
  // Health is answered at each call from whether this coordinator surely
  // still holds its store (health_service.h), not from a status set once.
  grpc::EnableDefaultHealthCheckService(false);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  TRAINCTL_RETURN_IF_ERROR(ConfigureCoordinatorListener(options_, builder, &port));
  health_ = std::make_unique<HealthService>(CoordinatorServiceNames(), [store = store_.get()] {
    return store->lease_confirmed() && store->deposed().ok();
  });
  builder.RegisterCallbackGenericService(health_.get());
  builder.RegisterService(job_service_.get());
  builder.RegisterService(worker_service_.get());
  {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    interceptors.push_back(rpc_stats_.NewInterceptorFactory(&rpc_refusals_));
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  builder.RegisterService(auth_service_.get());
  builder.RegisterService(queue_service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.listen));
  }
  return port;
}

void CoordinatorServer::StartHousekeeping() {
  loop_.Every(options_.check_interval, [this] {
    AssertOnLoop(&loop_, "housekeeping");
    // A coordinator that cannot be sure it still holds the store (stopped
    // or cut off past its lease: another may be active now) decides nothing
    // as active -- no worker lost, no hang, no placement -- until a lease
    // ping confirms the lock again or finds it deposed (then it re-executes
    // as a standby).
    if (!store_->lease_confirmed()) {
      if (!lease_unconfirmed_) {
        lease_unconfirmed_ = true;
        LogEvent(LogLevel::kWarn, "coordinator", "lease_unconfirmed",
                 {{"then",
                   "no expiry, health verdict, placement or registration until the store confirms "
                   "this coordinator still holds its lock"}});
      }
      return;
    }
    if (lease_unconfirmed_) {
      lease_unconfirmed_ = false;
      LogEvent(LogLevel::kInfo, "coordinator", "lease_confirmed",
               {{"then", "acting as the active coordinator again"}});
    }
    for (const std::string& id : registry_->ExpireLeases()) job_owners_->health.OnWorkerLost(id);
    job_owners_->manager.Tick();
    fetches_->Expire();
    registry_->ForgetGone([this](const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
      return !job_owners_->queries.BusySlots(id).empty();
    });
  });
  // Code archives no job names, past their grace (one indexed statement).
  loop_.Every(options_.code_gc_interval, [this] {
    AssertOnLoop(&loop_, "the code archive sweep");
    if (store_->lease_confirmed()) DeleteUnreferencedCode();
  });
  // Tokens also lapse by expiry, which nothing announces: re-check the
  // open streams and sessions every second.
  loop_.Every(absl::Seconds(1), [this] {
    AssertOnLoop(&loop_, "the token sweep");
    live_->Sweep();
    // The counts of refusals held back (RefusalLog), once their interval
    // is over. Thread-safe: they lock themselves.
    rpc_refusals_.Flush();
    http_refusals_.Flush();
  });
}

void CoordinatorServer::DeleteUnreferencedCode() {
  absl::StatusOr<int64_t> deleted = store_->code_archives().DeleteUnreferencedCode(
      absl::Now() - options_.unreferenced_code_grace);
  if (!deleted.ok()) {
    // A failing store has logged it (write health); retried next sweep.
    if (!StateStore::IsWriteFailure(deleted.status())) {
      LogEvent(LogLevel::kWarn, "coordinator", "code_sweep_failed",
               {{"error", std::string(deleted.status().message())}});
    }
  } else if (*deleted > 0) {
    LogEvent(LogLevel::kInfo, "coordinator", "code_deleted",
             {{"archives", absl::StrCat(*deleted)}, {"why", "no stored job names them"}});
  }
}

namespace {

std::string Lower(const std::string& enum_name, const std::string& prefix) {
  std::string s = enum_name.rfind(prefix, 0) == 0 ? enum_name.substr(prefix.size()) : enum_name;
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// One sample per valid value of a state enum (after UNSPECIFIED), 0 for the
// states nothing is in: a dashboard sees every state, not only the busy ones.
template <typename State, typename IsValid, typename NameOf>
void WriteByState(PromWriter& w, const char* family, const std::map<State, int64_t>& counts,
                  IsValid is_valid, NameOf name_of, const std::string& prefix) {
  for (int s = 1; is_valid(s); ++s) {
    auto it = counts.find(static_cast<State>(s));
    w.Sample(family, {{"state", Lower(name_of(s), prefix)}},
             it == counts.end() ? 0 : static_cast<double>(it->second));
  }
}

// Jobs and workers by state, the queue, restarts, stragglers and hangs.
void WriteClusterFamilies(PromWriter& w, const JobGauges& g,
                          const std::map<v1::WorkerState, int64_t>& workers) {
  static_assert(v1::JOB_STATE_UNSPECIFIED == 0 && v1::WORKER_STATE_UNSPECIFIED == 0);
  w.Family("trainctl_jobs", "gauge", "Jobs the coordinator holds, by state.");
  WriteByState(
      w, "trainctl_jobs", g.jobs_by_state, v1::JobState_IsValid,
      [](int s) { return v1::JobState_Name(s); }, "JOB_STATE_");
  w.Family("trainctl_queue_length", "gauge", "PENDING jobs waiting for slots.");
  w.Sample("trainctl_queue_length", {}, static_cast<double>(g.queue_length));
  w.Family("trainctl_queue_oldest_wait_seconds", "gauge",
           "How long the oldest PENDING job has waited.");
  w.Sample("trainctl_queue_oldest_wait_seconds", {}, g.oldest_pending_seconds);
  w.Family("trainctl_workers", "gauge", "Registered workers, by state.");
  WriteByState(
      w, "trainctl_workers", workers, v1::WorkerState_IsValid,
      [](int s) { return v1::WorkerState_Name(s); }, "WORKER_STATE_");
  w.Family("trainctl_restarts_total", "counter",
           "Attempts that failed and were restarted, by failure kind.");
  for (const auto& [kind, n] : g.restarts_by_kind) {
    w.Sample("trainctl_restarts_total",
             {{"kind", Lower(v1::FailureKind_Name(kind), "FAILURE_KIND_")}},
             static_cast<double>(n));
  }
  w.Family("trainctl_straggler_events_total", "counter",
           "Straggler events (a rank consistently slower than the others) since the coordinator "
           "started.");
  w.Sample("trainctl_straggler_events_total", {}, static_cast<double>(g.straggler_events));
  w.Family("trainctl_hangs_detected_total", "counter",
           "Attempts failed by the adaptive hang detection since the coordinator started.");
  w.Sample("trainctl_hangs_detected_total", {}, static_cast<double>(g.hangs_detected));
  w.Family("trainctl_stale_reports_refused_total", "counter",
           "Checkpoint and final-model reports of attempts that were no longer current, refused "
           "(fencing).");
  w.Sample("trainctl_stale_reports_refused_total", {},
           static_cast<double>(g.stale_reports_refused));
  w.Family("trainctl_preemptions_total", "counter",
           "Running jobs stopped as preemption victims (queues) since the coordinator started.");
  w.Sample("trainctl_preemptions_total", {}, static_cast<double>(g.preemptions));
}

// Where the loop's time goes: each task's wait before it ran and its run,
// posted closures (RPCs, reports) apart from timers (leases, hangs, passes).
void WriteLoopFamilies(PromWriter& w, const EventLoop& loop) {
  using Kind = EventLoop::TaskKind;
  w.Family("trainctl_loop_task_wait_seconds", "histogram",
           "How long each task waited for the coordinator's loop: a posted one (an RPC, a report) "
           "from its "
           "post, a timer past its due time.");
  loop.task_wait(Kind::kPosted).Write(w, "trainctl_loop_task_wait_seconds", {{"kind", "posted"}});
  loop.task_wait(Kind::kTimer).Write(w, "trainctl_loop_task_wait_seconds", {{"kind", "timer"}});
  w.Family("trainctl_loop_task_run_seconds", "histogram",
           "How long each task ran on the coordinator's loop (everything else waits meanwhile).");
  loop.task_run(Kind::kPosted).Write(w, "trainctl_loop_task_run_seconds", {{"kind", "posted"}});
  loop.task_run(Kind::kTimer).Write(w, "trainctl_loop_task_run_seconds", {{"kind", "timer"}});
}

// Per running job: throughput, loss, the step's split, loss scale, world.
void WriteRunningJobFamilies(PromWriter& w, const std::vector<JobGauges::Running>& running) {
  struct Gauge {
    const char* name;
    const char* help;
    double JobGauges::Running::*field;
  };
  const Gauge gauges[] = {
      {"trainctl_job_samples_per_second",
       "A running job's throughput, all ranks together (latest window).",
       &JobGauges::Running::samples_per_sec},
      {"trainctl_job_loss", "A running job's training loss (rank 0, latest window).",
       &JobGauges::Running::loss},
      {"trainctl_job_step_data_ms", "Mean ms per step waiting for data (ranks averaged).",
       &JobGauges::Running::data_ms},
      {"trainctl_job_step_compute_ms",
       "Mean ms per step in forward, backward and optimizer (ranks averaged).",
       &JobGauges::Running::compute_ms},
      {"trainctl_job_step_comm_ms",
       "Mean ms per step of communication not hidden behind backward (ranks averaged).",
       &JobGauges::Running::comm_ms},
      {"trainctl_job_loss_scale", "AMP fp16 loss scale of rank 0 (0 when off).",
       &JobGauges::Running::loss_scale},
      {"trainctl_job_world_size",
       "Ranks of a running job's current attempt (elastic jobs change it).",
       &JobGauges::Running::world_size},
  };
  for (const Gauge& gauge : gauges) {
    w.Family(gauge.name, "gauge", gauge.help);
    for (const JobGauges::Running& r : running)
      w.Sample(gauge.name, {{"job_id", r.id}}, r.*gauge.field);
  }
}

// Per defined queue: nominal quota, used and borrowed slots by kind, CPUs
// and memory, used and borrowed GPU slots by flavor, pending and running jobs; per queue
// any job names: slot-seconds held (accounting).
void WriteQueueFamilies(PromWriter& w, const std::vector<v1::QueueStatus>& queues,
                        const std::vector<UsageRow>& usage) {
  w.Family("trainctl_queue_nominal_slots", "gauge",
           "A queue's nominal quota of slots, by kind (absent: unlimited).");
  for (const v1::QueueStatus& s : queues) {
    const v1::Queue& q = s.queue();
    if (q.has_nominal_gpu() && q.nominal_gpu() >= 0) {
      w.Sample("trainctl_queue_nominal_slots", {{"queue", q.name()}, {"kind", "gpu"}},
               q.nominal_gpu());
    }
    if (q.has_nominal_cpu() && q.nominal_cpu() >= 0) {
      w.Sample("trainctl_queue_nominal_slots", {{"queue", q.name()}, {"kind", "cpu"}},
               q.nominal_cpu());
    }
  }
  w.Family("trainctl_queue_used_slots", "gauge",
           "Slots the running attempts of a queue's jobs hold, by kind.");
  for (const v1::QueueStatus& s : queues) {
    w.Sample("trainctl_queue_used_slots", {{"queue", s.queue().name()}, {"kind", "gpu"}},
             s.used_gpu());
    w.Sample("trainctl_queue_used_slots", {{"queue", s.queue().name()}, {"kind", "cpu"}},
             s.used_cpu());
  }
  w.Family(
      "trainctl_queue_borrowed_slots", "gauge",
      "Slots a queue's jobs hold beyond its nominal quota (borrowed from its cohort), by kind.");
  for (const v1::QueueStatus& s : queues) {
    w.Sample("trainctl_queue_borrowed_slots", {{"queue", s.queue().name()}, {"kind", "gpu"}},
             s.borrowed_gpu());
    w.Sample("trainctl_queue_borrowed_slots", {{"queue", s.queue().name()}, {"kind", "cpu"}},
             s.borrowed_cpu());
  }
  // CPUs and memory as the CPU and memory quotas count them, per queue.
  struct Amount {
    const char* name;
    const char* help;
    double (*value)(const v1::QueueStatus&);
  };
  for (const Amount& a : {
           Amount{"trainctl_queue_used_cpus",
                  "CPUs (resources.cpus x ranks) the running attempts of a queue's jobs hold.",
                  [](const v1::QueueStatus& s) { return s.used_cpus(); }},
           Amount{"trainctl_queue_borrowed_cpus",
                  "CPUs a queue's jobs hold beyond its nominal_cpus (borrowed from its cohort).",
                  [](const v1::QueueStatus& s) { return s.borrowed_cpus(); }},
           Amount{
               "trainctl_queue_used_memory_bytes",
               "Memory (resources.memory x ranks) the running attempts of a queue's jobs hold.",
               [](const v1::QueueStatus& s) { return static_cast<double>(s.used_memory_bytes()); }},
           Amount{"trainctl_queue_borrowed_memory_bytes",
                  "Memory a queue's jobs hold beyond its nominal_memory_bytes (borrowed from its "
                  "cohort).",
                  [](const v1::QueueStatus& s) {
                    return static_cast<double>(s.borrowed_memory_bytes());
                  }},
       }) {
    w.Family(a.name, "gauge", a.help);
    for (const v1::QueueStatus& s : queues)
      w.Sample(a.name, {{"queue", s.queue().name()}}, a.value(s));
  }
  // Every flavor the queue holds or has a quota for (0 then), sorted.
  w.Family("trainctl_queue_used_gpu_flavor_slots", "gauge",
           "GPU slots of a flavor the running attempts of a queue's jobs hold.");
  for (const v1::QueueStatus& s : queues) {
    std::map<std::string, int32_t> flavors(s.used_gpu_flavors().begin(),
                                           s.used_gpu_flavors().end());
    for (const auto& entry : s.queue().nominal_gpu_flavors()) flavors.emplace(entry.first, 0);
    for (const auto& [flavor, slots] : flavors) {
      w.Sample("trainctl_queue_used_gpu_flavor_slots",
               {{"queue", s.queue().name()}, {"flavor", flavor}}, slots);
    }
  }
  // Every flavor the queue has a quota for (0 when it borrows none of it).
  w.Family("trainctl_queue_borrowed_gpu_flavor_slots", "gauge",
           "GPU slots of a flavor a queue's jobs hold beyond its nominal_gpu_flavors (borrowed).");
  for (const v1::QueueStatus& s : queues) {
    std::map<std::string, int32_t> borrowed(s.borrowed_gpu_flavors().begin(),
                                            s.borrowed_gpu_flavors().end());
    for (const auto& entry : s.queue().nominal_gpu_flavors()) borrowed.emplace(entry.first, 0);
    for (const auto& [flavor, slots] : borrowed)
      w.Sample("trainctl_queue_borrowed_gpu_flavor_slots",
               {{"queue", s.queue().name()}, {"flavor", flavor}}, slots);
  }
  w.Family("trainctl_queue_pending_jobs", "gauge", "A queue's PENDING or RESTARTING jobs.");
  for (const v1::QueueStatus& s : queues) {
    w.Sample("trainctl_queue_pending_jobs", {{"queue", s.queue().name()}}, s.pending_jobs());
  }
  w.Family("trainctl_queue_running_jobs", "gauge", "A queue's SCHEDULED or RUNNING jobs.");
  for (const v1::QueueStatus& s : queues) {
    w.Sample("trainctl_queue_running_jobs", {{"queue", s.queue().name()}}, s.running_jobs());
  }
  // Summed over owners: one series per queue and kind.
  std::map<std::pair<std::string, std::string>, double> seconds;
  for (const UsageRow& r : usage) seconds[{r.queue, r.kind}] += r.slot_seconds;
  w.Family("trainctl_queue_slot_seconds_total", "counter",
           "Slot-seconds the attempts of a queue's jobs have held, by kind (trainctl usage).");
  for (const auto& [key, value] : seconds) {
    w.Sample("trainctl_queue_slot_seconds_total", {{"queue", key.first}, {"kind", key.second}},
             value);
  }
}

}  // namespace

std::string CoordinatorServer::MetricsPage() {
  // State lives on the loop: take a snapshot there, format it here. A loop
  // that does not answer in time leaves those families out, not the scrape
  // hanging.
  struct Snapshot {
    JobGauges jobs;
    std::map<v1::WorkerState, int64_t> workers;
    std::vector<v1::QueueStatus> queues;
    std::vector<UsageRow> usage;
  };
  auto snap = std::make_shared<Snapshot>();
  auto done = std::make_shared<absl::Notification>();
  loop_.Post([this, snap, done] {
    AssertOnLoop(&loop_, "the /metrics snapshot");
    snap->jobs = job_owners_->Gauges();
    snap->workers = registry_->CountByState();
    snap->queues = QueueStatusesOf(queues_->List(), job_owners_->queries.QueueUsages());
    absl::StatusOr<UsageReport> usage = job_owners_->queries.Usage(UsageFilter{});
    if (usage.ok()) snap->usage = std::move(usage->rows);
    done->Notify();
  });
  const bool answered = done->WaitForNotificationWithTimeout(absl::Seconds(5));

  PromWriter w;
  w.Family("trainctl_coordinator_up", "gauge",
           "1 while the coordinator serves; loop_responsive says whether its event loop answered "
           "this scrape.");
  w.Sample("trainctl_coordinator_up", {}, 1);
  w.Family("trainctl_coordinator_loop_responsive", "gauge",
           "1 when the control-plane loop answered within 5 s.");
  w.Sample("trainctl_coordinator_loop_responsive", {}, answered ? 1 : 0);
  if (answered) {
    WriteClusterFamilies(w, snap->jobs, snap->workers);
    WriteRunningJobFamilies(w, snap->jobs.running);
    WriteQueueFamilies(w, snap->queues, snap->usage);
  }
  w.Family("trainctl_scheduler_pass_seconds", "histogram",
           "Scheduling passes with jobs pending: the placement decision and the placements and "
           "preemptions it "
           "led to (on the loop).");
  job_owners_->placer.pass_latency().Write(w, "trainctl_scheduler_pass_seconds", {});
  WriteLoopFamilies(w, loop_);
  rpc_stats_.Write(w);
  if (store_ != nullptr) {
    w.Family("trainctl_db_commit_duration_seconds", "histogram",
             "SQLite COMMIT time (synchronous=FULL: includes the fsync).");
    store_->commit_latency().Write(w, "trainctl_db_commit_duration_seconds", {});
    const StateStore::WriteHealth health = store_->write_health();
    w.Family("trainctl_store_failing", "gauge",
             "1 while the state store fails its writes (workers stay connected; telemetry waits).");
    w.Sample("trainctl_store_failing", {}, health.failing ? 1 : 0);
    w.Family("trainctl_store_failed_writes_total", "counter",
             "State store writes that failed since the coordinator started.");
    w.Sample("trainctl_store_failed_writes_total", {}, static_cast<double>(health.failed_writes));
  }
  return w.Take();
}

absl::StatusOr<std::string> CoordinatorServer::IssueToken(v1::Role role, const std::string& name,
                                                          absl::Duration ttl) {
  v1::CreateTokenRequest req;
  req.set_role(role);
  req.set_name(name);
  req.mutable_ttl()->set_seconds(absl::ToInt64Seconds(ttl));
  absl::StatusOr<v1::CreateTokenResponse> r = absl::InternalError("not run");
  loop_.RunSync([&] {
    r = tokens_->Create(req, Principal{"embedded", "embedded", v1::ROLE_ADMIN});
  });
  if (!r.ok()) return r.status();
  return r->secret();
}

std::shared_ptr<grpc::Channel> CoordinatorServer::InProcessChannel(const std::string& token) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  return server_->experimental().InProcessChannelWithInterceptors(args,
                                                                  auth::BearerInterceptors(token));
}

void CoordinatorServer::Wait() {
  if (server_) server_->Wait();
}

void CoordinatorServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  http_.Stop();
  if (server_) {
    // Streams (sessions, watchers) are cancelled after the deadline.
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  loop_.StopAndJoin();
}

}  // namespace trainctl::coordinator
