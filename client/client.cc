#include "trainctl/client.h"

#include <grpcpp/grpcpp.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/jobspec/job_spec.h"
#include "common/auth/secret.h"
#include "common/grpc_keepalive.h"
#include "trainctl/v1/auth.grpc.pb.h"
#include "trainctl/v1/job_service.grpc.pb.h"
#include "trainctl/v1/queue.grpc.pb.h"
#include "trainctl/v1/worker_service.grpc.pb.h"

namespace trainctl {

struct Client::Stubs {
  std::shared_ptr<grpc::Channel> channel;
  // Made by Connect from options (a watch may make another to reconnect);
  // false for FromChannel's.
  bool own_channel = false;
  std::unique_ptr<v1::JobService::Stub> jobs;
  std::unique_ptr<v1::WorkerService::Stub> workers;
  std::unique_ptr<v1::AuthService::Stub> auth;
  std::unique_ptr<v1::QueueService::Stub> queues;
};

namespace {

// Largest message we accept: a Job with many attempts and ranks, a log chunk.
constexpr int kMaxMessageBytes = 16 << 20;
// Page size for ListJobs (the coordinator's default): List() follows pages,
// so no single response grows with the number of jobs.
constexpr int kListPageSize = 100;

std::chrono::system_clock::time_point Deadline(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
}

std::string TimeoutText(absl::Duration d) { return absl::FormatDuration(d); }

// 128 random bits as 32 hex digits: a submission's SubmitJobRequest.request_id.
std::string NewRequestId() {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < 4; ++i) absl::StrAppendFormat(&out, "%08x", static_cast<uint32_t>(rd()));
  return out;
}

// gRPC status → absl::Status with the same code. Connection problems name
// the address; everything else keeps the coordinator's message as it is.
absl::Status FromGrpc(const grpc::Status& s, const std::string& address) {
  if (s.ok()) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(s.error_code());
  std::string message = s.error_message();
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    message = absl::StrCat("coordinator at ", address, " unavailable: ", message);
  } else if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    message = absl::StrCat("coordinator at ", address, " did not answer in time: ", message);
  }
  return absl::Status(code, message);
}

// `fresh`: a subchannel of its own, so that a reconnect dials at once
// instead of inheriting gRPC's backoff from the broken connection.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ClientOptions& options, bool fresh = false) {
  grpc::ChannelArguments args;
  if (fresh) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Keepalive: a watch or log stream can sit idle for minutes; pings keep
  // NAT/proxies from dropping it and detect a dead coordinator.
  SetKeepalive(args, kClientKeepalive);
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  auth::ChannelSecurity security;
  security.token = options.token;
  security.ca_file = options.ca_file;
  security.server_name_override = options.tls_server_name;
  return auth::MakeChannel(options.address, security, args);
}

// One unary call under the client's deadline: `rpc` is the stub's method
// (&v1::JobService::Stub::GetJob); the call's status with the address named.
template <typename Stub, typename Request, typename Response>
absl::Status Unary(Stub* stub, grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
                   const Request& req, Response* resp, const ClientOptions& options) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(options.timeout));
  return FromGrpc((stub->*rpc)(&ctx, req, resp), options.address);
}

}  // namespace

