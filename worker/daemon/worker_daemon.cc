// WorkerDaemon: start and shutdown, the loop's message dispatch and the
// /metrics page. The Session stream is daemon_session.cc; ranks are
// rank_launch.cc (start, rendezvous), rank_end.cc (stop, exit) and
// rank_status_lines.cc (status lines, logs, metrics); fetches are
// daemon_artifacts.cc.
//
// Threading: Start and Shutdown run on the owner's thread; MetricsPage on
// the HTTP server's (it asks the loop for a snapshot); OnMessage on the loop.
#include "worker/daemon/worker_daemon.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/prometheus.h"
#include "worker/daemon/join.h"
#include "worker/daemon/rank_files.h"
#include "worker/daemon/path_policy.h"
#include "worker/daemon/worker_daemon_internal.h"

namespace trainctl::worker {

namespace fs = std::filesystem;

std::string AttemptKey(const std::string& job_id, int32_t attempt) { return absl::StrCat(job_id, "/", attempt); }

WorkerDaemon::WorkerDaemon(DaemonOptions options)
    : options_(std::move(options)), telemetry_(options_.telemetry_buffer_bytes) {}

WorkerDaemon::~WorkerDaemon() { Shutdown(false, absl::Seconds(2)); }

std::string WorkerDaemon::worker_id() {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

bool WorkerDaemon::connected() {
  absl::MutexLock lock(&mu_);
  return connected_;
}

int WorkerDaemon::running_ranks() {
  return supervisor_ ? static_cast<int>(supervisor_->Running().size()) : 0;
}

absl::Status WorkerDaemon::Start() {
  std::error_code ec;
  base_dir_ = fs::current_path(ec).string();
  if (ec) return absl::InternalError(absl::StrCat("cannot read the working directory: ", ec.message()));
  fs::create_directories(options_.work_dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--work-dir ", options_.work_dir, ": ", ec.message()));
  // Rank processes run in their own directories: every path handed to them
  // (rank config, checkpoints) must not depend on the daemon's cwd.
  fs::path absolute = fs::absolute(options_.work_dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--work-dir ", options_.work_dir, ": ", ec.message()));
  options_.work_dir = absolute.lexically_normal().string();
  while (options_.work_dir.size() > 1 && options_.work_dir.back() == '/') options_.work_dir.pop_back();
  // The daemon's files out of its ranks' reach (rank_files.h).
  if (absl::Status s = SecureWorkDir(options_.work_dir, options_.rank_user); !s.ok()) return s;
  // Without --data-root a job reads data only where the operator expects
  // jobs' data (a path anywhere would read any file this user can).
  if (options_.data_roots.empty()) {
    data_read_roots_ = DefaultDataRoots(options_.work_dir);
    data_roots_name_ = kDefaultDataRootsName;
  } else {
    data_read_roots_ = options_.data_roots;
  }
  if (options_.rank_binary.find('/') != std::string::npos) {
    options_.rank_binary = fs::absolute(options_.rank_binary, ec).lexically_normal().string();
  }
  if (access(options_.rank_binary.c_str(), X_OK) != 0 && !options_.allow_commands) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank-binary ", options_.rank_binary, ": not an executable file"));
  }
  id_file_ = options_.work_dir + "/worker-id";
  {
    std::ifstream in(id_file_);
    std::string id;
    if (in >> id) {
      absl::MutexLock lock(&mu_);
      worker_id_ = id;
    }
  }
  RankCallbacks cb;
  cb.on_status = [this](const std::string& key, const std::string& line) {
    loop_.Post([this, key, line] { OnStatusLine(key, line); });
  };
  cb.on_logs = [this](const std::string& key, std::shared_ptr<const RankLogBatch> batch) {
    loop_.Post([this, key, batch = std::move(batch)] { OnLogBatch(key, *batch); });
  };
  cb.on_exit = [this](const std::string& key, int code, int sig) {
    loop_.Post([this, key, code, sig] { OnExit(key, code, sig); });
  };
  SupervisorOptions so;
  so.log_lines_per_sec = options_.log_lines_per_sec;
  so.log_burst = options_.log_burst;
  supervisor_ = std::make_unique<RankSupervisor>(std::move(cb), so);
  loop_.Every(options_.metrics_flush, [this] { FlushMetrics(); });
  loop_.Every(options_.log_flush, [this] { FlushLogs(); });
  if (!options_.http_listen.empty()) {
    http_.Handle("/metrics", [this] {
      return HttpServer::Reply{200, "text/plain; version=0.0.4; charset=utf-8", MetricsPage()};
    });
    absl::StatusOr<std::string> bound = http_.Start(options_.http_listen);
    if (!bound.ok()) return bound.status();
    http_address_ = *bound;
  }
  started_ = true;
  session_ = std::thread([this] { SessionLoop(); });
  writer_ = std::thread([this] { WriterLoop(); });
  if (options_.renew_certificate) renewer_ = std::thread([this] { RenewLoop(); });
  return absl::OkStatus();
}

void WorkerDaemon::RenewLoop() {
  do {
    RenewResult r = RenewCertificateIfDue(options_.coordinator, options_.ca_file, options_.work_dir, absl::Now());
    if (r.renewed) {
      LogEvent(LogLevel::kInfo, "worker", "certificate_renewed",
               {{"worker_id", worker_id()}, {"cert", options_.cert_file}, {"expires", absl::FormatTime(r.expires)}});
    } else if (!r.error.ok()) {
      LogEvent(LogLevel::kWarn, "worker", "certificate_renewal_failed",
               {{"worker_id", worker_id()}, {"reason", std::string(r.error.message())},
                {"expires", r.expires == absl::Time() ? "" : absl::FormatTime(r.expires)},
                {"retry_in", absl::FormatDuration(r.next_check)}});
    }
    if (!SleepUnlessShuttingDown(r.next_check)) return;
  } while (true);
}

std::string WorkerDaemon::MetricsPage() {
  struct RankRow {
    std::string job_id;
    int32_t rank;
    std::optional<v1::MetricPoint> last;
  };
  struct Snapshot {
    std::map<std::string, int64_t> by_state;
    std::vector<RankRow> running;
  };
  auto snap = std::make_shared<Snapshot>();
  auto done = std::make_shared<absl::Notification>();
  loop_.Post([this, snap, done] {
    for (auto& [key, a] : attempts_) {
      for (auto& [rank, r] : a->ranks) {
        ++snap->by_state[r.state.gauge_label()];
        if (r.state.live()) snap->running.push_back({a->job_id, rank, r.last_train});
      }
    }
    done->Notify();
  });
  const bool answered = done->WaitForNotificationWithTimeout(absl::Seconds(5));
  PromWriter w;
  w.Family("trainctl_worker_connected", "gauge", "1 while the daemon has a registered session with its coordinator.");
  w.Sample("trainctl_worker_connected", {}, connected() ? 1 : 0);
  w.Family("trainctl_worker_slots", "gauge", "Slots (GPUs or CPU slots) this worker offers.");
  w.Sample("trainctl_worker_slots", {}, static_cast<double>(options_.slots.size()));
  w.Family("trainctl_worker_loop_responsive", "gauge", "1 when the daemon's event loop answered within 5 s.");
  w.Sample("trainctl_worker_loop_responsive", {}, answered ? 1 : 0);
  if (!answered) return w.Take();
  w.Family("trainctl_worker_ranks", "gauge",
           "Rank processes of this worker's current attempts: waiting (not started), starting, running (ready), exited.");
  for (const char* state : {"waiting", "starting", "running", "exited"}) {
    w.Sample("trainctl_worker_ranks", {{"state", state}}, static_cast<double>(snap->by_state[state]));
  }
  struct Gauge {
    const char* name;
    const char* help;
    double (*value)(const v1::MetricPoint&);
  };
  const Gauge gauges[] = {
      {"trainctl_worker_rank_samples_per_second", "A running rank's samples/s (latest window).",
       [](const v1::MetricPoint& p) { return p.samples_per_sec(); }},
      {"trainctl_worker_rank_step_ms", "A running rank's mean ms per step: data + compute + exposed communication.",
       [](const v1::MetricPoint& p) { return p.data_ms() + p.compute_ms() + p.comm_ms(); }},
      {"trainctl_worker_rank_comm_ms", "A running rank's mean ms per step of communication not hidden behind backward.",
       [](const v1::MetricPoint& p) { return p.comm_ms(); }},
      {"trainctl_worker_rank_peak_memory_bytes", "A running rank's peak device memory (CUDA) or resident set (CPU).",
       [](const v1::MetricPoint& p) { return static_cast<double>(p.peak_memory_bytes()); }},
  };
  for (const Gauge& g : gauges) {
    w.Family(g.name, "gauge", g.help);
    for (const RankRow& r : snap->running) {
      if (r.last.has_value()) w.Sample(g.name, {{"job_id", r.job_id}, {"rank", absl::StrCat(r.rank)}}, g.value(*r.last));
    }
  }
  return w.Take();
}

void WorkerDaemon::Shutdown(bool goodbye, absl::Duration grace) {
  if (shut_down_ || !started_) return;
  shut_down_ = true;
  http_.Stop();
  // Stop every rank and wait (bounded) for them to go.
  for (const std::string& key : supervisor_->Running()) supervisor_->Stop(key, grace);
  absl::Time deadline = MonotonicNow() + grace + absl::Seconds(1);
  while (!supervisor_->Running().empty() && MonotonicNow() < deadline) absl::SleepFor(absl::Milliseconds(20));
  loop_.RunSync([this] {
    FlushMetrics();
    FlushLogs();
  });
  if (goodbye) {
    // What the ranks said last reaches the coordinator before the goodbye
    // (bounded: a coordinator that is away gets what it missed never).
    {
      absl::MutexLock lock(&mu_);
      auto flushed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return telemetry_.empty() || !connected_; };
      mu_.AwaitWithTimeout(absl::Condition(&flushed), absl::Seconds(2));
    }
    v1::WorkerMessage bye;
    bye.mutable_goodbye()->set_reason("worker shutting down");
    Enqueue(bye, true);
    // The coordinator ends the session when it has read the goodbye; until
    // then the stream must not be cancelled, or the goodbye (taken off the
    // queue, its write still in flight) may be lost and the coordinator
    // waits out the disconnect grace instead (bounded).
    absl::MutexLock lock(&mu_);
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !connected_; };
    mu_.AwaitWithTimeout(absl::Condition(&ended), absl::Seconds(2));
  }
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    if (ctx_ != nullptr) ctx_->TryCancel();
  }
  if (session_.joinable()) session_.join();
  if (writer_.joinable()) writer_.join();
  if (renewer_.joinable()) renewer_.join();
  loop_.StopAndJoin();
  supervisor_.reset();
}

void WorkerDaemon::OnMessage(const v1::CoordinatorMessage& m) {
  loop_.CheckInLoop("WorkerDaemon::OnMessage");
  switch (m.msg_case()) {
    case v1::CoordinatorMessage::kStartRanks: return OnStartRanks(m.start_ranks());
    case v1::CoordinatorMessage::kRendezvous: return OnRendezvous(m.rendezvous());
    case v1::CoordinatorMessage::kStopRanks: return OnStopRanks(m.stop_ranks());
    case v1::CoordinatorMessage::kReadFile: return OnReadFile(m.read_file());
    case v1::CoordinatorMessage::kDropCheckpoints: return OnDropCheckpoints(m.drop_checkpoints());
    case v1::CoordinatorMessage::kPreflight: return OnPreflight(m.preflight());
    default: return;  // Acknowledgements: the session thread takes those it needs.
  }
}

}  // namespace trainctl::worker
