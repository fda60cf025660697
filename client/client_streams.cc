// Client's streamed calls: Watch, Logs and Fetch (server streams resumed
// after a break) and UploadCode (a client stream), and the code archive
// UploadCode sends (PackedCodeArchive).
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client_calls.h"
#include "common/codepack/code_pack.h"
#include "trainctl/v1/job_service.grpc.pb.h"

namespace trainctl {

using client_internal::Endpoints;
using client_internal::FromGrpc;
using client_internal::Unary;

namespace {

// A stream that broke (not one the coordinator refused): UNAVAILABLE, or
// CANCELLED by a coordinator shutting down (this side cancels only when its
// callback stopped).
bool BrokenStream(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::CANCELLED;
}

// The breaks of one resumed stream (Watch, Logs with follow, Fetch): when
// the current break began, the pause before the next try (full jitter in
// [b/2, b], b doubling to 1 s: back within a second of the coordinator
// answering again), and the one report per break (on_watch_broken).
class StreamBreaks {
 public:
  explicit StreamBreaks(const ClientOptions& options)
      : options_(options), rng_(std::random_device{}()) {}

  // The stream on `address` ended with `status` (not OK), having delivered
  // something or not; `resumable`: it may be opened again. True after the
  // pause when it is to be opened again; false when `status` is the
  // caller's answer (not resumable, or broken for watch_reconnect_for).
  bool Again(const grpc::Status& status, const std::string& address, bool delivered,
             bool resumable) {
    const absl::Time now = absl::Now();
    if (delivered || broke_ == absl::InfinitePast()) {
      broke_ = now;
      backoff_ = absl::Milliseconds(100);
      // A standby's answer is no break: the stream was never served.
      if (resumable && !IsStandbyAnswer(status) && options_.on_watch_broken &&
          options_.watch_reconnect_for > absl::ZeroDuration()) {
        options_.on_watch_broken(FromGrpc(status, address));
      }
    }
    if (!resumable || now - broke_ >= options_.watch_reconnect_for) return false;
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int64_t>(
        absl::ToInt64Milliseconds(backoff_) / 2, absl::ToInt64Milliseconds(backoff_))(rng_)));
    backoff_ = std::min(backoff_ * 2, absl::Seconds(1));
    return true;
  }

 private:
  const ClientOptions& options_;
  std::mt19937_64 rng_;
  absl::Duration backoff_ = absl::Milliseconds(100);
  absl::Time broke_ = absl::InfinitePast();
};

// A server stream (logs, artifact bytes): opened on the active coordinator
// by the failover rule, each item to `on_item` (false: stop, the stream is
// cancelled). A stream whose connection never became READY, or that a
// standby answered, was not served and is opened again where the rule
// says, until options.timeout after the first try; one that broke (after
// delivering or not) is the caller's to resume: the next open goes where the
// break points (a standby's hint, else the next address, a fresh channel).
// *stopped: on_item said stop.
template <typename Stub, typename Request, typename Item>
grpc::Status ReadStream(Endpoints& e,
                        std::unique_ptr<grpc::ClientReader<Item>> (Stub::*rpc)(grpc::ClientContext*,
                                                                               const Request&),
                        const Request& req, const std::function<bool(const Item&)>& on_item,
                        bool* stopped, std::string* address_out) {
  const absl::Time open_by = absl::Now() + e.options.timeout;
  absl::Duration backoff = absl::ZeroDuration();
  *stopped = false;
  while (true) {
    absl::StatusOr<std::pair<std::shared_ptr<grpc::Channel>, std::string>> current = e.Current();
    if (!current.ok()) {
      return grpc::Status(static_cast<grpc::StatusCode>(current.status().code()),
                          std::string(current.status().message()));
    }
    *address_out = current->second;
    if (e.fixed == nullptr) {
      const std::vector<std::string>& list = e.coordinators->rotation().list();
      const bool several =
          list.size() > 1 || std::find(list.begin(), list.end(), current->second) == list.end();
      const absl::Time by = several ? std::min(open_by, absl::Now() + absl::Seconds(3)) : open_by;
      if (!WaitForReady(*current->first, by)) {
        // Never connected: nothing was sent; the next address.
        e.coordinators->Forget(current->second);
        e.coordinators->rotation().Unreachable(current->second);
        backoff = NextFailoverBackoff(backoff);
        if (absl::Now() + backoff >= open_by) {
          return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              absl::StrCat(kUnreachablePrefix, current->second));
        }
        absl::SleepFor(backoff);
        continue;
      }
    }
    grpc::ClientContext ctx;  // No deadline: a followed stream lasts as long as the job.
    Stub stub(current->first);
    std::unique_ptr<grpc::ClientReader<Item>> reader = (stub.*rpc)(&ctx, req);
    Item item;
    bool delivered = false;
    while (reader->Read(&item)) {
      delivered = true;
      if (!on_item(item)) {
        *stopped = true;
        ctx.TryCancel();
        break;
      }
    }
    grpc::Status status = reader->Finish();
    // Opened again only when a standby answered: the active coordinator's
    // own UNAVAILABLE is its answer.
    if (delivered || *stopped || !IsStandbyAnswer(status) || e.fixed != nullptr) {
      if (delivered) e.Answered(current->second);
      if (!*stopped && BrokenStream(status)) e.StreamFailed(current->second, status, ctx);
      return status;
    }
    e.StreamFailed(current->second, status, ctx);
    backoff = NextFailoverBackoff(backoff);
    if (absl::Now() + backoff >= open_by) return status;
    absl::SleepFor(backoff);
  }
}

}  // namespace

