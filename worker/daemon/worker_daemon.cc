// WorkerDaemon: wiring its owners together (worker_daemon.h), start and
// shutdown, and the /metrics page.
//
// Threading: Start and Shutdown run on the owner's thread; MetricsPage on
// the HTTP server's (it asks the loop for the table's snapshot).
#include "worker/daemon/worker_daemon.h"

#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/prometheus.h"
#include "worker/daemon/code_source.h"
#include "worker/daemon/join.h"
#include "worker/daemon/path_policy.h"
#include "worker/daemon/rank_files.h"

namespace trainctl::worker {

namespace fs = std::filesystem;

WorkerDaemon::WorkerDaemon(DaemonOptions options)
    : options_(std::move(options)), loop_(options_.clock) {}

WorkerDaemon::~WorkerDaemon() {
  Shutdown(false, absl::Seconds(2));
  // A Start that failed half way may have left timers on the loop that
  // touch the table: nothing runs after this.
  loop_.StopAndJoin();
}

std::string WorkerDaemon::worker_id() { return session_ ? session_->worker_id() : ""; }

bool WorkerDaemon::connected() { return session_ && session_->connected(); }

int WorkerDaemon::running_ranks() {
  return supervisor_ ? static_cast<int>(supervisor_->Running().size()) : 0;
}

absl::Status WorkerDaemon::Start() {
  std::error_code ec;
  RankTablePaths paths;
  paths.base_dir = fs::current_path(ec).string();
  if (ec)
    return absl::InternalError(absl::StrCat("cannot read the working directory: ", ec.message()));
  fs::create_directories(options_.work_dir, ec);
  if (ec)
    return absl::InvalidArgumentError(
        absl::StrCat("--work-dir ", options_.work_dir, ": ", ec.message()));
  // Rank processes run in their own directories: every path handed to them
  // (rank config, checkpoints) must not depend on the daemon's cwd.
  fs::path absolute = fs::absolute(options_.work_dir, ec);
  if (ec)
    return absl::InvalidArgumentError(
        absl::StrCat("--work-dir ", options_.work_dir, ": ", ec.message()));
  options_.work_dir = absolute.lexically_normal().string();
  while (options_.work_dir.size() > 1 && options_.work_dir.back() == '/')
    options_.work_dir.pop_back();
  // The daemon's files out of its ranks' reach (rank_files.h).
  if (absl::Status s = SecureWorkDir(options_.work_dir, options_.rank_user); !s.ok()) return s;
  // Without --data-root a job reads data only where the operator expects
  // jobs' data (a path anywhere would read any file this user can).
  if (options_.data_roots.empty()) {
    paths.data_read_roots = DefaultDataRoots(options_.work_dir);
    paths.data_roots_name = kDefaultDataRootsName;
  } else {
    paths.data_read_roots = options_.data_roots;
  }
  if (options_.rank_binary.find('/') != std::string::npos) {
    options_.rank_binary = fs::absolute(options_.rank_binary, ec).lexically_normal().string();
  }
  if (access(options_.rank_binary.c_str(), X_OK) != 0 && !options_.allow_commands) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank-binary ", options_.rank_binary, ": not an executable file"));
  }
  // The supervisor and the session hand what they learn to the loop, where
  // the table acts on it.
  RankCallbacks cb;
  cb.on_status = [this](const std::string& key, const std::string& line) {
    loop_.Post([this, key, line] { table_->OnStatusLine(key, line); });
  };
  cb.on_logs = [this](const std::string& key, std::shared_ptr<const RankLogBatch> batch) {
    loop_.Post([this, key, batch = std::move(batch)] { table_->OnLogBatch(key, *batch); });
  };
  cb.on_exit = [this](const std::string& key, int code, int sig) {
    loop_.Post([this, key, code, sig] { table_->OnExit(key, code, sig); });
  };
  SupervisorOptions so;
  so.log_lines_per_sec = options_.log_lines_per_sec;
  so.log_burst = options_.log_burst;
  so.clock = options_.clock;
  supervisor_ = std::make_unique<RankSupervisor>(std::move(cb), so);
  SessionHooks hooks;
  hooks.running_ranks = [this] {
    std::vector<v1::RunningRank> running;
    loop_.RunSync([&] { running = table_->RunningRanks(); });
    return running;
  };
  hooks.on_message = [this](const v1::CoordinatorMessage& m) {
    loop_.Post([this, m] { table_->OnMessage(m); });
  };
  session_ =
      std::make_unique<DaemonSession>(options_, options_.work_dir + "/worker-id", std::move(hooks));
  code_source_ = std::make_unique<CoordinatorCodeSource>(
      options_, [this] { return session_->CoordinatorAddress(); });
  table_ = std::make_unique<RankTable>(options_, std::move(paths), loop_, *session_, *supervisor_,
                                       code_source_.get());
  loop_.Every(options_.metrics_flush, [this] { table_->FlushMetrics(); });
  loop_.Every(options_.log_flush, [this] { table_->FlushLogs(); });
  if (!options_.http_listen.empty()) {
    http_.Handle("/metrics", [this] {
      return HttpServer::Reply{200, "text/plain; version=0.0.4; charset=utf-8", MetricsPage()};
    });
    absl::StatusOr<std::string> bound = http_.Start(options_.http_listen);
    if (!bound.ok()) return bound.status();
    http_address_ = *bound;
  }
  started_ = true;
  session_->Start();
  if (options_.renew_certificate) renewer_ = std::thread([this] { RenewLoop(); });
  return absl::OkStatus();
}

