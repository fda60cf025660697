// CoordinatorCodeSource (code_source.h).
#include "worker/daemon/code_source.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/auth/secret.h"
#include "common/status_macros.h"
#include "trainctl/v1/worker_service.grpc.pb.h"

namespace trainctl::worker {

namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace

CoordinatorCodeSource::CoordinatorCodeSource(const DaemonOptions& options,
                                             std::function<std::string()> address,
                                             absl::Duration deadline)
    : options_(options), address_(std::move(address)), deadline_(deadline) {}

absl::Status CoordinatorCodeSource::FetchCode(const std::string& job_id, const std::string& digest,
                                              Sink write) {
  auth::ChannelSecurity security;
  security.token = options_.token;
  security.ca_file = options_.ca_file;
  security.cert_file = options_.cert_file;
  security.key_file = options_.key_file;
  TRAINCTL_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                            auth::MakeChannel(address_(), security, grpc::ChannelArguments()));
  auto stub = v1::WorkerService::NewStub(channel);
  grpc::ClientContext ctx;
  // A gRPC deadline is a wall time gRPC turns into its own monotonic time at
  // once: the real clock, never an injected one.
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return absl::CancelledError("the worker is shutting down");
    calls_.insert(&ctx);
  }
  absl::Status result;
  v1::FetchCodeRequest req;
  req.set_job_id(job_id);
  req.set_digest(digest);
  std::unique_ptr<grpc::ClientReader<v1::CodeChunk>> reader = stub->FetchCode(&ctx, req);
  v1::CodeChunk chunk;
  int64_t size = -1;
  int64_t got = 0;
  while (reader->Read(&chunk)) {
    if (size < 0) size = chunk.size_bytes();
    got += static_cast<int64_t>(chunk.data().size());
    if (!result.ok()) continue;
    result = write(chunk.data());
    if (!result.ok()) ctx.TryCancel();  // the rest would go nowhere
  }
  const grpc::Status st = reader->Finish();
  {
    absl::MutexLock lock(&mu_);
    calls_.erase(&ctx);
  }
  if (!result.ok()) return result;
  if (!st.ok()) return FromGrpc(st);
  if (got != size) {
    return absl::DataLossError(absl::StrCat("the coordinator sent ", got, " bytes of ", size));
  }
  return absl::OkStatus();
}

void CoordinatorCodeSource::CancelFetches() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (grpc::ClientContext* c : calls_) c->TryCancel();
}

}  // namespace trainctl::worker
