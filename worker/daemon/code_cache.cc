// CodeCache (code_cache.h).
#include "worker/daemon/code_cache.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/codepack/code_pack.h"
#include "common/log.h"
#include "common/safe_file.h"

namespace trainctl::worker {

bool IsCodeDigest(const std::string& digest) {
  constexpr absl::string_view kPrefix = "sha256:";
  if (digest.size() != kPrefix.size() + 64 || !absl::StartsWith(digest, kPrefix)) return false;
  for (size_t i = kPrefix.size(); i < digest.size(); ++i) {
    const char c = digest[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

CodeCache::CodeCache(std::string dir, CodeSource* source, EventLoop& loop, const Clock* clock,
                     FileEnv* env)
    : dir_(std::move(dir)),
      source_(source),
      loop_(loop),
      clock_(clock != nullptr ? *clock : *SystemClock::Get()),
      env_(FileEnv::Or(env)) {}

CodeCache::~CodeCache() {
  alive_->store(false);
  if (source_ != nullptr) source_->CancelFetches();
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

std::string CodeCache::ArchivePath(const std::string& digest) const {
  return absl::StrCat(dir_, "/", digest.substr(digest.find(':') + 1), ".tar");
}

void CodeCache::Want(const std::string& job_id, const std::string& digest, Done done) {
  loop_.CheckInLoop("CodeCache::Want");
  if (!IsCodeDigest(digest)) {
    done(absl::InvalidArgumentError(
        absl::StrCat("command.code.digest: '", digest, "' is not sha256:<64 hex>")));
    return;
  }
  const std::string path = ArchivePath(digest);
  struct stat st {};
  if (env_->StatAt(AT_FDCWD, path, &st) == 0) {
    done(path);
    return;
  }
  if (source_ == nullptr) {
    done(absl::FailedPreconditionError(
        absl::StrCat("code ", digest, ": this worker has no coordinator to fetch it from")));
    return;
  }
  std::vector<Done>& waiters = waiting_[digest];
  waiters.push_back(std::move(done));
  if (waiters.size() > 1) return;  // Its fetch runs already.
  absl::MutexLock lock(&mu_);
  threads_.emplace_back([this, job_id, digest] { Fetch(job_id, digest); });
}

void CodeCache::Fetch(std::string job_id, std::string digest) {
  const std::string path = ArchivePath(digest);
  absl::StatusOr<std::string> result = [&]() -> absl::StatusOr<std::string> {
    if (env_->MkdirAt(AT_FDCWD, dir_, 0700) != 0 && errno != EEXIST) {
      return absl::InternalError(absl::StrCat("cannot make ", dir_, ": ", std::strerror(errno)));
    }
    const absl::Time start = clock_.Mono();
    // A temporary file beside the archive's name, removed unless committed.
    SafeWriteOptions options;
    options.env = env_;
    absl::StatusOr<std::unique_ptr<SafeFileWriter>> out = SafeFileWriter::Create(path, options);
    if (!out.ok()) {
      return absl::Status(out.status().code(),
                          absl::StrCat("keeping code ", digest, ": ", out.status().message()));
    }
    SafeFileWriter& w = **out;
    int64_t bytes = 0;
    auto write = [&](absl::string_view data) {
      bytes += static_cast<int64_t>(data.size());
      return w.Append(data);
    };
    if (absl::Status s = source_->FetchCode(job_id, digest, write); !s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("fetching code ", digest, " from the coordinator: ", s.message()));
    }
    absl::StatusOr<std::string> got = codepack::FileDigest(w.temp_path());
    if (!got.ok() || *got != digest) {
      return absl::DataLossError(absl::StrCat("code ", digest, " arrived as ",
                                              got.ok() ? *got : got.status().ToString(),
                                              "; not kept"));
    }
    if (absl::Status s = w.Commit(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("keeping code ", digest, ": ", s.message()));
    }
    LogEvent(LogLevel::kInfo, "worker", "code_fetched",
             {{"job_id", job_id},
              {"digest", digest},
              {"bytes", absl::StrCat(bytes)},
              {"seconds", absl::StrCat(absl::ToDoubleSeconds(clock_.Mono() - start))}});
    return path;
  }();
  std::shared_ptr<std::atomic<bool>> alive = alive_;
  loop_.Post([this, alive, digest, result = std::move(result)] {
    if (alive->load()) Finish(digest, result);
  });
}

void CodeCache::Finish(const std::string& digest, const absl::StatusOr<std::string>& archive) {
  loop_.CheckInLoop("CodeCache::Finish");
  auto it = waiting_.find(digest);
  if (it == waiting_.end()) return;
  std::vector<Done> waiters = std::move(it->second);
  waiting_.erase(it);
  for (Done& d : waiters) d(archive);
}

}  // namespace trainctl::worker
