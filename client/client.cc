// Client: connecting (the failover rule over a list of coordinators) and
// the unary calls, each through Stubs::Call (client_calls.h). The streamed
// calls are in client_streams.cc.
#include "trainctl/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client_calls.h"
#include "common/auth/secret.h"
#include "common/coordinator_failover.h"
#include "common/grpc_keepalive.h"
#include "common/jobspec/job_spec.h"
#include "common/status_macros.h"
#include "trainctl/v1/auth.grpc.pb.h"
#include "trainctl/v1/job_service.grpc.pb.h"
#include "trainctl/v1/queue.grpc.pb.h"
#include "trainctl/v1/worker_service.grpc.pb.h"

namespace trainctl {

namespace client_internal {

absl::Status FromGrpc(const grpc::Status& s, const std::string& address) {
  if (s.ok()) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(s.error_code());
  std::string message = s.error_message();
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    // CallWithFailover's own message names the address already.
    if (!absl::StartsWith(message, kUnreachablePrefix)) {
      message = absl::StrCat("coordinator at ", address, " unavailable: ", message);
    }
  } else if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    message = absl::StrCat("coordinator at ", address, " did not answer in time: ", message);
  }
  return absl::Status(code, message);
}

}  // namespace client_internal

using client_internal::Endpoints;

namespace {

// Largest message we accept: a Job with many attempts and ranks, a log chunk.
constexpr int kMaxMessageBytes = 16 << 20;
// Page size for ListJobs (the coordinator's default): List() follows pages,
// so no single response grows with the number of jobs.
constexpr int kListPageSize = 100;

std::string TimeoutText(absl::Duration d) { return absl::FormatDuration(d); }

// 128 random bits as 32 hex digits: a submission's SubmitJobRequest.request_id.
std::string NewRequestId() {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < 4; ++i) absl::StrAppendFormat(&out, "%08x", static_cast<uint32_t>(rd()));
  return out;
}

// A channel to one coordinator address, with a subchannel of its own: a
// channel made after a failure dials at once instead of inheriting gRPC's
// reconnect backoff from the broken connection.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ClientOptions& options,
                                                           const std::string& address) {
  // Also for an address a standby's hint leads to: no token in clear text
  // beyond this host.
  if (absl::Status s = auth::CheckTokenTransport(address, options.token, options.ca_file); !s.ok())
    return s;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Keepalive: a watch or log stream can sit idle for minutes; pings keep
  // NAT/proxies from dropping it and detect a dead coordinator.
  SetKeepalive(args, kClientKeepalive);
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  auth::ChannelSecurity security;
  security.token = options.token;
  security.ca_file = options.ca_file;
  // Without an override, TLS verifies each address (a hinted one too)
  // against its own host name.
  security.server_name_override = options.tls_server_name;
  return auth::MakeChannel(address, security, args);
}

}  // namespace

Client::Client(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options)
    : options_(options), stubs_(std::make_unique<Stubs>()) {
  stubs_->endpoints.options = options;
  stubs_->endpoints.fixed = std::move(channel);
}

Client::~Client() = default;