absl::StatusOr<v1::Job> Client::Watch(const std::string& job_id, bool include_history,
                                      const WatchCallback& callback) {
  Endpoints& e = stubs_->endpoints;
  std::optional<v1::Job> last;
  int64_t last_seq = 0;  // The newest event delivered: a resumed stream continues after it.
  StreamBreaks breaks(options_);
  bool stopped = false;
  while (true) {
    // The active coordinator as far as this client knows: after a break,
    // the hint a standby gave, else the next address (a fresh channel).
    absl::StatusOr<std::pair<std::shared_ptr<grpc::Channel>, std::string>> current = e.Current();
    if (!current.ok()) return current.status();
    const std::string& address = current->second;
    v1::JobService::Stub stub(current->first);
    grpc::ClientContext ctx;  // No deadline: the stream lasts as long as the job.
    v1::WatchJobRequest req;
    req.set_job_id(job_id);
    req.set_include_history(include_history || last_seq > 0);
    req.set_after_event_seq(last_seq);
    std::unique_ptr<grpc::ClientReader<v1::JobUpdate>> reader = stub.WatchJob(&ctx, req);
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
    if (delivered) e.Answered(address);
    if (status.ok() || stopped) break;
    // Broken: opened again where the break points (a standby's hint, else
    // the next address).
    const bool broken = BrokenStream(status);
    if (broken) e.StreamFailed(address, status, ctx);
    if (!breaks.Again(status, address, delivered, broken)) return FromGrpc(status, address);
  }
  // The stream carries jobs without attempts; fetch the whole one.
  v1::GetJobRequest get;
  get.set_job_id(job_id);
  v1::Job job;
  absl::Status s = Unary(e, &v1::JobService::Stub::GetJob, get, &job, Idempotency::kIdempotent);
  if (!s.ok() && last.has_value()) return *last;
  if (!s.ok()) return s;
  return job;
}

absl::Status Client::Logs(const std::string& job_id, const LogsOptions& options,
                          const LogCallback& callback) {
  v1::GetLogsRequest req;
  req.set_job_id(job_id);
  if (options.rank.has_value()) req.set_rank(*options.rank);
  req.set_attempt(options.attempt);
  req.set_tail_lines(options.tail);
  req.set_follow(options.follow);
  // What was delivered (a resumed stream continues after it): the attempt
  // of the last line and, of that attempt, each rank's last LogLine.seq.
  int32_t last_attempt = 0;
  absl::flat_hash_map<int32_t, int64_t> last_seq;
  StreamBreaks breaks(options_);
  while (true) {
    bool stopped = false;
    bool delivered = false;
    std::string address;
    grpc::Status status = ReadStream<v1::JobService::Stub, v1::GetLogsRequest, v1::LogChunk>(
        stubs_->endpoints, &v1::JobService::Stub::GetLogs, req,
        [&](const v1::LogChunk& chunk) {
          delivered = true;
          if (chunk.attempt() != last_attempt) {
            last_attempt = chunk.attempt();
            last_seq.clear();
          }
          for (const v1::LogLine& l : chunk.lines()) {
            if (l.seq() > 0) last_seq[chunk.rank()] = std::max(last_seq[chunk.rank()], l.seq());
          }
          return !callback || callback(chunk);
        },
        &stopped, &address);
    if (stopped && status.error_code() == grpc::StatusCode::CANCELLED) return absl::OkStatus();
    if (status.ok() || stopped) return FromGrpc(status, address);
    // A followed stream that broke is opened again, as Watch's is, after
    // what it delivered: never a line twice, none lost that the coordinator
    // keeps (a new attempt's lines from its start).
    if (!breaks.Again(status, address, delivered, options.follow && BrokenStream(status))) {
      return FromGrpc(status, address);
    }
    if (last_attempt > 0) {
      req.set_tail_lines(0);  // The tail was sent; everything after it is owed.
      req.set_after_attempt(last_attempt);
      req.clear_after_seq();
      for (const auto& [rank, seq] : last_seq) (*req.mutable_after_seq())[rank] = seq;
    }
  }
}

