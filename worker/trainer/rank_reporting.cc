#include "worker/trainer/rank_reporting.h"

#include <sys/resource.h>

#include <chrono>
#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainctl::trainer::rank {

using rankproto::ErrorKind;

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};

namespace {

std::atomic<int> g_rank_for_errors{0};

extern "C" void OnStopSignal(int sig) {
  g_signal.store(sig);
  g_stop.store(true);
}

// Peak resident memory of this process (VmHWM), or 0.
int64_t PeakRss() {
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

}  // namespace

void InstallStopHandlers() {
  ::signal(SIGPIPE, SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

void StatusSink::set_fd(int fd) {
  absl::MutexLock lock(&mu_);
  fd_ = fd;
}

void StatusSink::Send(const std::string& line) {
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0 && !rankproto::WriteLine(fd_, line)) fd_ = -1;  // daemon end closed
}

StatusSink& DaemonPipe() {
  static StatusSink* sink = new StatusSink();  // never destroyed: Fail may run during exit
  return *sink;
}

void LogLine(const std::string& line) { std::cout << line << std::endl; }

void SetRankForErrors(int rank) { g_rank_for_errors.store(rank); }

void Fail(ErrorKind kind, const std::string& message, int exit_code, int64_t step) {
  DaemonPipe().Send(rankproto::FormatError(kind, message, step));
  std::cerr << "trainctl-rank: error " << rankproto::ErrorKindName(kind) << ": " << message
            << std::endl;
  std::cout.flush();
  std::_Exit(exit_code);
}

void FailStatus(ErrorKind kind, const absl::Status& s, int exit_code) {
  Fail(kind, std::string(s.message()), exit_code);
}

bool IsOutOfMemoryText(absl::string_view text) {
  for (absl::string_view needle : {"can't allocate memory", "CUDA out of memory", "std::bad_alloc",
                                   "out of memory", "Cannot allocate memory"}) {
    if (text.find(needle) != absl::string_view::npos) return true;
  }
  return false;
}

void FailOutOfMemory(absl::string_view what) {
  what = what.substr(0, what.find('\n'));  // c10 appends a backtrace
  Fail(ErrorKind::kOutOfMemory,
       absl::StrFormat(
           "rank %d ran out of memory (peak resident %.1f GiB): %s; lower data.batch_size "
           "(or the model size, or data.num_workers)",
           g_rank_for_errors.load(), static_cast<double>(PeakRss()) / (1 << 30),
           std::string(what).substr(0, 300)),
       kExitOther);
}

HeartbeatReporter::HeartbeatReporter(std::shared_ptr<dist::CollectiveProbe> probe)
    : probe_(std::move(probe)), thread_([this] { Loop(); }) {}

HeartbeatReporter::~HeartbeatReporter() {
  done_.store(true);
  thread_.join();
}

void HeartbeatReporter::Progress(int32_t epoch, int64_t step) {
  epoch_.store(epoch, std::memory_order_relaxed);
  step_.store(step, std::memory_order_relaxed);
  Send();
}

void HeartbeatReporter::Send() {
  const dist::ProbeSnapshot p = probe_->Snapshot();
  rankproto::RankHeartbeat hb;
  hb.phase = dist::ProbePhaseName(p.phase);
  hb.seq = p.seq;
  hb.waiting_seq = p.waiting_seq;
  hb.op = dist::ProbeOpName(p.op);
  hb.op_step = p.op_step;
  hb.op_bucket = p.op_bucket;
  hb.waiting_ms = absl::ToInt64Milliseconds(p.waiting);
  hb.p99_step_ms = p.p99_step_ms;
  hb.compute_ms = p.compute_ms;
  DaemonPipe().Send(rankproto::FormatProgress(epoch_.load(), step_.load(), hb));
}

void HeartbeatReporter::Loop() {
  using namespace std::chrono_literals;
  // The first at once: a rank stopped before its first second is already
  // known to the coordinator, which judges only ranks it has heard.
  auto next = std::chrono::steady_clock::now();
  dist::ProbePhase sent_phase = probe_->Snapshot().phase;
  while (!done_.load()) {
    // A new phase (eval, checkpoint, the next epoch) is reported at once, so
    // that a rank stopped just after entering it is named in it.
    const dist::ProbePhase phase = probe_->Snapshot().phase;
    if (std::chrono::steady_clock::now() >= next) {
      sent_phase = phase;
      Send();
      next += 1s;
      if (next < std::chrono::steady_clock::now()) next = std::chrono::steady_clock::now() + 1s;
    } else if (phase != sent_phase) {
      sent_phase = phase;
      Send();
    }
    std::this_thread::sleep_for(50ms);
  }
}

StopWatcher::StopWatcher() : thread_([this] { Loop(); }) {}

StopWatcher::~StopWatcher() {
  done_.store(true);
  thread_.join();
}

void StopWatcher::set_comm(std::shared_ptr<dist::Collectives> comm) {
  absl::MutexLock lock(&mu_);
  comm_ = std::move(comm);
}

bool StopWatcher::WaitDone(int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!done_.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done_.load();
}

void StopWatcher::Loop() {
  while (!done_.load()) {
    if (g_stop.load()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (done_.load() || WaitDone(10)) return;
  {
    absl::MutexLock lock(&mu_);
    if (comm_ != nullptr) comm_->Abort();
  }
  if (WaitDone(5)) return;
  Fail(ErrorKind::kExit, absl::StrCat("stopped by signal ", g_signal.load()), kExitTerminated);
}

}  // namespace trainctl::trainer::rank