Client::Client(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options)
    : options_(options), stubs_(std::make_unique<Stubs>()) {
  stubs_->channel = std::move(channel);
  stubs_->jobs = v1::JobService::NewStub(stubs_->channel);
  stubs_->workers = v1::WorkerService::NewStub(stubs_->channel);
  stubs_->auth = v1::AuthService::NewStub(stubs_->channel);
  stubs_->queues = v1::QueueService::NewStub(stubs_->channel);
}

Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("coordinator address: empty (expected host:port)");
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> made = MakeChannel(options);
  if (!made.ok()) return made.status();
  std::shared_ptr<grpc::Channel> channel = *std::move(made);
  auto deadline = Deadline(options.timeout);
  // Wait for READY, but give up at the first TRANSIENT_FAILURE: every address
  // the name resolved to refused or failed, so waiting longer only delays
  // the error (gRPC would retry with backoff until the deadline).
  grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) {
      return absl::UnavailableError(absl::StrCat(
          "cannot reach the coordinator at ", options.address,
          options.ca_file.empty()
              ? ": connection failed (is trainctl-coordinator running and listening there? "
                "a TLS coordinator also needs --ca)"
              : absl::StrCat(": connection failed (is trainctl-coordinator running there, and is "
                             "its certificate signed by the CA in ",
                             options.ca_file, "?)")));
    }
    if (!channel->WaitForStateChange(state, deadline)) {
      return absl::UnavailableError(absl::StrCat("cannot reach the coordinator at ", options.address,
                                                 ": no answer within ",
                                                 TimeoutText(options.timeout)));
    }
    state = channel->GetState(/*try_to_connect=*/true);
  }
  std::unique_ptr<Client> client(new Client(std::move(channel), options));
  client->stubs_->own_channel = true;
  return client;
}

std::unique_ptr<Client> Client::FromChannel(std::shared_ptr<grpc::Channel> channel,
                                            const ClientOptions& options) {
  return std::unique_ptr<Client>(new Client(std::move(channel), options));
}

absl::StatusOr<v1::Job> Client::Submit(const v1::JobSpec& spec, const std::string& request_id) {
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  req.set_request_id(request_id.empty() ? NewRequestId() : request_id);
  v1::SubmitJobResponse resp;
  absl::Status s;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt > 0) absl::SleepFor(absl::Milliseconds(250) * attempt);
    s = Unary(stubs_->jobs.get(), &v1::JobService::Stub::SubmitJob, req, &resp, options_);
    // Only an answer that may have been lost is retried (the same id makes
    // the retry return the first call's job, never a second one).
    if (s.code() != absl::StatusCode::kUnavailable && s.code() != absl::StatusCode::kDeadlineExceeded) break;
  }
  if (!s.ok()) return s;
  return std::move(*resp.mutable_job());
}

absl::StatusOr<v1::Job> Client::SubmitFile(const std::string& path,
                                           const std::vector<std::string>& overrides) {
  ParsedJobSpec parsed = ParseJobSpecFile(path, overrides);
  if (!parsed.ok()) return SpecErrorsToStatus(parsed.errors);
  return Submit(parsed.spec);
}

absl::StatusOr<DryRunResult> Client::DryRun(const v1::JobSpec& spec) {
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  req.set_dry_run(true);
  v1::SubmitJobResponse resp;
  absl::Status s = Unary(stubs_->jobs.get(), &v1::JobService::Stub::SubmitJob, req, &resp, options_);
  if (!s.ok()) return s;
  DryRunResult out;
  out.job = std::move(*resp.mutable_job());
  out.planned.assign(resp.planned().begin(), resp.planned().end());
  out.pending_reason = resp.pending_reason();
  return out;
}

absl::StatusOr<v1::Job> Client::Get(const std::string& job_id) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::Job job;
  absl::Status s = Unary(stubs_->jobs.get(), &v1::JobService::Stub::GetJob, req, &job, options_);
  if (!s.ok()) return s;
  return job;
}

absl::StatusOr<std::vector<v1::Job>> Client::List(const std::vector<v1::JobState>& states,
                                                  int limit) {
  if (limit < 0) return absl::InvalidArgumentError("limit: must be >= 0");
  std::vector<v1::Job> out;
  v1::ListJobsRequest req;
  for (v1::JobState st : states) req.add_states(st);
  do {
    int want = limit == 0 ? kListPageSize
                          : std::min<int>(kListPageSize, limit - static_cast<int>(out.size()));
    req.set_page_size(want);
    v1::ListJobsResponse resp;
    absl::Status s = Unary(stubs_->jobs.get(), &v1::JobService::Stub::ListJobs, req, &resp, options_);
    if (!s.ok()) return s;
    for (v1::Job& j : *resp.mutable_jobs()) out.push_back(std::move(j));
    req.set_page_token(resp.next_page_token());
  } while (!req.page_token().empty() && (limit == 0 || static_cast<int>(out.size()) < limit));
  if (limit > 0 && static_cast<int>(out.size()) > limit) out.resize(limit);
  return out;
}

