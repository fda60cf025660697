// CodeCache: a job's code archive (CommandSpec.code, docs/command-jobs.md
// "Code travels with the job") on this host. Fetched once per digest from
// the coordinator through a CodeSource (WorkerService.FetchCode) into
// DIR/<hex>.tar, checked against its digest before it is kept, and shared
// by every attempt (of any job) that names the same digest; the rank table
// unpacks a copy per attempt into a directory the attempt's ranks own.
//
// Every file-system call goes through a FileEnv (common/file_env.h): the
// archive is written as a SafeFileWriter temporary file (common/safe_file.h),
// fsync'ed and renamed into place only once its digest checks; a failed
// write, fsync or rename (a full or broken disk) is reported naming the path
// and the errno, and leaves nothing behind (a later Want fetches again).
//
// Threading: Want and the callbacks run on the daemon's EventLoop; each
// fetch runs on a thread of its own, which posts its end to the loop. The
// destructor cancels fetches in flight and waits for their threads (their
// callbacks are not called).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "common/file_env.h"

namespace trainctl::worker {

// Where archives come from: the coordinator, or a test's stand-in.
class CodeSource {
 public:
  virtual ~CodeSource() = default;
  // Where the archive's bytes go, in order; an error ends the fetch with it.
  using Sink = absl::FunctionRef<absl::Status(absl::string_view bytes)>;
  // Streams the archive of job `job_id`'s code `digest` to `write`. Blocks;
  // called on a fetch thread.
  virtual absl::Status FetchCode(const std::string& job_id, const std::string& digest,
                                 Sink write) = 0;
  // Ends every FetchCode in progress soon (with an error). Any thread.
  virtual void CancelFetches() = 0;
};

// Whether `digest` is "sha256:" and 64 lowercase hex digits.
bool IsCodeDigest(const std::string& digest);

class CodeCache {
 public:
  using Done = std::function<void(absl::StatusOr<std::string> archive)>;
  // `dir` is made (0700) when missing; `source` may be null (no coordinator
  // to fetch from: every Want fails, naming why). `source`, `loop`,
  // `clock` (null: SystemClock; times a fetch) and `env` (null: the real
  // file system) outlive the cache.
  CodeCache(std::string dir, CodeSource* source, EventLoop& loop, const Clock* clock = nullptr,
            FileEnv* env = nullptr);
  ~CodeCache();
  CodeCache(const CodeCache&) = delete;
  CodeCache& operator=(const CodeCache&) = delete;

  // On the loop: `done` gets the archive's path once it is here (at once
  // when it is already), or why it cannot be had. One fetch per digest
  // however many ask while it runs.
  void Want(const std::string& job_id, const std::string& digest, Done done);

  // The archive's path in the cache (whether or not it is there).
  std::string ArchivePath(const std::string& digest) const;

 private:
  void Fetch(std::string job_id, std::string digest);
  void Finish(const std::string& digest, const absl::StatusOr<std::string>& archive);

  const std::string dir_;
  CodeSource* const source_;
  EventLoop& loop_;
  const Clock& clock_;
  FileEnv* const env_;
  // Loop only: callbacks waiting for a digest being fetched.
  std::map<std::string, std::vector<Done>> waiting_;
  // Set by the destructor: a fetch's end is then dropped.
  std::shared_ptr<std::atomic<bool>> alive_ = std::make_shared<std::atomic<bool>>(true);
  absl::Mutex mu_;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainctl::worker
