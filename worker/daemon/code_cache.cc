// CodeCache (code_cache.h).
#include "worker/daemon/code_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/codepack/code_pack.h"
#include "common/log.h"

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

CodeCache::CodeCache(std::string dir, CodeSource* source, EventLoop& loop, const Clock* clock)
    : dir_(std::move(dir)), source_(source), loop_(loop), clock_(clock != nullptr ? *clock : *SystemClock::Get()) {}

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
    done(absl::InvalidArgumentError(absl::StrCat("command.code.digest: '", digest, "' is not sha256:<64 hex>")));
    return;
  }
  const std::string path = ArchivePath(digest);
  if (access(path.c_str(), F_OK) == 0) {
    done(path);
    return;
  }
  if (source_ == nullptr) {
    done(absl::FailedPreconditionError(absl::StrCat("code ", digest, ": this worker has no coordinator to fetch it from")));
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
  const std::string part = absl::StrCat(path, ".part");
  absl::StatusOr<std::string> result = [&]() -> absl::StatusOr<std::string> {
    if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::InternalError(absl::StrCat("cannot make ", dir_, ": ", std::strerror(errno)));
    }
    const absl::Time start = clock_.Mono();
    if (absl::Status s = source_->FetchCode(job_id, digest, part); !s.ok()) {
      ::unlink(part.c_str());
      return absl::Status(s.code(), absl::StrCat("fetching code ", digest, " from the coordinator: ", s.message()));
    }
    absl::StatusOr<std::string> got = codepack::FileDigest(part);
    if (!got.ok() || *got != digest) {
      ::unlink(part.c_str());
      return absl::DataLossError(absl::StrCat("code ", digest, " arrived as ", got.ok() ? *got : got.status().ToString(),
                                              "; not kept"));
    }
    if (::rename(part.c_str(), path.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("cannot rename ", part, ": ", std::strerror(errno)));
    }
    struct stat st {};
    ::stat(path.c_str(), &st);
    LogEvent(LogLevel::kInfo, "worker", "code_fetched",
             {{"job_id", job_id}, {"digest", digest}, {"bytes", absl::StrCat(st.st_size)},
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