absl::StatusOr<v1::Job> Client::Cancel(const std::string& job_id, const std::string& reason) {
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  req.set_reason(reason);
  v1::Job job;
  absl::Status s = Unary(stubs_->jobs.get(), &v1::JobService::Stub::CancelJob, req, &job, options_);
  if (!s.ok()) return s;
  return job;
}

absl::StatusOr<v1::Job> Client::Watch(const std::string& job_id, bool include_history,
                                      const WatchCallback& callback) {
  std::optional<v1::Job> last;
  int64_t last_seq = 0;  // The newest event delivered: a resumed stream continues after it.
  // After a break, a channel (and stub) of the watch's own.
  std::unique_ptr<v1::JobService::Stub> fresh_stub;
  v1::JobService::Stub* stub = stubs_->jobs.get();
  std::mt19937_64 rng(std::random_device{}());
  absl::Duration backoff = absl::Milliseconds(100);
  absl::Time broke = absl::InfinitePast();  // Start of the current break.
  bool stopped = false;
  while (true) {
    grpc::ClientContext ctx;  // No deadline: the stream lasts as long as the job.
    v1::WatchJobRequest req;
    req.set_job_id(job_id);
    req.set_include_history(include_history || last_seq > 0);
    req.set_after_event_seq(last_seq);
    std::unique_ptr<grpc::ClientReader<v1::JobUpdate>> reader = stub->WatchJob(&ctx, req);
    v1::JobUpdate update;
    bool delivered = false;
    while (reader->Read(&update)) {
      delivered = true;
      if (update.has_job()) last = update.job();
      if (update.has_event()) last_seq = std::max(last_seq, update.event().seq());
      if (callback && !callback(update)) {
        stopped = true;
        ctx.TryCancel();
        break;
      }
    }
    grpc::Status status = reader->Finish();
    if (status.ok() || stopped) break;
    // A stream that broke (not one the coordinator refused): UNAVAILABLE, or
    // CANCELLED by a coordinator shutting down (this side cancels only when
    // the callback stopped).
    const bool broken = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                        status.error_code() == grpc::StatusCode::CANCELLED;
    const absl::Time now = absl::Now();
    if (delivered || broke == absl::InfinitePast()) {
      broke = now;
      backoff = absl::Milliseconds(100);
      if (broken && options_.on_watch_broken) options_.on_watch_broken(FromGrpc(status, options_.address));
    }
    if (!broken || now - broke >= options_.watch_reconnect_for) return FromGrpc(status, options_.address);
    // Full jitter in [b/2, b], b doubling to 1 s: back within a second of
    // the coordinator answering again.
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int64_t>(
        absl::ToInt64Milliseconds(backoff) / 2, absl::ToInt64Milliseconds(backoff))(rng)));
    backoff = std::min(backoff * 2, absl::Seconds(1));
    if (stubs_->own_channel) {
      absl::StatusOr<std::shared_ptr<grpc::Channel>> made = MakeChannel(options_, /*fresh=*/true);
      if (made.ok()) {
        fresh_stub = v1::JobService::NewStub(*made);
        stub = fresh_stub.get();
      }
    }
  }
  // The stream carries jobs without attempts; fetch the whole one (on the
  // channel that is known to work).
  v1::GetJobRequest get;
  get.set_job_id(job_id);
  v1::Job job;
  absl::Status s = Unary(stub, &v1::JobService::Stub::GetJob, get, &job, options_);
  if (!s.ok() && last.has_value()) return *last;
  if (!s.ok()) return s;
  return job;
}

