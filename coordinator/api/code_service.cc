// A job's code (CommandSpec.code): JobService.UploadCode stores an archive
// by its digest, SubmitJob checks that the digest a spec names is stored
// (CheckSpecCode), and WorkerService.FetchCode streams it to a worker the
// job's current attempt has ranks on. The bytes live in the state store
// (one row per digest), so a standby that takes over serves them too.
//
// Threading: an upload's reactions come one at a time from gRPC (one read
// in flight); its store lookup and write run on the loop, which then
// continues or finishes the call. A fetch's state is loop-only, as
// FetchArtifact's; gRPC callbacks post to the loop.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/auth/secret.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/api/service_support.h"
#include "coordinator/api/services.h"
#include "coordinator/jobs/job_book.h"

namespace trainctl::coordinator {

namespace {

constexpr int64_t kCodeChunkBytes = 1 << 20;

// A digest for messages: long or hostile input is cut short.
std::string Quoted(absl::string_view s) {
  return absl::StrCat("'", s.substr(0, 80), s.size() > 80 ? "...'" : "'");
}

// One UploadCode stream (see the file's comment). Deletes itself in OnDone.
class UploadReactor final : public grpc::ServerReadReactor<v1::UploadCodeChunk> {
 public:
  UploadReactor(const ServiceContext& c, v1::UploadCodeResponse* resp,
                absl::StatusOr<Principal> who)
      : ctx_(c), resp_(resp) {
    if (!who.ok()) {
      Finish(ToGrpcStatus(who.status()));
      return;
    }
    who_ = *std::move(who);
    reads_.Mark();
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    reads_.Mark();
    if (!ok) {
      Complete();
    } else if (digest_.empty()) {
      First();
    } else {
      Append();
    }
  }
  void OnDone() override { delete this; }

 private:
  void Fail(const absl::Status& s) { Finish(ToGrpcStatus(s)); }

  // The first message: its digest and size, then whether the store has it.
  void First() {
    if (absl::Status bad = CodeDigestError(in_.digest(), "digest"); !bad.ok()) return Fail(bad);
    if (in_.size_bytes() <= 0) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("size_bytes: must be > 0, got ", in_.size_bytes())));
    }
    if (in_.size_bytes() > ctx_.max_code_bytes) {
      return Fail(absl::ResourceExhaustedError(
          absl::StrCat("size_bytes: the archive is ", in_.size_bytes(),
                       " bytes; this coordinator takes at most ", ctx_.max_code_bytes,
                       " (--max-code-bytes): leave data and outputs out (.trainctlignore)")));
    }
    digest_ = in_.digest();
    size_ = in_.size_bytes();
    resp_->set_digest(digest_);
    resp_->set_size_bytes(size_);
    ctx_.loop->Post([this] {
      AssertOnLoop(ctx_.loop, "a code upload");
      absl::StatusOr<std::optional<int64_t>> stored = ctx_.store->code_archives().CodeSize(digest_);
      if (!stored.ok())
        return Fail(absl::UnavailableError(
            absl::StrCat("could not read the store: ", stored.status().message())));
      if (!stored->has_value()) return Append();
      // Counts as an upload: the unreferenced grace starts again.
      if (absl::Status s = ctx_.store->code_archives().TouchCode(digest_, absl::Now());
          !s.ok() && !absl::IsNotFound(s)) {
        return Fail(
            absl::UnavailableError(absl::StrCat("could not store the code: ", s.message())));
      }
      resp_->set_already_stored(true);
      Finish(grpc::Status::OK);
    });
  }

  // A message's bytes (the first message may carry some too).
  void Append() {
    if (static_cast<int64_t>(data_.size() + in_.data().size()) > size_) {
      return Fail(absl::DataLossError(absl::StrCat("more bytes than the declared size_bytes (",
                                                   size_, ") were sent for ", digest_)));
    }
    if (data_.empty()) data_.reserve(static_cast<size_t>(size_));
    data_.append(in_.data());
    reads_.Mark();
    StartRead(&in_);
  }

  // The client's last message: checks the bytes, then stores them.
  void Complete() {
    if (digest_.empty()) {
      return Fail(absl::InvalidArgumentError("digest: the stream ended before its first message"));
    }
    if (static_cast<int64_t>(data_.size()) != size_) {
      return Fail(absl::DataLossError(absl::StrCat("received ", data_.size(),
                                                   " bytes of the declared size_bytes ", size_,
                                                   " for ", digest_, "; nothing was stored")));
    }
    if (const std::string got = absl::StrCat("sha256:", auth::Sha256Hex(data_)); got != digest_) {
      return Fail(
          absl::DataLossError(absl::StrCat("the bytes sent are ", got, ", not the declared digest ",
                                           digest_, "; nothing was stored")));
    }
    ctx_.loop->Post([this] {
      AssertOnLoop(ctx_.loop, "a code upload");
      if (absl::Status s = ctx_.store->code_archives().PutCode(digest_, data_, absl::Now());
          !s.ok()) {
        return Fail(
            absl::UnavailableError(absl::StrCat("could not store the code: ", s.message())));
      }
      LogEvent(LogLevel::kInfo, "coordinator", "code_stored",
               {{"digest", digest_}, {"size_bytes", absl::StrCat(size_)}, {"by", who_.name}});
      std::string().swap(data_);
      Finish(grpc::Status::OK);
    });
  }

  const ServiceContext ctx_;
  v1::UploadCodeResponse* const resp_;
  Principal who_;
  v1::UploadCodeChunk in_;
  ReadOrder reads_;
  std::string digest_;  // set from the first message
  int64_t size_ = 0;
  std::string data_;  // at most size_ bytes
};

