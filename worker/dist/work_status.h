// WorkStatus: the final status of one collective's work, set once (the
// first Finish wins: a Wait that timed out may finish the work before the
// engine does), for the engines' CollectiveWork classes
// (gloo_collectives.cc, nccl_collectives.cc).
//
// Threading: thread-safe; Await blocks without holding anything else.
#pragma once

#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace trainctl::dist {

class WorkStatus {
 public:
  // Sets the status unless one is set already.
  void Finish(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    if (done_) return;
    done_ = true;
    status_ = std::move(status);
  }

  bool done() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return done_;
  }

  // The status once set, waiting at most `timeout`; nullopt when still unset.
  std::optional<absl::Status> Await(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) return std::nullopt;
    return status_;
  }

  // The status set (OK while unset).
  absl::Status status() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return status_;
  }

 private:
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainctl::dist