absl::StatusOr<v1::ArtifactChunk> Client::Fetch(const std::string& job_id, int64_t checkpoint_step,
                                                std::ostream& out) {
  v1::FetchArtifactRequest req;
  req.set_job_id(job_id);
  req.set_checkpoint_step(checkpoint_step);
  std::optional<v1::ArtifactChunk> head;  // The first stream's description of the file.
  int64_t offset = 0;                     // Bytes written so far: a resumed stream starts here.
  uLong crc = crc32(0L, Z_NULL, 0);       // Of those bytes.
  absl::Status broken;
  StreamBreaks breaks(options_);
  while (true) {
    bool stopped = false;
    bool delivered = false;
    std::string address;
    req.set_offset(offset);
    // Nothing is written before the first piece arrives, so a stream opened
    // again elsewhere (a standby's hint) writes each byte once; one that
    // broke after delivering is opened again at `offset`.
    grpc::Status status =
        ReadStream<v1::JobService::Stub, v1::FetchArtifactRequest, v1::ArtifactChunk>(
            stubs_->endpoints, &v1::JobService::Stub::FetchArtifact, req,
            [&](const v1::ArtifactChunk& chunk) {
              if (!delivered && !head.has_value()) {
                head = chunk;
                head->clear_data();
                head->clear_offset();
              } else if (!delivered &&
                         (chunk.size() != head->size() || chunk.checksum() != head->checksum() ||
                          chunk.path() != head->path() || chunk.worker_id() != head->worker_id())) {
                broken = absl::DataLossError(absl::StrCat(
                    "fetch: the file changed while the fetch was resumed (", head->path(), ": ",
                    head->size(), " bytes, ", head->checksum(), " -> ", chunk.path(), ": ",
                    chunk.size(), " bytes, ", chunk.checksum(), "): discard what was written"));
                return false;
              }
              delivered = true;
              if (chunk.offset() != offset) {
                broken = absl::DataLossError(absl::StrCat("fetch: a piece at offset ",
                                                          chunk.offset(), ", expected ", offset));
                return false;
              }
              out.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
              crc = crc32(crc, reinterpret_cast<const Bytef*>(chunk.data().data()),
                          static_cast<uInt>(chunk.data().size()));
              offset += static_cast<int64_t>(chunk.data().size());
              if (!out) broken = absl::InternalError("fetch: cannot write the output");
              return broken.ok();
            },
            &stopped, &address);
    if (!broken.ok()) return broken;
    if (status.ok()) break;
    // Resumed where it broke (the coordinator restarted or failed over, the
    // connection dropped, the holder reconnects) for watch_reconnect_for
    // after the break, as Watch does; never before a first byte came.
    if (!breaks.Again(status, address, delivered, head.has_value() && BrokenStream(status))) {
      return FromGrpc(status, address);
    }
  }
  if (!head.has_value()) return absl::DataLossError("fetch: the coordinator sent nothing");
  if (offset != head->size()) {
    return absl::DataLossError(absl::StrCat("fetch: got ", offset, " bytes of ", head->size()));
  }
  const std::string got = absl::StrFormat("crc32:%08x", static_cast<uint32_t>(crc));
  if (!head->checksum().empty() && got != head->checksum()) {
    return absl::DataLossError(
        absl::StrCat("fetch: the bytes are ", got, ", expected ", head->checksum()));
  }
  return *head;
}