absl::Status Client::Logs(const std::string& job_id, const LogsOptions& options,
                          const LogCallback& callback) {
  grpc::ClientContext ctx;  // No deadline: with follow, it lasts as long as the job.
  v1::GetLogsRequest req;
  req.set_job_id(job_id);
  if (options.rank.has_value()) req.set_rank(*options.rank);
  req.set_attempt(options.attempt);
  req.set_tail_lines(options.tail);
  req.set_follow(options.follow);
  std::unique_ptr<grpc::ClientReader<v1::LogChunk>> reader = stubs_->jobs->GetLogs(&ctx, req);
  v1::LogChunk chunk;
  bool stopped = false;
  while (reader->Read(&chunk)) {
    if (callback && !callback(chunk)) {
      stopped = true;
      ctx.TryCancel();
      break;
    }
  }
  grpc::Status status = reader->Finish();
  if (stopped && status.error_code() == grpc::StatusCode::CANCELLED) return absl::OkStatus();
  return FromGrpc(status, options_.address);
}

absl::StatusOr<v1::ArtifactChunk> Client::Fetch(const std::string& job_id, int64_t checkpoint_step,
                                                std::ostream& out) {
  grpc::ClientContext ctx;
  v1::FetchArtifactRequest req;
  req.set_job_id(job_id);
  req.set_checkpoint_step(checkpoint_step);
  std::unique_ptr<grpc::ClientReader<v1::ArtifactChunk>> reader = stubs_->jobs->FetchArtifact(&ctx, req);
  v1::ArtifactChunk chunk, head;
  bool first = true;
  int64_t offset = 0;
  uLong crc = crc32(0L, Z_NULL, 0);
  absl::Status broken;
  while (broken.ok() && reader->Read(&chunk)) {
    if (first) {
      head = chunk;
      head.clear_data();
      first = false;
    }
    if (chunk.offset() != offset) {
      broken = absl::DataLossError(absl::StrCat("fetch: a piece at offset ", chunk.offset(), ", expected ", offset));
      break;
    }
    out.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(chunk.data().data()), static_cast<uInt>(chunk.data().size()));
    offset += static_cast<int64_t>(chunk.data().size());
    if (!out) broken = absl::InternalError("fetch: cannot write the output");
  }
  if (!broken.ok()) ctx.TryCancel();
  grpc::Status status = reader->Finish();
  if (!broken.ok()) return broken;
  if (absl::Status s = FromGrpc(status, options_.address); !s.ok()) return s;
  if (first) return absl::DataLossError("fetch: the coordinator sent nothing");
  if (offset != head.size()) {
    return absl::DataLossError(absl::StrCat("fetch: got ", offset, " bytes of ", head.size()));
  }
  const std::string got = absl::StrFormat("crc32:%08x", static_cast<uint32_t>(crc));
  if (!head.checksum().empty() && got != head.checksum()) {
    return absl::DataLossError(absl::StrCat("fetch: the bytes are ", got, ", expected ", head.checksum()));
  }
  return head;
}

absl::StatusOr<std::vector<v1::MetricBatch>> Client::Metrics(const std::string& job_id,
                                                            const MetricsOptions& options) {
  v1::GetMetricsRequest req;
  req.set_job_id(job_id);
  if (options.rank.has_value()) req.set_rank(*options.rank);
  req.set_kind(options.kind);
  std::vector<v1::MetricBatch> batches;
  do {
    v1::GetMetricsResponse resp;
    absl::Status s = Unary(stubs_->jobs.get(), &v1::JobService::Stub::GetMetrics, req, &resp, options_);
    if (!s.ok()) return s;
    for (v1::MetricBatch& b : *resp.mutable_batches()) {
      // A page may continue the previous page's attempt: one batch per run.
      if (!batches.empty() && batches.back().attempt() == b.attempt()) {
        for (v1::MetricPoint& p : *b.mutable_points()) *batches.back().add_points() = std::move(p);
      } else {
        batches.push_back(std::move(b));
      }
    }
    req.set_page_token(resp.next_page_token());
  } while (!req.page_token().empty());
  return batches;
}

