// CoordinatorCodeSource: the CodeSource (code_cache.h) that asks the
// coordinator (WorkerService.FetchCode) with the daemon's own credentials:
// its worker token or its joined certificate, over the same TLS as the
// session, at whichever coordinator the session dials now.
//
// Threading: FetchCode on any thread (each call has its own channel);
// CancelFetches from any thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/daemon/code_cache.h"
#include "worker/daemon/daemon_options.h"

namespace trainctl::worker {

class CoordinatorCodeSource final : public CodeSource {
 public:
  // `options` outlives the source; `address` says which coordinator to ask.
  CoordinatorCodeSource(const DaemonOptions& options, std::function<std::string()> address,
                        absl::Duration deadline = absl::Minutes(10));
  absl::Status FetchCode(const std::string& job_id, const std::string& digest, Sink write) override;
  void CancelFetches() override;

 private:
  const DaemonOptions& options_;
  const std::function<std::string()> address_;
  const absl::Duration deadline_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainctl::worker