void WorkerDaemon::RenewLoop() {
  do {
    RenewResult r = RenewCertificateIfDue(options_.coordinator, options_.ca_file, options_.work_dir,
                                          DaemonClock(options_).Now());
    if (r.renewed) {
      LogEvent(LogLevel::kInfo, "worker", "certificate_renewed",
               {{"worker_id", worker_id()},
                {"cert", options_.cert_file},
                {"expires", absl::FormatTime(r.expires)}});
    } else if (!r.error.ok()) {
      LogEvent(LogLevel::kWarn, "worker", "certificate_renewal_failed",
               {{"worker_id", worker_id()},
                {"reason", std::string(r.error.message())},
                {"expires", r.expires == absl::Time() ? "" : absl::FormatTime(r.expires)},
                {"retry_in", absl::FormatDuration(r.next_check)}});
    }
    if (!session_->SleepUnlessStopping(r.next_check)) return;
  } while (true);
}

std::string WorkerDaemon::MetricsPage() {
  auto snap = std::make_shared<RankTable::Snapshot>();
  auto done = std::make_shared<absl::Notification>();
  loop_.Post([this, snap, done] {
    *snap = table_->TakeSnapshot();
    done->Notify();
  });
  const bool answered = done->WaitForNotificationWithTimeout(absl::Seconds(5));
  PromWriter w;
  w.Family("trainctl_worker_connected", "gauge",
           "1 while the daemon has a registered session with its coordinator.");
  w.Sample("trainctl_worker_connected", {}, connected() ? 1 : 0);
  w.Family("trainctl_worker_slots", "gauge", "Slots (GPUs or CPU slots) this worker offers.");
  w.Sample("trainctl_worker_slots", {}, static_cast<double>(options_.slots.size()));
  w.Family("trainctl_worker_loop_responsive", "gauge",
           "1 when the daemon's event loop answered within 5 s.");
  w.Sample("trainctl_worker_loop_responsive", {}, answered ? 1 : 0);
  if (!answered) return w.Take();
  w.Family("trainctl_worker_ranks", "gauge",
           "Rank processes of this worker's current attempts: waiting (not started), starting, "
           "running (ready), exited.");
  for (const char* state : {"waiting", "starting", "running", "exited"}) {
    w.Sample("trainctl_worker_ranks", {{"state", state}},
             static_cast<double>(snap->by_state[state]));
  }
  struct Gauge {
    const char* name;
    const char* help;
    double (*value)(const v1::MetricPoint&);
  };
  const Gauge gauges[] = {
      {"trainctl_worker_rank_samples_per_second", "A running rank's samples/s (latest window).",
       [](const v1::MetricPoint& p) { return p.samples_per_sec(); }},
      {"trainctl_worker_rank_step_ms",
       "A running rank's mean ms per step: data + compute + exposed communication.",
       [](const v1::MetricPoint& p) { return p.data_ms() + p.compute_ms() + p.comm_ms(); }},
      {"trainctl_worker_rank_comm_ms",
       "A running rank's mean ms per step of communication not hidden behind backward.",
       [](const v1::MetricPoint& p) { return p.comm_ms(); }},
      {"trainctl_worker_rank_peak_memory_bytes",
       "A running rank's peak device memory (CUDA) or resident set (CPU).",
       [](const v1::MetricPoint& p) { return static_cast<double>(p.peak_memory_bytes()); }},
  };
  for (const Gauge& g : gauges) {
    w.Family(g.name, "gauge", g.help);
    for (const RankTable::LiveRank& r : snap->live) {
      if (r.last_train.has_value()) {
        w.Sample(g.name, {{"job_id", r.job_id}, {"rank", absl::StrCat(r.rank)}},
                 g.value(*r.last_train));
      }
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
  supervisor_->WaitNoneRunning(grace + absl::Seconds(1));
  loop_.RunSync([this] {
    table_->FlushMetrics();
    table_->FlushLogs();
  });
  if (goodbye) {
    // What the ranks said last reaches the coordinator before the goodbye
    // (bounded: a coordinator that is away gets what it missed never).
    session_->AwaitAcknowledged(absl::Seconds(2));
    session_->SayGoodbye("worker shutting down", absl::Seconds(2));
  }
  session_->Stop();
  code_source_->CancelFetches();
  if (renewer_.joinable()) renewer_.join();
  loop_.StopAndJoin();
  supervisor_.reset();
}

}  // namespace trainctl::worker