std::string Client::active_address() const {
  Endpoints& e = stubs_->endpoints;
  return e.fixed != nullptr ? options_.address : e.coordinators->rotation().Current();
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  absl::StatusOr<std::vector<std::string>> list =
      ParseCoordinatorList(options.address, "coordinator address");
  if (!list.ok()) return list.status();
  // Every address of the list before any is dialled: a token is sent in
  // clear text to none of them.
  for (const std::string& address : *list) {
    if (absl::Status s = auth::CheckTokenTransport(address, options.token, options.ca_file);
        !s.ok())
      return s;
  }
  std::unique_ptr<Client> client(new Client(nullptr, options));
  Endpoints& e = client->stubs_->endpoints;
  e.fixed = nullptr;
  e.coordinators = std::make_unique<CoordinatorChannels>(
      *list, [options](const std::string& address) { return MakeChannel(options, address); });
  CoordinatorRotation& rotation = e.coordinators->rotation();
  const bool several = list->size() > 1;
  const absl::Time deadline = absl::Now() + options.timeout;
  // Rounds over the list (from the address this process last saw active)
  // until the deadline: the first address whose connection is READY will
  // do; calls then follow a standby's hint. A round gives each address up at
  // its first TRANSIENT_FAILURE (refused, no route) and, with several, one
  // that does not answer at all after 3 s; the next round begins after a
  // short backoff (50 ms doubling to 1 s), as a call's failover does: a
  // coordinator restarting or a standby taking over (its port opens some
  // hundred ms later) is waited for, up to --timeout, instead of failing
  // a command at once.
  std::vector<std::string> failures;
  absl::Duration backoff = absl::ZeroDuration();
  for (bool first = true;; first = false) {
    if (!first) {
      backoff = NextFailoverBackoff(backoff);
      if (absl::Now() + backoff >= deadline) break;
      absl::SleepFor(backoff);
    }
    failures.clear();
    std::set<std::string> tried;  // of the list (a remembered address outside it is one try more)
    while (tried.size() < list->size()) {
      const std::string address = rotation.Current();
      if (std::find(list->begin(), list->end(), address) != list->end()) tried.insert(address);
      absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = e.coordinators->Get(address);
      if (!channel.ok()) return channel.status();
      const absl::Time started = absl::Now();
      const absl::Time by = several ? std::min(deadline, started + absl::Seconds(3)) : deadline;
      if (WaitForReady(**channel, by)) return client;
      // Failed before its time was up: refused (TRANSIENT_FAILURE).
      failures.push_back(absl::StrCat(
          address, absl::Now() < by
                       ? ": connection failed"
                       : absl::StrCat(": no answer within ", TimeoutText(by - started))));
      e.coordinators->Forget(address);
      rotation.Unreachable(address);
      if (absl::Now() >= deadline) break;
    }
    if (absl::Now() >= deadline) break;
  }
  const std::string hint =
      options.ca_file.empty()
          ? "is trainctl-coordinator running and listening there? a TLS coordinator also needs --ca"
          : absl::StrCat(
                "is trainctl-coordinator running there, and is its certificate signed by the CA "
                "in ",
                options.ca_file, "?");
  if (!several) {
    const bool refused = failures.empty() || absl::StrContains(failures[0], "connection failed");
    return absl::UnavailableError(
        absl::StrCat("cannot reach the coordinator at ", options.address,
                     refused ? absl::StrCat(": connection failed for ",
                                            TimeoutText(options.timeout), " (", hint, ")")
                             : absl::StrCat(": no answer within ", TimeoutText(options.timeout))));
  }
  return absl::UnavailableError(absl::StrCat("cannot reach any coordinator of ",
                                             rotation.ListText(), ": ",
                                             absl::StrJoin(failures, "; "), " (", hint, ")"));
}

std::unique_ptr<Client> Client::FromChannel(std::shared_ptr<grpc::Channel> channel,
                                            const ClientOptions& options) {
  return std::unique_ptr<Client>(new Client(std::move(channel), options));
}

// Retried by Call's failover rule (a lost answer is asked again) or not
// (a second try could act twice).
constexpr Idempotency kRetry = Idempotency::kIdempotent;
constexpr Idempotency kOnce = Idempotency::kNotIdempotent;

absl::StatusOr<v1::Job> Client::Submit(const v1::JobSpec& spec, const std::string& request_id) {
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  req.set_request_id(request_id.empty() ? NewRequestId() : request_id);
  absl::StatusOr<v1::SubmitJobResponse> resp;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt > 0) absl::SleepFor(absl::Milliseconds(250) * attempt);
    // Idempotent by its request id: an answer lost to UNAVAILABLE is sent
    // again (to whichever coordinator is active) within the timeout, and
    // the retry returns the first call's job, never a second one.
    resp = stubs_->Call(&v1::JobService::Stub::SubmitJob, req, kRetry);
    // One lost to the deadline (a slow coordinator): twice more, each with
    // a timeout of its own.
    if (resp.status().code() != absl::StatusCode::kDeadlineExceeded) break;
  }
  if (!resp.ok()) return resp.status();
  return std::move(*resp->mutable_job());
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
  TRAINCTL_ASSIGN_OR_RETURN(v1::SubmitJobResponse resp,
                            stubs_->Call(&v1::JobService::Stub::SubmitJob, req, kRetry));
  DryRunResult out;
  out.job = std::move(*resp.mutable_job());
  out.planned.assign(resp.planned().begin(), resp.planned().end());
  out.pending_reason = resp.pending_reason();
  return out;
}

absl::StatusOr<v1::Job> Client::Get(const std::string& job_id) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  return stubs_->Call(&v1::JobService::Stub::GetJob, req, kRetry);
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
    TRAINCTL_ASSIGN_OR_RETURN(v1::ListJobsResponse resp,
                              stubs_->Call(&v1::JobService::Stub::ListJobs, req, kRetry));
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
  return stubs_->Call(&v1::JobService::Stub::CancelJob, req, kOnce);
}

