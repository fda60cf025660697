// The gRPC services of trainctl-coordinator: thin translations from proto
// requests to manager calls on the EventLoop, and back.
//
//   JobService    — SubmitJob, GetJob, ListJobs, CancelJob, CancelJobs (unary),
//                   WatchJob, GetLogs, FetchArtifact (server streams),
//                   UploadCode (a client stream: code_service.cc).
//   WorkerService — Session (one bidi stream per worker daemon), ListWorkers,
//                   FetchCode (a job's code, to a worker that runs it).
//   AuthService   — CreateToken, ListTokens, RevokeToken, RevokeWorker
//                   (admin only); Join (a join token, over TLS: a worker's
//                   client certificate).
//   QueueService  — CreateQueue, DeleteQueue (admin); GetQueue, ListQueues,
//                   GetUsage.
//
// Every handler first authenticates the call's bearer token and checks its
// role (TokenAuthority): reads need admin, submitter or viewer; SubmitJob
// admin or submitter; CancelJob admin, or the submitter that owns the job
// (CancelJobs: a submitter's filters match only its own jobs);
// Session a worker token (whose worker ids are bound to it); AuthService
// admin. A refused call does no work.
//
// Handlers never touch manager state on gRPC threads: each posts a closure to
// the loop, which calls the managers (which persist, then update memory, then
// notify) and completes the RPC. Stream reactors keep bounded outgoing queues
// so that a slow reader never blocks the loop.
#pragma once

#include <memory>

#include "common/event_loop.h"
#include "coordinator/artifacts/artifact_fetches.h"
#include "coordinator/auth/live_calls.h"
#include "coordinator/auth/sign_in_codes.h"
#include "coordinator/auth/token_authority.h"
#include "coordinator/auth/worker_enroller.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/jobs/job_owners.h"
#include "coordinator/queues/queue_registry.h"
#include "coordinator/store/state_store.h"
#include "coordinator/telemetry/metrics_hub.h"
#include "coordinator/telemetry/telemetry_ledger.h"
#include "coordinator/workers/worker_registry.h"
#include "trainctl/v1/auth.grpc.pb.h"
#include "trainctl/v1/job_service.grpc.pb.h"
#include "trainctl/v1/queue.grpc.pb.h"
#include "trainctl/v1/worker_service.grpc.pb.h"

namespace trainctl::coordinator {

class TelemetryBatcher;

// Everything a handler may use; all of it lives on (or is safe from) the loop.
struct ServiceContext {
  EventLoop* loop;
  StateStore* store;
  WorkerRegistry* registry;
  // The job owners the services call (job_owners.h; SetJobOwners): the
  // lifecycle (submit, cancel, rank ends, checkpoints), reads of jobs and of
  // their events and logs, scheduling passes, rendezvous and pre-flight,
  // metrics/logs/progress, lost workers.
  JobManager* jobs;
  MetricsHub* hub;
  const JobQueries* queries = nullptr;
  JobPlacer* placer = nullptr;
  AttemptStarter* starter = nullptr;
  TelemetryIngest* ingest = nullptr;
  JobHealth* health = nullptr;
  // Items a WatchJob/GetLogs stream buffers before it skips ahead.
  size_t max_queued_updates = 1024;
  // Deduplicates and acknowledges sequenced worker telemetry.
  TelemetryLedger* telemetry = nullptr;
  // Group commit of sequenced metrics and logs (set by WorkerServiceImpl).
  TelemetryBatcher* batcher = nullptr;
  // Authenticates every call. Required.
  TokenAuthority* auth = nullptr;
  // Signs joining workers' certificates; nullptr: Join is refused.
  WorkerEnroller* enroller = nullptr;
  // Fetches in flight (FetchArtifact); nullptr: refused.
  ArtifactFetches* fetches = nullptr;
  // Streams and sessions open under a token, ended when it lapses;
  // nullptr: not tracked (they end only when they finish).
  LiveCalls* live = nullptr;
  // Bytes a fetch asks a worker for at a time (<= 1 MiB).
  int32_t fetch_chunk_bytes = 1 << 20;
  // One-time dashboard sign-in codes (CreateSignInCode); nullptr: refused.
  SignInCodes* sign_in = nullptr;
  // The defined queues: SubmitJob puts each job in one (ResolveQueue) and
  // the QueueService edits them. nullptr: no queues (jobs keep the queue
  // they name; the QueueService answers FAILED_PRECONDITION).
  QueueRegistry* queues = nullptr;
  // Largest code archive UploadCode takes (--max-code-bytes).
  int64_t max_code_bytes = int64_t{64} << 20;

  // Points every job-owner field above at `owners`' owners.
  void SetJobOwners(JobOwners* owners) {
    jobs = &owners->manager;
    queries = &owners->queries;
    placer = &owners->placer;
    starter = &owners->starter;
    ingest = &owners->ingest;
    health = &owners->health;
  }
};

class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  explicit JobServiceImpl(ServiceContext ctx) : ctx_(ctx) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* ctx,
                                      const v1::SubmitJobRequest* req,
                                      v1::SubmitJobResponse* resp) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                   v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx,
                                      const v1::CancelJobRequest* req, v1::Job* resp) override;
  grpc::ServerUnaryReactor* CancelJobs(grpc::CallbackServerContext* ctx,
                                       const v1::CancelJobsRequest* req,
                                       v1::CancelJobsResponse* resp) override;
  grpc::ServerWriteReactor<v1::JobUpdate>* WatchJob(grpc::CallbackServerContext* ctx,
                                                    const v1::WatchJobRequest* req) override;
  grpc::ServerWriteReactor<v1::LogChunk>* GetLogs(grpc::CallbackServerContext* ctx,
                                                  const v1::GetLogsRequest* req) override;
  grpc::ServerUnaryReactor* GetMetrics(grpc::CallbackServerContext* ctx,
                                       const v1::GetMetricsRequest* req,
                                       v1::GetMetricsResponse* resp) override;
  grpc::ServerWriteReactor<v1::ArtifactChunk>* FetchArtifact(
      grpc::CallbackServerContext* ctx, const v1::FetchArtifactRequest* req) override;
  grpc::ServerReadReactor<v1::UploadCodeChunk>* UploadCode(grpc::CallbackServerContext* ctx,
                                                           v1::UploadCodeResponse* resp) override;

 private:
  ServiceContext ctx_;
};