// Whether worker `worker_id` is the caller: its certificate names it, or
// (without one) it is bound to the caller's token. Loop.
bool IsCallingWorker(const ServiceContext& c, const WorkerCaller& caller,
                     const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
  if (!caller.cert_id.empty()) return worker_id == caller.cert_id;
  return c.auth->WorkerBound(worker_id) && c.auth->CheckWorker(worker_id, caller.who).ok();
}

// The archive's size when `caller` may fetch the code `req` names. Loop.
absl::StatusOr<int64_t> CodeToFetch(const ServiceContext& c, const WorkerCaller& caller,
                                    const v1::FetchCodeRequest& req)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  TRAINCTL_ASSIGN_OR_RETURN(v1::Job job, c.queries->Get(req.job_id()));
  const v1::Attempt* attempt = CurrentAttempt(job);
  bool mine = false;
  if (attempt != nullptr) {
    for (const v1::RankAssignment& r : attempt->ranks())
      mine = mine || IsCallingWorker(c, caller, r.worker_id());
  }
  if (!mine) {
    return absl::PermissionDeniedError(absl::StrCat(
        "FetchCode: job '", job.id(), "' has no ranks on this worker in its current attempt"));
  }
  const std::string& named = job.spec().command().code().digest();
  if (named.empty() || named != req.digest()) {
    return absl::NotFoundError(absl::StrCat("digest: job '", job.id(), "' names ",
                                            named.empty() ? "no code" : named, ", not ",
                                            Quoted(req.digest())));
  }
  absl::StatusOr<std::optional<int64_t>> size = c.store->code_archives().CodeSize(named);
  if (!size.ok())
    return absl::UnavailableError(
        absl::StrCat("could not read the store: ", size.status().message()));
  if (!size->has_value())
    return absl::NotFoundError(absl::StrCat("the code of job '", job.id(), "' is not stored"));
  return **size;
}

// One FetchCode stream: reads a piece from the store, writes it, reads the
// next when the write is done (one write in flight). Loop-only state; it is
// deleted on the loop after OnDone.
class CodeFetchReactor final : public grpc::ServerWriteReactor<v1::CodeChunk> {
 public:
  explicit CodeFetchReactor(const ServiceContext& c) : ctx_(c) {}

  void Start(std::string digest, int64_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    digest_ = std::move(digest);
    size_ = size;
    WriteNext();
  }
  void Fail(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    if (finished_) return;
    finished_ = true;
    Finish(ToGrpcStatus(why));
  }
  // Ends the fetch when `who`'s token lapses.
  void Track(const Principal& who) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    if (ctx_.live != nullptr)
      live_ = ctx_.live->Add(
          who, [this](const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { Fail(why); });
  }

  void OnWriteDone(bool ok) override {
    ctx_.loop->Post([this, ok] {
      AssertOnLoop(ctx_.loop, "a code fetch");
      if (finished_) return;
      if (!ok) return Fail(absl::CancelledError("the worker went away"));
      if (offset_ < size_) return WriteNext();
      finished_ = true;
      Finish(grpc::Status::OK);
    });
  }
  void OnCancel() override {
    ctx_.loop->Post([this] {
      AssertOnLoop(ctx_.loop, "a code fetch");
      Fail(absl::CancelledError("cancelled"));
    });
  }
  void OnDone() override {
    ctx_.loop->Post([this] {
      AssertOnLoop(ctx_.loop, "a code fetch");
      if (live_ != 0) ctx_.live->Remove(live_);
      delete this;
    });
  }