absl::StatusOr<v1::ListWorkersResponse> Client::ListWorkers(bool include_gone) {
  v1::ListWorkersRequest req;
  req.set_include_gone(include_gone);
  v1::ListWorkersResponse resp;
  absl::Status s = Unary(stubs_->workers.get(), &v1::WorkerService::Stub::ListWorkers, req, &resp, options_);
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<std::vector<v1::Worker>> Client::Workers(bool include_gone) {
  absl::StatusOr<v1::ListWorkersResponse> resp = ListWorkers(include_gone);
  if (!resp.ok()) return resp.status();
  return std::vector<v1::Worker>(resp->workers().begin(), resp->workers().end());
}

absl::StatusOr<v1::CreateSignInCodeResponse> Client::CreateSignInCode() {
  v1::CreateSignInCodeRequest req;
  v1::CreateSignInCodeResponse resp;
  absl::Status s = Unary(stubs_->auth.get(), &v1::AuthService::Stub::CreateSignInCode, req, &resp, options_);
  if (!s.ok()) return s;
  return resp;
}

}  // namespace trainctl

namespace trainctl {

absl::StatusOr<v1::CreateTokenResponse> Client::CreateToken(const v1::CreateTokenRequest& req) {
  v1::CreateTokenResponse resp;
  absl::Status s = Unary(stubs_->auth.get(), &v1::AuthService::Stub::CreateToken, req, &resp, options_);
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<std::vector<v1::Token>> Client::ListTokens(bool include_revoked) {
  v1::ListTokensRequest req;
  req.set_include_revoked(include_revoked);
  v1::ListTokensResponse resp;
  absl::Status s = Unary(stubs_->auth.get(), &v1::AuthService::Stub::ListTokens, req, &resp, options_);
  if (!s.ok()) return s;
  return std::vector<v1::Token>(resp.tokens().begin(), resp.tokens().end());
}

absl::StatusOr<v1::Token> Client::RevokeToken(const std::string& id) {
  v1::RevokeTokenRequest req;
  req.set_id(id);
  v1::Token resp;
  absl::Status s = Unary(stubs_->auth.get(), &v1::AuthService::Stub::RevokeToken, req, &resp, options_);
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::RevokeWorkerResponse> Client::RevokeWorker(const std::string& worker_id) {
  v1::RevokeWorkerRequest req;
  req.set_worker_id(worker_id);
  v1::RevokeWorkerResponse resp;
  absl::Status s = Unary(stubs_->auth.get(), &v1::AuthService::Stub::RevokeWorker, req, &resp, options_);
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::Queue> Client::CreateQueue(const v1::Queue& queue, bool update) {
  v1::CreateQueueRequest req;
  *req.mutable_queue() = queue;
  req.set_update(update);
  v1::Queue resp;
  absl::Status s = Unary(stubs_->queues.get(), &v1::QueueService::Stub::CreateQueue, req, &resp, options_);
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::QueueStatus> Client::GetQueue(const std::string& name) {
  v1::GetQueueRequest req;
  req.set_name(name);
  v1::QueueStatus resp;
  absl::Status s = Unary(stubs_->queues.get(), &v1::QueueService::Stub::GetQueue, req, &resp, options_);
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<std::vector<v1::QueueStatus>> Client::ListQueues() {
  v1::ListQueuesRequest req;
  v1::ListQueuesResponse resp;
  absl::Status s = Unary(stubs_->queues.get(), &v1::QueueService::Stub::ListQueues, req, &resp, options_);
  if (!s.ok()) return s;
  return std::vector<v1::QueueStatus>(resp.queues().begin(), resp.queues().end());
}

absl::Status Client::DeleteQueue(const std::string& name) {
  v1::DeleteQueueRequest req;
  req.set_name(name);
  v1::DeleteQueueResponse resp;
  return Unary(stubs_->queues.get(), &v1::QueueService::Stub::DeleteQueue, req, &resp, options_);
}

absl::StatusOr<v1::GetUsageResponse> Client::GetUsage(const v1::GetUsageRequest& req) {
  v1::GetUsageResponse resp;
  absl::Status s = Unary(stubs_->queues.get(), &v1::QueueService::Stub::GetUsage, req, &resp, options_);
  if (!s.ok()) return s;
  return resp;
}

}  // namespace trainctl
