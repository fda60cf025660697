// How trainctl-rank (rank_main.cc) reports to its worker daemon and ends:
// status lines on the daemon's pipe (rank_protocol.h), the exit codes, the
// failure exits (an error line, then _exit without destructors), the
// once-a-second heartbeat thread, and the watcher that forces a stop the
// training loop cannot reach.
//
// Threading: StatusSink is thread-safe (the heartbeat and stop-watcher
// threads report while the training thread does); the stop flag and signal
// number are atomics a signal handler sets; Fail* may be called from any
// thread and never return.
#pragma once

#include <signal.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "worker/dist/collective_probe.h"
#include "worker/dist/collectives.h"
#include "worker/protocol/rank_protocol.h"

namespace trainctl::trainer::rank {

constexpr int kExitOk = 0;
constexpr int kExitOther = 1;
constexpr int kExitConfig = 2;
constexpr int kExitCollective = 3;
constexpr int kExitTerminated = 128 + SIGTERM;

// Raised by SIGTERM/SIGINT (InstallStopHandlers); read by the trainer at
// every step boundary and by the StopWatcher.
extern std::atomic<bool> g_stop;
extern std::atomic<int> g_signal;
void InstallStopHandlers();

// Writes status lines to the daemon's pipe; drops them once the daemon's
// end closed or before set_fd.
class StatusSink {
 public:
  void set_fd(int fd) ABSL_LOCKS_EXCLUDED(mu_);
  void Send(const std::string& line) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
};
StatusSink& DaemonPipe();

// A log line on stdout.
void LogLine(const std::string& line);

// The rank named in out-of-memory errors.
void SetRankForErrors(int rank);

// Sends `error KIND: message` to the daemon, says it on stderr and exits
// with `exit_code`, skipping destructors: after a failure a communicator or
// loader thread may be stuck, and the daemon is waiting for the exit.
[[noreturn]] void Fail(rankproto::ErrorKind kind, const std::string& message, int exit_code,
                       int64_t step = 0);
[[noreturn]] void FailStatus(rankproto::ErrorKind kind, const absl::Status& s, int exit_code);
// An allocation failure in any of its spellings: std::bad_alloc, LibTorch's
// CPU allocator ("DefaultCPUAllocator: can't allocate memory"), CUDA's
// caching allocator ("CUDA out of memory").
bool IsOutOfMemoryText(absl::string_view text);
// `error out_of_memory` with the peak resident memory and what to lower.
[[noreturn]] void FailOutOfMemory(absl::string_view what);

// Sends the rank's heartbeat (a `progress` line with the collective probe's
// state) about once a second from its own thread, so that a rank blocked in
// a collective keeps saying where it is blocked. A rank stopped with SIGSTOP
// sends nothing at all, which is how the coordinator tells it apart.
class HeartbeatReporter {
 public:
  explicit HeartbeatReporter(std::shared_ptr<dist::CollectiveProbe> probe);
  ~HeartbeatReporter();
  HeartbeatReporter(const HeartbeatReporter&) = delete;
  HeartbeatReporter& operator=(const HeartbeatReporter&) = delete;
  // From the training loop's progress callback (at most once a second, and
  // at epoch boundaries): records the position and reports at once.
  void Progress(int32_t epoch, int64_t step);

 private:
  void Send();
  void Loop();

  std::shared_ptr<dist::CollectiveProbe> probe_;
  std::atomic<int32_t> epoch_{0};
  std::atomic<int64_t> step_{0};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Kills a stop that the training loop cannot reach: aborts the communicator
// when a stop was requested and the loop has not returned within 10 s, and
// exits outright 5 s after that.
class StopWatcher {
 public:
  StopWatcher();
  ~StopWatcher();
  StopWatcher(const StopWatcher&) = delete;
  StopWatcher& operator=(const StopWatcher&) = delete;
  void set_comm(std::shared_ptr<dist::Collectives> comm) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();
  // Sleeps until `done_` or `seconds` passed; returns done_.
  bool WaitDone(int seconds);

  std::atomic<bool> done_{false};
  absl::Mutex mu_;
  std::shared_ptr<dist::Collectives> comm_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace trainctl::trainer::rank
