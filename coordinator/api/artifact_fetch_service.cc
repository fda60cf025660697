// JobService.FetchArtifact: streams a checkpoint or final model from the
// worker that holds it (ArtifactFetches routes the worker's pieces here).
// Threading: a FetchReactor's state is loop-only; gRPC callbacks post to
// the loop.
#include <zlib.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "coordinator/api/service_support.h"
#include "coordinator/api/services.h"

namespace trainctl::coordinator {

namespace {

// Where a fetch reads from: the connected worker that reported the file, a
// path on it, the job the file belongs to (the worker serves it only as
// that job's), and the checksum the file was recorded with ("" when none
// was).
struct ArtifactSource {
  std::string worker;
  std::string path;
  std::string recorded_checksum;
  std::string job_id;
};

// On the loop.
absl::StatusOr<ArtifactSource> FindArtifact(const ServiceContext& c,
                                            const v1::FetchArtifactRequest& req)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  if (req.checkpoint_step() < 0)
    return absl::InvalidArgumentError("checkpoint_step: must be >= 0 (0: the final model)");
  if (req.offset() < 0)
    return absl::InvalidArgumentError("offset: must be >= 0 (0: from the start of the file)");
  TRAINCTL_ASSIGN_OR_RETURN(v1::Job job, c.queries->Get(req.job_id()));
  ArtifactSource src;
  if (req.checkpoint_step() == 0) {
    if (job.final_model().empty()) {
      return absl::NotFoundError(absl::StrCat("job '", job.id(), "' has no final model (",
                                              v1::JobState_Name(job.state()),
                                              "); fetch a checkpoint with --checkpoint STEP"));
    }
    src = {job.final_model_worker(), job.final_model(), "", job.id()};
  } else {
    const v1::CheckpointRecord* found = nullptr;
    std::vector<std::string> steps;
    for (const v1::CheckpointRecord& r : job.checkpoints()) {
      steps.push_back(absl::StrCat(r.global_step()));
      if (r.global_step() == req.checkpoint_step()) found = &r;
    }
    if (found == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "checkpoint_step: job '", job.id(), "' has no checkpoint at step ", req.checkpoint_step(),
          " (it has: ", steps.empty() ? "none" : absl::StrJoin(steps, ", "), ")"));
    }
    // By record, never by path: only the worker that reported the file is
    // asked for it (also for a shared checkpoint, which others may see at
    // the same path), and only as a file of the record's job.
    const std::string& reporter =
        found->reported_by().empty() ? found->worker_id() : found->reported_by();
    if (reporter.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint_step: the shared checkpoint at step ", req.checkpoint_step(), " of job '",
          job.id(), "' was recorded without the worker that wrote it; copy ", found->path(),
          " from the shared directory"));
    }
    src = {reporter, found->path(), found->checksum(),
           found->job_id().empty() ? job.id() : found->job_id()};
  }
  const v1::Worker* w = c.registry->Find(src.worker);
  if (w == nullptr || w->state() != v1::WORKER_STATE_ALIVE) {
    return absl::UnavailableError(
        absl::StrCat("worker '", src.worker, "' holding ", src.path, " is not connected (",
                     w == nullptr ? "unknown" : v1::WorkerState_Name(w->state()), ")"));
  }
  return src;
}

std::string Crc32Text(uint32_t crc) { return absl::StrFormat("crc32:%08x", crc); }

// One FetchArtifact stream: asks the holder for a piece, writes it to the
// client, and asks for the next only when the write is done (one piece in
// flight). Its state is loop-only; gRPC callbacks post to the loop. It is
// deleted on the loop after OnDone, when nothing refers to it any more.
class FetchReactor final : public grpc::ServerWriteReactor<v1::ArtifactChunk>, public FetchSink {
 public:
  FetchReactor(ServiceContext ctx, int32_t chunk_bytes) : ctx_(ctx), chunk_bytes_(chunk_bytes) {}

