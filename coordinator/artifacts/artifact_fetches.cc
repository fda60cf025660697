#include "coordinator/artifacts/artifact_fetches.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace trainctl::coordinator {

absl::Status ArtifactFetches::Request(const std::string& worker, v1::ReadFile req,
                                      FetchSink* sink) {
  Cancel(sink);
  const int64_t id = next_id_++;
  req.set_request_id(id);
  v1::CoordinatorMessage msg;
  *msg.mutable_read_file() = std::move(req);
  if (!registry_->Send(worker, msg)) {
    return absl::UnavailableError(absl::StrCat("worker '", worker, "' is not connected"));
  }
  open_[id] = Open{worker, sink, clock_->Now() + answer_timeout_};
  return absl::OkStatus();
}

void ArtifactFetches::OnChunk(const std::string& worker, const v1::FileChunk& chunk) {
  auto it = open_.find(chunk.request_id());
  if (it == open_.end() || it->second.worker != worker) return;
  FetchSink* sink = it->second.sink;
  open_.erase(it);
  sink->OnPiece(chunk);
}

void ArtifactFetches::WorkerGone(const std::string& worker) {
  std::vector<FetchSink*> failed;
  for (auto it = open_.begin(); it != open_.end();) {
    if (it->second.worker == worker) {
      failed.push_back(it->second.sink);
      open_.erase(it++);
    } else {
      ++it;
    }
  }
  for (FetchSink* s : failed) {
    s->OnFailed(absl::UnavailableError(
        absl::StrCat("worker '", worker, "' disconnected during the fetch")));
  }
}

void ArtifactFetches::Expire() {
  const absl::Time now = clock_->Now();
  std::vector<std::pair<FetchSink*, std::string>> failed;
  for (auto it = open_.begin(); it != open_.end();) {
    if (now >= it->second.deadline) {
      failed.emplace_back(it->second.sink, it->second.worker);
      open_.erase(it++);
    } else {
      ++it;
    }
  }
  for (auto& [sink, worker] : failed) {
    sink->OnFailed(absl::DeadlineExceededError(absl::StrCat(
        "worker '", worker, "' did not answer within ", absl::FormatDuration(answer_timeout_),
        " (a worker too old to serve fetches?)")));
  }
}

void ArtifactFetches::Cancel(FetchSink* sink) {
  for (auto it = open_.begin(); it != open_.end();) {
    if (it->second.sink == sink) {
      open_.erase(it++);
    } else {
      ++it;
    }
  }
}

}  // namespace trainctl::coordinator