class WorkerServiceImpl final : public v1::WorkerService::CallbackService {
 public:
  explicit WorkerServiceImpl(ServiceContext ctx);
  ~WorkerServiceImpl() override;

  grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx,
                                        const v1::ListWorkersRequest* req,
                                        v1::ListWorkersResponse* resp) override;
  grpc::ServerWriteReactor<v1::CodeChunk>* FetchCode(grpc::CallbackServerContext* ctx,
                                                     const v1::FetchCodeRequest* req) override;

  // The sessions' telemetry group commit (JobServiceImpl's streams read the
  // store through it).
  TelemetryBatcher* batcher() const { return batcher_.get(); }

 private:
  std::unique_ptr<TelemetryBatcher> batcher_;
  ServiceContext ctx_;
};

class AuthServiceImpl final : public v1::AuthService::CallbackService {
 public:
  explicit AuthServiceImpl(ServiceContext ctx) : ctx_(ctx) {}

  grpc::ServerUnaryReactor* CreateToken(grpc::CallbackServerContext* ctx,
                                        const v1::CreateTokenRequest* req,
                                        v1::CreateTokenResponse* resp) override;
  grpc::ServerUnaryReactor* ListTokens(grpc::CallbackServerContext* ctx,
                                       const v1::ListTokensRequest* req,
                                       v1::ListTokensResponse* resp) override;
  grpc::ServerUnaryReactor* RevokeToken(grpc::CallbackServerContext* ctx,
                                        const v1::RevokeTokenRequest* req,
                                        v1::Token* resp) override;
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const v1::JoinRequest* req,
                                 v1::JoinResponse* resp) override;
  grpc::ServerUnaryReactor* RevokeWorker(grpc::CallbackServerContext* ctx,
                                         const v1::RevokeWorkerRequest* req,
                                         v1::RevokeWorkerResponse* resp) override;
  grpc::ServerUnaryReactor* CreateSignInCode(grpc::CallbackServerContext* ctx,
                                             const v1::CreateSignInCodeRequest* req,
                                             v1::CreateSignInCodeResponse* resp) override;

 private:
  ServiceContext ctx_;
};

class QueueServiceImpl final : public v1::QueueService::CallbackService {
 public:
  explicit QueueServiceImpl(ServiceContext ctx) : ctx_(ctx) {}

  grpc::ServerUnaryReactor* CreateQueue(grpc::CallbackServerContext* ctx,
                                        const v1::CreateQueueRequest* req,
                                        v1::Queue* resp) override;
  grpc::ServerUnaryReactor* GetQueue(grpc::CallbackServerContext* ctx,
                                     const v1::GetQueueRequest* req,
                                     v1::QueueStatus* resp) override;
  grpc::ServerUnaryReactor* ListQueues(grpc::CallbackServerContext* ctx,
                                       const v1::ListQueuesRequest* req,
                                       v1::ListQueuesResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteQueue(grpc::CallbackServerContext* ctx,
                                        const v1::DeleteQueueRequest* req,
                                        v1::DeleteQueueResponse* resp) override;
  grpc::ServerUnaryReactor* GetUsage(grpc::CallbackServerContext* ctx,
                                     const v1::GetUsageRequest* req,
                                     v1::GetUsageResponse* resp) override;

 private:
  ServiceContext ctx_;
};

grpc::Status ToGrpcStatus(const absl::Status& s);

// InvalidArgument naming `field` unless `digest` is "sha256:" and 64
// lowercase hex digits (a code archive's digest).
absl::Status CodeDigestError(absl::string_view digest, absl::string_view field);
// SubmitJob's checks of a spec's code (CommandSpec.code), on the loop: a
// well-formed digest (InvalidArgument naming command.code.digest) that the
// store holds (FailedPrecondition: upload it first), working_dir relative
// and inside it; fills code.size_bytes from the store when left 0.
absl::Status CheckSpecCode(StateStore& store, v1::JobSpec& spec)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

// Cuts worker `worker_id` off now (its certificate or token was revoked):
// ends its session with `why`, marks it LOST (persisted) and hands its ranks
// to JobHealth (OnWorkerLost), as a lost lease would. No-op for a worker
// that is not ALIVE. Loop only.
void ExpelWorker(const ServiceContext& ctx, const std::string& worker_id, const absl::Status& why)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

// Why a GetLogs request cannot be answered for `job` (InvalidArgument naming
// the field: tail_lines, an attempt out of range, a rank outside the world).
absl::Status LogsRequestError(const v1::GetLogsRequest& req, const v1::Job& job);

// Largest GetMetrics page (points' bytes): well under any message limit.
inline constexpr int64_t kMaxMetricPageBytes = 1 << 20;
// One GetMetrics page (on the loop): validates the request (the job must
// exist), reads the store's metric points.
absl::StatusOr<v1::GetMetricsResponse> GetMetricsPage(const JobQueries& queries,
                                                      const v1::GetMetricsRequest& req)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

}  // namespace trainctl::coordinator