 private:
  void WriteNext() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    absl::StatusOr<std::string> piece =
        ctx_.store->code_archives().ReadCode(digest_, offset_, kCodeChunkBytes);
    if (!piece.ok())
      return Fail(absl::UnavailableError(
          absl::StrCat("could not read the store: ", piece.status().message())));
    if (piece->empty())
      return Fail(absl::DataLossError(
          absl::StrCat(digest_, ": no bytes at offset ", offset_, " of ", size_)));
    out_.Clear();
    if (offset_ == 0) out_.set_size_bytes(size_);
    offset_ += static_cast<int64_t>(piece->size());
    out_.set_data(*std::move(piece));
    StartWrite(&out_);
  }

  const ServiceContext ctx_;
  std::string digest_ ABSL_GUARDED_BY(kLoop);
  int64_t size_ ABSL_GUARDED_BY(kLoop) = 0;
  int64_t offset_ ABSL_GUARDED_BY(kLoop) = 0;
  v1::CodeChunk out_ ABSL_GUARDED_BY(kLoop);
  bool finished_ ABSL_GUARDED_BY(kLoop) = false;
  LiveCalls::Id live_ ABSL_GUARDED_BY(kLoop) = 0;  // 0: untracked
};

// The checks of CommandSpec.working_dir beside code: a path inside the
// unpacked archive.
absl::Status CodeWorkingDirError(absl::string_view dir) {
  if (dir.empty()) return absl::OkStatus();
  if (dir.front() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("command.working_dir: with command.code it is a directory inside ",
                     "the job's code and must be relative, got ", Quoted(dir)));
  }
  for (absl::string_view part : absl::StrSplit(dir, '/')) {
    if (part == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          "command.working_dir: must stay inside the job's code (no '..'), got ", Quoted(dir)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CodeDigestError(absl::string_view digest, absl::string_view field) {
  absl::string_view hex = digest;
  const bool ok = absl::ConsumePrefix(&hex, "sha256:") && hex.size() == 64 &&
                  std::all_of(hex.begin(), hex.end(), [](char ch) {
                    return absl::ascii_isdigit(ch) || (ch >= 'a' && ch <= 'f');
                  });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": must be \"sha256:\" and 64 lowercase hex digits, got ", Quoted(digest)));
}

absl::Status CheckSpecCode(StateStore& store, v1::JobSpec& spec) {
  if (!spec.command().has_code()) return absl::OkStatus();
  v1::CodePackage* code = spec.mutable_command()->mutable_code();
  TRAINCTL_RETURN_IF_ERROR(CodeDigestError(code->digest(), "command.code.digest"));
  TRAINCTL_RETURN_IF_ERROR(CodeWorkingDirError(spec.command().working_dir()));
  absl::StatusOr<std::optional<int64_t>> size = store.code_archives().CodeSize(code->digest());
  if (!size.ok())
    return absl::UnavailableError(
        absl::StrCat("could not read the store: ", size.status().message()));
  if (!size->has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("command.code: ", code->digest(),
                     " is not stored; upload it first (JobService.UploadCode)"));
  }
  if (code->size_bytes() != 0 && code->size_bytes() != **size) {
    return absl::InvalidArgumentError(absl::StrCat("command.code.size_bytes: ", code->size_bytes(),
                                                   ", but the stored archive is ", **size,
                                                   " bytes"));
  }
  code->set_size_bytes(**size);
  return absl::OkStatus();
}

grpc::ServerReadReactor<v1::UploadCodeChunk>* JobServiceImpl::UploadCode(
    grpc::CallbackServerContext* ctx, v1::UploadCodeResponse* resp) {
  return new UploadReactor(ctx_, resp, Caller(ctx_, ctx, "UploadCode"));
}

grpc::ServerWriteReactor<v1::CodeChunk>* WorkerServiceImpl::FetchCode(
    grpc::CallbackServerContext* ctx, const v1::FetchCodeRequest* req) {
  auto* reactor = new CodeFetchReactor(ctx_);
  absl::StatusOr<WorkerCaller> caller = WorkerCallerOf(ctx_, ctx, "FetchCode");
  ctx_.loop->Post([this, reactor, request = *req, caller = std::move(caller)] {
    AssertOnLoop(ctx_.loop, "a code fetch");
    if (!caller.ok()) return reactor->Fail(caller.status());
    reactor->Track(caller->who);
    absl::StatusOr<int64_t> size = CodeToFetch(ctx_, *caller, request);
    if (!size.ok()) return reactor->Fail(size.status());
    reactor->Start(request.digest(), *size);
  });
  return reactor;
}

}  // namespace trainctl::coordinator