absl::StatusOr<UploadedCode> Client::UploadCode(const std::string& archive_path,
                                                const v1::CodePackage& code) {
  // UploadCodeChunk.data: at most 1 MiB (job_service.proto).
  constexpr size_t kChunkBytes = size_t{1} << 20;
  struct stat st;
  if (stat(archive_path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("upload code: ", archive_path, ": ", std::strerror(errno)));
  }
  if (static_cast<int64_t>(st.st_size) != code.size_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("upload code: ", archive_path, " is ",
                                                   st.st_size, " bytes, the package says ",
                                                   code.size_bytes()));
  }
  v1::UploadCodeResponse resp;
  absl::Status read_error;  // the archive could not be read (not the coordinator's answer)
  // One try: the whole call, the file read from its start.
  auto call = [&](const std::shared_ptr<grpc::Channel>& channel,
                  grpc::ClientContext* ctx) -> grpc::Status {
    resp.Clear();
    std::ifstream in(archive_path, std::ios::binary);
    if (!in) {
      read_error =
          absl::InvalidArgumentError(absl::StrCat("upload code: cannot read ", archive_path));
      return grpc::Status(grpc::StatusCode::CANCELLED, "");
    }
    v1::JobService::Stub stub(channel);
    std::unique_ptr<grpc::ClientWriter<v1::UploadCodeChunk>> writer = stub.UploadCode(ctx, &resp);
    v1::UploadCodeChunk chunk;
    chunk.set_digest(code.digest());
    chunk.set_size_bytes(code.size_bytes());
    std::string buffer(kChunkBytes, '\0');
    bool first = true;
    while (true) {
      in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      const size_t n = static_cast<size_t>(in.gcount());
      if (in.bad()) {
        read_error =
            absl::InvalidArgumentError(absl::StrCat("upload code: cannot read ", archive_path));
        ctx->TryCancel();
        break;
      }
      if (n == 0 && !first) break;
      chunk.set_data(buffer.data(), n);
      // False: the coordinator ended the call (it has the archive already,
      // or refused it); Finish says which.
      if (!writer->Write(chunk)) break;
      first = false;
      chunk.clear_digest();
      chunk.clear_size_bytes();
      if (n < buffer.size()) break;  // the end of the file
    }
    writer->WritesDone();
    return writer->Finish();
  };
  Endpoints& e = stubs_->endpoints;
  const absl::Time deadline = absl::Now() + options_.timeout +
                              absl::Seconds(1) * (code.size_bytes() / int64_t{kChunkBytes} + 1);
  std::string address = e.options.address;
  grpc::Status status;
  if (e.fixed != nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    status = call(e.fixed, &ctx);
  } else {
    status = CallWithFailover(*e.coordinators, deadline, Idempotency::kIdempotent, call, &address);
  }
  if (!read_error.ok()) return read_error;
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    return absl::UnimplementedError(
        absl::StrCat("the coordinator at ", address,
                     " does not take code uploads (JobService.UploadCode; it is older than this "
                     "client): upgrade it, or "
                     "use a directory every worker has (trainctl submit --no-upload)"));
  }
  if (!status.ok()) return FromGrpc(status, address);
  if (!resp.digest().empty() && resp.digest() != code.digest()) {
    return absl::DataLossError(absl::StrCat("upload code: the coordinator stored ", resp.digest(),
                                            ", expected ", code.digest()));
  }
  UploadedCode uploaded;
  uploaded.code = code;
  uploaded.already_stored = resp.already_stored();
  return uploaded;
}

absl::StatusOr<std::unique_ptr<PackedCodeArchive>> PackedCodeArchive::Pack(const std::string& dir,
                                                                           int64_t max_bytes) {
  std::error_code ec;
  std::string source = std::filesystem::absolute(dir, ec).lexically_normal().string();
  if (ec) return absl::InvalidArgumentError(absl::StrCat(dir, ": ", ec.message()));
  while (source.size() > 1 && source.back() == '/') source.pop_back();
  const char* tmp = std::getenv("TMPDIR");
  std::string scratch =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/trainctl-code-XXXXXX");
  if (mkdtemp(scratch.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("pack code: cannot make a temporary directory ",
                                            scratch, ": ", std::strerror(errno)));
  }
  std::unique_ptr<PackedCodeArchive> archive(new PackedCodeArchive());
  archive->scratch_dir_ = scratch;  // removed from here on, also on failure
  archive->path_ = scratch + "/code.tar";
  codepack::PackOptions options;
  options.max_bytes = max_bytes;
  absl::StatusOr<codepack::PackedCode> packed =
      codepack::PackDirectory(source, archive->path_, options);
  if (!packed.ok()) return packed.status();
  archive->code_.set_digest(packed->digest);
  archive->code_.set_size_bytes(packed->size_bytes);
  archive->code_.set_files(packed->files);
  archive->code_.set_source(source);
  return archive;
}

PackedCodeArchive::~PackedCodeArchive() {
  std::error_code ignored;
  if (!scratch_dir_.empty()) std::filesystem::remove_all(scratch_dir_, ignored);
}

}  // namespace trainctl