absl::StatusOr<v1::CancelJobsResponse> Client::CancelJobs(const CancelFilter& filter,
                                                          const std::string& reason, bool dry_run) {
  v1::CancelJobsRequest req;
  req.set_queue(filter.queue);
  req.set_owner(filter.owner);
  for (v1::JobState s : filter.states) req.add_states(s);
  req.set_reason(reason);
  req.set_dry_run(dry_run);
  // A dry run only reads; a real one is never sent twice (as Cancel).
  return stubs_->Call(&v1::JobService::Stub::CancelJobs, req, dry_run ? kRetry : kOnce);
}

absl::StatusOr<std::vector<v1::MetricBatch>> Client::Metrics(const std::string& job_id,
                                                             const MetricsOptions& options) {
  v1::GetMetricsRequest req;
  req.set_job_id(job_id);
  if (options.rank.has_value()) req.set_rank(*options.rank);
  req.set_kind(options.kind);
  std::vector<v1::MetricBatch> batches;
  do {
    TRAINCTL_ASSIGN_OR_RETURN(v1::GetMetricsResponse resp,
                              stubs_->Call(&v1::JobService::Stub::GetMetrics, req, kRetry));
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
  return stubs_->Call(&v1::WorkerService::Stub::ListWorkers, req, kRetry);
}

absl::StatusOr<std::vector<v1::Worker>> Client::Workers(bool include_gone) {
  TRAINCTL_ASSIGN_OR_RETURN(v1::ListWorkersResponse resp, ListWorkers(include_gone));
  return std::vector<v1::Worker>(resp.workers().begin(), resp.workers().end());
}

absl::StatusOr<v1::CreateSignInCodeResponse> Client::CreateSignInCode() {
  return stubs_->Call(&v1::AuthService::Stub::CreateSignInCode, v1::CreateSignInCodeRequest(),
                      kOnce);
}

absl::StatusOr<v1::CreateTokenResponse> Client::CreateToken(const v1::CreateTokenRequest& req) {
  return stubs_->Call(&v1::AuthService::Stub::CreateToken, req, kOnce);
}

absl::StatusOr<std::vector<v1::Token>> Client::ListTokens(bool include_revoked) {
  v1::ListTokensRequest req;
  req.set_include_revoked(include_revoked);
  TRAINCTL_ASSIGN_OR_RETURN(v1::ListTokensResponse resp,
                            stubs_->Call(&v1::AuthService::Stub::ListTokens, req, kRetry));
  return std::vector<v1::Token>(resp.tokens().begin(), resp.tokens().end());
}

absl::StatusOr<v1::Token> Client::RevokeToken(const std::string& id) {
  v1::RevokeTokenRequest req;
  req.set_id(id);
  return stubs_->Call(&v1::AuthService::Stub::RevokeToken, req, kOnce);
}

absl::StatusOr<v1::RevokeWorkerResponse> Client::RevokeWorker(const std::string& worker_id) {
  v1::RevokeWorkerRequest req;
  req.set_worker_id(worker_id);
  return stubs_->Call(&v1::AuthService::Stub::RevokeWorker, req, kOnce);
}

absl::StatusOr<v1::Queue> Client::CreateQueue(const v1::Queue& queue, bool update) {
  v1::CreateQueueRequest req;
  *req.mutable_queue() = queue;
  req.set_update(update);
  return stubs_->Call(&v1::QueueService::Stub::CreateQueue, req, kOnce);
}

absl::StatusOr<v1::QueueStatus> Client::GetQueue(const std::string& name) {
  v1::GetQueueRequest req;
  req.set_name(name);
  return stubs_->Call(&v1::QueueService::Stub::GetQueue, req, kRetry);
}

absl::StatusOr<std::vector<v1::QueueStatus>> Client::ListQueues() {
  TRAINCTL_ASSIGN_OR_RETURN(
      v1::ListQueuesResponse resp,
      stubs_->Call(&v1::QueueService::Stub::ListQueues, v1::ListQueuesRequest(), kRetry));
  return std::vector<v1::QueueStatus>(resp.queues().begin(), resp.queues().end());
}

absl::Status Client::DeleteQueue(const std::string& name) {
  v1::DeleteQueueRequest req;
  req.set_name(name);
  return stubs_->Call(&v1::QueueService::Stub::DeleteQueue, req, kOnce).status();
}

absl::StatusOr<v1::GetUsageResponse> Client::GetUsage(const v1::GetUsageRequest& req) {
  return stubs_->Call(&v1::QueueService::Stub::GetUsage, req, kRetry);
}

}  // namespace trainctl