  // Loop.
  // From byte `offset` of the file (> 0: a resumed fetch).
  void Start(ArtifactSource src, int64_t offset) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    ctx_.loop->CheckInLoop("a fetch");
    src_ = std::move(src);
    offset_ = offset;
    resumed_ = offset > 0;
    Ask(/*want_checksum=*/true);
  }
  void Fail(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    if (finished_) return;
    finished_ = true;
    if (ctx_.fetches != nullptr) ctx_.fetches->Cancel(this);
    Finish(ToGrpcStatus(why));
  }

  // FetchSink (loop).
  void OnPiece(const v1::FileChunk& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) override {
    ctx_.loop->CheckInLoop("a fetch");
    if (finished_) return;
    const std::string holder = absl::StrCat("worker '", src_.worker, "': ");
    if (!c.error().empty()) {
      Fail(absl::FailedPreconditionError(absl::StrCat(holder, c.error())));
      return;
    }
    if (c.offset() != offset_) {
      Fail(absl::InternalError(
          absl::StrCat(holder, "answered for offset ", c.offset(), ", expected ", offset_)));
      return;
    }
    out_.Clear();
    if (first_) {
      size_ = c.size();
      expected_ = src_.recorded_checksum.empty() ? c.checksum() : src_.recorded_checksum;
      if (!src_.recorded_checksum.empty() && !c.checksum().empty() &&
          c.checksum() != src_.recorded_checksum) {
        Fail(absl::DataLossError(absl::StrCat(holder, src_.path, " is ", c.checksum(),
                                              " on disk, recorded as ", src_.recorded_checksum,
                                              " (the file changed or is damaged)")));
        return;
      }
      out_.set_path(src_.path);
      out_.set_worker_id(src_.worker);
      out_.set_size(size_);
      out_.set_checksum(expected_);
    } else if (c.size() != size_) {
      Fail(absl::DataLossError(absl::StrCat(holder, src_.path, " changed size during the fetch (",
                                            size_, " -> ", c.size(), " bytes)")));
      return;
    }
    if (c.data().empty() && offset_ < size_) {
      Fail(
          absl::DataLossError(absl::StrCat(holder, "no bytes at offset ", offset_, " of ", size_)));
      return;
    }
    crc_ = crc32(crc_, reinterpret_cast<const Bytef*>(c.data().data()),
                 static_cast<uInt>(c.data().size()));
    out_.set_offset(offset_);
    out_.set_data(c.data());
    offset_ += static_cast<int64_t>(c.data().size());
    first_ = false;
    StartWrite(&out_);
  }
  void OnFailed(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) override {
    Fail(why);
  }

  // gRPC callbacks: to the loop.
  void OnWriteDone(bool ok) override {
    ctx_.loop->Post([this, ok] {
      AssertOnLoop(ctx_.loop, "a fetch");
      if (finished_) return;
      if (!ok) {
        Fail(absl::CancelledError("the client went away"));
        return;
      }
      if (offset_ < size_) {
        Ask(/*want_checksum=*/false);
        return;
      }
      // A resumed fetch sent only the file's end: its client, which has
      // every byte, checks the whole.
      if (!resumed_ && !expected_.empty() && Crc32Text(static_cast<uint32_t>(crc_)) != expected_) {
        Fail(absl::DataLossError(absl::StrCat("sent bytes are ",
                                              Crc32Text(static_cast<uint32_t>(crc_)), ", expected ",
                                              expected_, ": discard them")));
        return;
      }
      finished_ = true;
      Finish(grpc::Status::OK);
    });
  }
  void OnCancel() override {
    ctx_.loop->Post([this] {
      AssertOnLoop(ctx_.loop, "a fetch");
      Fail(absl::CancelledError("cancelled"));
    });
  }
  void OnDone() override {
    ctx_.loop->Post([this] {
      AssertOnLoop(ctx_.loop, "a fetch");
      if (ctx_.fetches != nullptr) ctx_.fetches->Cancel(this);
      if (live_ != 0) ctx_.live->Remove(live_);
      delete this;
    });
  }
  // Ends the fetch when `who`'s token lapses (loop).
  void Track(const Principal& who) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    if (ctx_.live != nullptr)
      live_ = ctx_.live->Add(
          who, [this](const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { Fail(why); });
  }

 private:
  void Ask(bool want_checksum) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    v1::ReadFile r;
    r.set_path(src_.path);
    r.set_offset(offset_);
    r.set_max_bytes(chunk_bytes_);
    r.set_want_checksum(want_checksum);
    r.set_job_id(src_.job_id);
    if (absl::Status s = ctx_.fetches->Request(src_.worker, r, this); !s.ok()) Fail(s);
  }

  ServiceContext ctx_;
  const int32_t chunk_bytes_;
  // Loop-only.
  ArtifactSource src_ ABSL_GUARDED_BY(kLoop);
  v1::ArtifactChunk out_ ABSL_GUARDED_BY(kLoop);
  bool first_ ABSL_GUARDED_BY(kLoop) = true;
  bool resumed_ ABSL_GUARDED_BY(kLoop) = false;
  bool finished_ ABSL_GUARDED_BY(kLoop) = false;
  LiveCalls::Id live_ ABSL_GUARDED_BY(kLoop) = 0;  // 0: untracked.
  int64_t offset_ ABSL_GUARDED_BY(kLoop) = 0;
  int64_t size_ ABSL_GUARDED_BY(kLoop) = 0;
  std::string expected_ ABSL_GUARDED_BY(kLoop);
  uLong crc_ ABSL_GUARDED_BY(kLoop) = crc32(0L, Z_NULL, 0);
};

}  // namespace

grpc::ServerWriteReactor<v1::ArtifactChunk>* JobServiceImpl::FetchArtifact(
    grpc::CallbackServerContext* ctx, const v1::FetchArtifactRequest* req) {
  absl::StatusOr<Principal> who = Caller(ctx_, ctx, "FetchArtifact");
  auto* reactor = new FetchReactor(ctx_, ctx_.fetch_chunk_bytes);
  if (!who.ok()) {
    ctx_.loop->Post([loop = ctx_.loop, reactor, s = who.status()] {
      AssertOnLoop(loop, "a fetch");
      reactor->Fail(s);
    });
    return reactor;
  }
  if (ctx_.fetches == nullptr) {
    ctx_.loop->Post([loop = ctx_.loop, reactor] {
      AssertOnLoop(loop, "a fetch");
      reactor->Fail(absl::UnimplementedError("FetchArtifact: not served here"));
    });
    return reactor;
  }
  ctx_.loop->Post([this, reactor, request = *req, who = *std::move(who)] {
    AssertOnLoop(ctx_.loop, "a fetch");
    reactor->Track(who);
    absl::StatusOr<ArtifactSource> src = FindArtifact(ctx_, request);
    if (!src.ok()) {
      reactor->Fail(src.status());
      return;
    }
    reactor->Start(*std::move(src), request.offset());
  });
  return reactor;
}

}  // namespace trainctl::coordinator
