#include "worker/daemon/worker_daemon.h"

#include "common/auth/secret.h"

#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <regex>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/random_secret.h"
#include "common/jobspec/job_spec.h"
#include "common/grpc_keepalive.h"
#include "common/log.h"
#include "common/nccl_id.h"
#include "common/prometheus.h"
#include "common/time_util.h"
#include "worker/daemon/artifact_reader.h"
#include "worker/daemon/oom_events.h"
#include "worker/daemon/path_policy.h"
#include "worker/daemon/preflight.h"
#include "worker/protocol/rank_protocol.h"

namespace trainctl::worker {

namespace fs = std::filesystem;
namespace rk = rankproto::run_keys;

constexpr int kLastLogLines = 20;

// A rank's final status (the kind that travels with a re-registration).
static bool IsEnd(const v1::WorkerMessage& m) {
  if (!m.has_rank_status()) return false;
  v1::RankState s = m.rank_status().state();
  return s == v1::RANK_STATE_SUCCEEDED || s == v1::RANK_STATE_FAILED || s == v1::RANK_STATE_STOPPED;
}

struct WorkerDaemon::LocalRank {
  v1::RankAssignment assignment;
  std::string key;  // "job/attempt/rank"
  bool launched = false;
  bool exited = false;
  bool stop_requested = false;
  bool reported_end = false;
  pid_t pid = -1;
  std::optional<rankproto::ErrorKind> error_kind;
  std::string error_message;
  int64_t error_step = 0;  // the step of a kNan error
  // The cgroup's OOM-kill count when the rank was launched (unknown: none).
  std::optional<int64_t> oom_kills_at_launch;
  std::deque<std::string> last_lines;
  // Log forwarding (already rate limited by the RankSupervisor): lines for
  // the next chunk, and the count dropped since the last one.
  std::vector<v1::LogLine> pending_logs;
  int64_t dropped = 0;
  // Reported `ready`; its latest train window (for /metrics).
  bool ready = false;
  std::optional<v1::MetricPoint> last_train;
};

// A TCP port held for rank 0's store: bound (SO_REUSEADDR, not listening) so
// that no other process is handed it, until the store listens on it (the
// store sets SO_REUSEADDR too, which lets it bind while nobody listens).
class ReservedPort {
 public:
  ReservedPort() = default;
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;
  ~ReservedPort() { Release(); }

  // Binds a free port on every interface; false when the host refuses.
  bool Reserve() {
    Release();
    for (int family : {AF_INET6, AF_INET}) {
      int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      int on = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
      sockaddr_storage addr{};
      socklen_t len;
      if (family == AF_INET6) {
        int off = 0;  // dual stack: the store may listen on IPv4 or IPv6
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
        auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
        a6->sin6_family = AF_INET6;
        a6->sin6_addr = in6addr_any;
        len = sizeof(sockaddr_in6);
      } else {
        auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
        a4->sin_family = AF_INET;
        a4->sin_addr.s_addr = htonl(INADDR_ANY);
        len = sizeof(sockaddr_in);
      }
      if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
          getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
        fd_ = fd;
        port_ = ntohs(family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                         : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
        return true;
      }
      close(fd);
    }
    return false;
  }
  void Release() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

struct WorkerDaemon::LocalAttempt {
  std::string job_id;
  int32_t number = 0;
  v1::JobSpec spec;
  bool produce_rendezvous = false;
  bool gpu = false;
  std::optional<v1::RendezvousInfo> rendezvous;
  // Rank 0's store port, reserved by this daemon (CPU attempts it produces
  // the rendezvous for); the rendezvous was then reported before any rank ran.
  ReservedPort store_port;
  bool rendezvous_reported = false;
  std::map<int32_t, LocalRank> ranks;
  std::vector<v1::MetricPoint> pending_metrics;
  std::string checkpoint_dir;
  // Where rank 0 writes TensorBoard event files ("" = the job has none).
  std::string tensorboard_dir;
  // The coordinator's record to resume from (unset: a fresh start).
  std::optional<v1::CheckpointRecord> resume;
  // Steps the ranks skip (a NaN rollback's), as run.skip_steps.
  std::string skip_steps;
  // Why the job's paths are refused on this worker ("" = fine): its ranks
  // fail as a configuration error instead of starting.
  std::string path_error;
  std::string spec_hash;
  // A command job (spec.command): ranks are the user's program.
  bool command = false;
  // command.working_dir resolved under the path policy (command jobs).
  std::string command_dir;
  // The attempt's rendezvous secret: only ever written to the ranks' 0600
  // config files, never logged or reported.
  std::string store_secret;
};

std::vector<std::string> CommandEnvironment(const std::string& job_id, int32_t attempt,
                                            const v1::RankAssignment& ra, int32_t max_restarts,
                                            const std::string& master_addr, const std::string& master_port,
                                            const std::string& checkpoint_dir) {
  return {absl::StrCat("RANK=", ra.rank()),
          absl::StrCat("LOCAL_RANK=", ra.local_rank()),
          absl::StrCat("WORLD_SIZE=", ra.world_size()),
          absl::StrCat("LOCAL_WORLD_SIZE=", ra.local_world_size()),
          absl::StrCat("GROUP_RANK=", ra.node_rank()),
          absl::StrCat("GROUP_WORLD_SIZE=", std::max(1, ra.num_nodes())),
          absl::StrCat("ROLE_RANK=", ra.rank()),
          absl::StrCat("ROLE_WORLD_SIZE=", ra.world_size()),
          "ROLE_NAME=default",
          absl::StrCat("MASTER_ADDR=", master_addr),
          absl::StrCat("MASTER_PORT=", master_port),
          absl::StrCat("TORCHELASTIC_RESTART_COUNT=", std::max(0, attempt - 1)),
          absl::StrCat("TORCHELASTIC_MAX_RESTARTS=", max_restarts),
          absl::StrCat("TORCHELASTIC_RUN_ID=", job_id),
          absl::StrCat("TRAINCTL_JOB_ID=", job_id),
          absl::StrCat("TRAINCTL_ATTEMPT=", attempt),
          absl::StrCat("TRAINCTL_CHECKPOINT_DIR=", checkpoint_dir),
          "TRAINCTL_STATUS_FD=3"};
}

std::string DefaultPythonDir() {
#ifdef TRAINCTL_SOURCE_PYTHON_DIR
  std::error_code ec;
  if (fs::exists(fs::path(TRAINCTL_SOURCE_PYTHON_DIR) / "trainctl" / "__init__.py", ec)) {
    return TRAINCTL_SOURCE_PYTHON_DIR;
  }
#endif
  return "";
}

std::string ExceptionLine(const std::deque<std::string>& lines) {
  // "ValueError: ...", "torch.distributed.DistBackendError: ...",
  // "KeyboardInterrupt", "SystemExit: 3": a dotted name ending in one of
  // Python's exception suffixes, at the start of the line.
  static const std::regex kException(R"(^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b.*)");
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (std::regex_match(*it, kException)) return it->size() > 300 ? it->substr(0, 300) : *it;
  }
  return "";
}
namespace {
// "UNAVAILABLE" for a status without a message.
std::string GrpcCodeText(grpc::StatusCode code) { return absl::StrCat("gRPC code ", static_cast<int>(code)); }
}  // namespace

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
  return absl::OkStatus();
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
        const char* state = !r.launched ? "waiting" : r.exited ? "exited" : r.ready ? "running" : "starting";
        ++snap->by_state[state];
        if (r.launched && !r.exited) snap->running.push_back({a->job_id, rank, r.last_train});
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
  absl::Time deadline = absl::Now() + grace + absl::Seconds(1);
  while (!supervisor_->Running().empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
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
  loop_.StopAndJoin();
  supervisor_.reset();
}

// --- session -------------------------------------------------------------------

void WorkerDaemon::RememberArtifact(const std::string& path) {
  std::error_code ec;
  std::string canonical = std::filesystem::canonical(path, ec).string();
  if (!ec) reported_artifacts_.insert(std::move(canonical));
}

bool WorkerDaemon::Enqueue(v1::WorkerMessage msg, bool critical) {
  absl::MutexLock lock(&mu_);
  // A file chunk answers a fetch of this session: not telemetry to replay.
  if (msg.has_heartbeat() || msg.has_goodbye() || msg.has_file_chunk()) {
    if (!connected_ && !critical) return false;  // A heartbeat is only worth sending now.
    control_.push_back(std::move(msg));
    return true;
  }
  telemetry_.Append(std::move(msg));
  return true;
}

void WorkerDaemon::WriterLoop() {
  while (true) {
    v1::WorkerMessage msg;
    grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>* stream = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return shutting_down_ ||
               (stream_ != nullptr && (!control_.empty() || telemetry_.NextAfter(sent_seq_, nullptr)));
      };
      mu_.Await(absl::Condition(&ready));
      if (shutting_down_) return;
      if (!control_.empty()) {
        msg = std::move(control_.front());
        control_.pop_front();
      } else {
        telemetry_.NextAfter(sent_seq_, &msg);
        // Sent once per session; a resend happens only on the next one.
        sent_seq_ = msg.seq();
      }
      stream = stream_;
      writing_ = true;
    }
    bool ok = stream->Write(msg);
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok && stream_ == stream) {
      // The stream broke: the session thread sees it on its Read, ends the
      // session and reconnects. Nothing more goes on this stream.
      stream_ = nullptr;
      connected_ = false;
    }
  }
}

std::vector<v1::RunningRank> WorkerDaemon::RanksForRegister() {
  std::vector<v1::RunningRank> running;
  loop_.RunSync([&] { running = RunningRanks(); });
  // A rank whose end the coordinator has not acknowledged is still running
  // as far as it knows: its end follows on the stream, after the metrics and
  // logs sent before it (listing it as ended would apply the end first).
  absl::MutexLock lock(&mu_);
  telemetry_.ForEach([&](const v1::WorkerMessage& m) {
    if (!IsEnd(m)) return;
    const v1::RankStatus& st = m.rank_status();
    for (const v1::RunningRank& r : running) {
      if (r.job_id() == st.job_id() && r.attempt() == st.attempt() && r.rank() == st.rank()) return;
    }
    v1::RunningRank rr;
    rr.set_job_id(st.job_id());
    rr.set_attempt(st.attempt());
    rr.set_rank(st.rank());
    rr.set_pid(st.pid());
    running.push_back(std::move(rr));
  });
  return running;
}

void WorkerDaemon::SessionLoop() {
  std::mt19937_64 rng(std::random_device{}());
  absl::Duration backoff = options_.reconnect_min;
  int64_t failures = 0;  // connection attempts in a row that did not register
  grpc::ChannelArguments args;
  SetKeepalive(args, kSessionKeepalive);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  auth::ChannelSecurity security;
  security.token = options_.token;
  security.ca_file = options_.ca_file;
  security.cert_file = options_.cert_file;
  security.key_file = options_.key_file;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> made = auth::MakeChannel(options_.coordinator, security, args);
  if (!made.ok()) {
    // Checked by main before the daemon starts; a file removed since then.
    std::cerr << "trainctl-worker: " << made.status().message() << "\n";
    return;
  }
  std::shared_ptr<grpc::Channel> channel = *std::move(made);
  auto stub = v1::WorkerService::NewStub(channel);
  while (true) {
    grpc::ClientContext ctx;
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) return;
      ctx_ = &ctx;
    }
    std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream =
        stub->Session(&ctx);
    v1::WorkerMessage reg;
    v1::Register* r = reg.mutable_register_();
    r->set_worker_id(worker_id());
    r->set_hostname(options_.hostname);
    r->set_address(options_.address);
    for (const v1::Slot& s : options_.slots) *r->add_slots() = s;
    for (const auto& [k, v] : options_.labels) (*r->mutable_labels())[k] = v;
    r->set_version(options_.version);
    r->set_allow_commands(options_.allow_commands);
    for (v1::RunningRank& rr : RanksForRegister()) *r->add_running() = std::move(rr);

    if (std::getenv("TRAINCTL_WORKER_DEBUG") != nullptr) {
      absl::MutexLock lock(&mu_);
      std::cerr << "trainctl-worker: registering with " << r->running_size() << " running rank(s), "
                << telemetry_.size() << " unacknowledged report(s)\n";
    }
    bool registered = false;
    v1::CoordinatorMessage in;
    // Only this thread uses the stream until stream_ is set below.
    if (stream->Write(reg) && stream->Read(&in) && in.has_register_ack()) {
      registered = true;
      backoff = options_.reconnect_min;
      const v1::RegisterAck& ack = in.register_ack();
      {
        absl::MutexLock lock(&mu_);
        worker_id_ = ack.worker_id();
        heartbeat_interval_ = absl::Milliseconds(std::max(50, ack.heartbeat_interval_ms()));
        telemetry_.OnRegistered(ack.telemetry_acked_seq());
        sent_seq_ = telemetry_.acked();  // Resend everything not acknowledged.
        stream_ = stream.get();
        connected_ = true;
      }
      {
        absl::MutexLock lock(&mu_);
        LogEvent(LogLevel::kInfo, "worker", "registered",
                 {{"worker_id", ack.worker_id()}, {"coordinator", options_.coordinator},
                  {"running_ranks", absl::StrCat(r->running_size())},
                  {"unacknowledged_reports", absl::StrCat(telemetry_.size())},
                  {"heartbeat", absl::FormatDuration(heartbeat_interval_)}});
      }
      failures = 0;
      std::ofstream(id_file_ + ".tmp") << ack.worker_id() << "\n";
      std::rename((id_file_ + ".tmp").c_str(), id_file_.c_str());
      // Heartbeats from their own thread so a busy loop never delays them.
      std::atomic<bool> hb_stop{false};
      std::thread heartbeat([this, &hb_stop] {
        int64_t seq = 0;
        while (!hb_stop) {
          v1::WorkerMessage hb;
          hb.mutable_heartbeat()->set_seq(++seq);
          Enqueue(hb, false);
          absl::Duration d;
          {
            absl::MutexLock lock(&mu_);
            d = heartbeat_interval_;
          }
          absl::Time until = absl::Now() + d;
          while (!hb_stop && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
        }
      });
      while (stream->Read(&in)) {
        if (in.has_telemetry_ack()) {
          absl::MutexLock lock(&mu_);
          telemetry_.Ack(in.telemetry_ack().seq());
          continue;
        }
        v1::CoordinatorMessage copy = in;
        loop_.Post([this, copy] { OnMessage(copy); });
      }
      hb_stop = true;
      heartbeat.join();
    }
    // Take the stream away from the writer, make a Write in flight return
    // (cancel), and wait for it: then nothing else touches the stream.
    ctx.TryCancel();
    {
      absl::MutexLock lock(&mu_);
      connected_ = false;
      stream_ = nullptr;
      ctx_ = nullptr;
      control_.clear();  // Heartbeats of this session; a goodbye has no session left to end.
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !writing_; };
      mu_.Await(absl::Condition(&idle));
    }
    grpc::Status st = stream->Finish();
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) return;
    }
    // Exponential backoff with full jitter.
    absl::Duration wait = absl::Milliseconds(
        std::uniform_int_distribution<int64_t>(absl::ToInt64Milliseconds(backoff) / 2,
                                               absl::ToInt64Milliseconds(backoff))(rng));
    // Said at once and at every retry: an operator sees why nothing runs.
    const std::string reason = st.error_message().empty() ? GrpcCodeText(st.error_code()) : st.error_message();
    if (st.error_code() == grpc::StatusCode::ALREADY_EXISTS || st.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
        st.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
        st.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      LogEvent(LogLevel::kError, "worker", "registration_refused",
               {{"coordinator", options_.coordinator}, {"reason", reason}, {"retry_in", absl::FormatDuration(wait)}});
    } else if (registered) {
      LogEvent(LogLevel::kWarn, "worker", "session_ended",
               {{"coordinator", options_.coordinator}, {"reason", reason}, {"retry_in", absl::FormatDuration(wait)}});
    } else {
      ++failures;
      LogEvent(LogLevel::kWarn, "worker", "coordinator_unreachable",
               {{"coordinator", options_.coordinator}, {"reason", reason}, {"attempt", absl::StrCat(failures)},
                {"retry_in", absl::FormatDuration(wait)}});
    }
    absl::Time until = absl::Now() + wait;
    while (absl::Now() < until) {
      {
        absl::MutexLock lock(&mu_);
        if (shutting_down_) return;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    backoff = std::min(backoff * 2, options_.reconnect_max);
  }
}

// --- loop handlers -------------------------------------------------------------

std::vector<v1::RunningRank> WorkerDaemon::RunningRanks() {
  std::vector<v1::RunningRank> out;
  for (auto& [k, a] : attempts_) {
    for (auto& [rank, r] : a->ranks) {
      if (!r.launched || r.exited) continue;
      v1::RunningRank rr;
      rr.set_job_id(a->job_id);
      rr.set_attempt(a->number);
      rr.set_rank(rank);
      rr.set_pid(r.pid);
      out.push_back(rr);
    }
  }
  return out;
}

void WorkerDaemon::OnMessage(const v1::CoordinatorMessage& m) {
  switch (m.msg_case()) {
    case v1::CoordinatorMessage::kStartRanks:
      OnStartRanks(m.start_ranks());
      break;
    case v1::CoordinatorMessage::kRendezvous:
      OnRendezvous(m.rendezvous());
      break;
    case v1::CoordinatorMessage::kStopRanks:
      OnStopRanks(m.stop_ranks());
      break;
    case v1::CoordinatorMessage::kReadFile:
      OnReadFile(m.read_file());
      break;
    case v1::CoordinatorMessage::kPreflight:
      OnPreflight(m.preflight());
      break;
    default:
      break;
  }
}

void WorkerDaemon::OnReadFile(const v1::ReadFile& r) {
  std::error_code ec;
  const std::string work = std::filesystem::weakly_canonical(options_.work_dir, ec).string();
  v1::WorkerMessage m;
  *m.mutable_file_chunk() = ReadArtifactChunk(r, [&](const std::string& path) {
    if (PathIsUnder(path, work) || reported_artifacts_.count(path) > 0) return true;
    return std::any_of(options_.checkpoint_roots.begin(), options_.checkpoint_roots.end(),
                       [&](const std::string& root) { return PathIsUnder(path, root); });
  });
  Enqueue(std::move(m), /*critical=*/false);
}

void WorkerDaemon::ReportStatus(const LocalAttempt& a, const LocalRank& r, v1::RankState state) {
  v1::WorkerMessage m;
  v1::RankStatus* s = m.mutable_rank_status();
  s->set_job_id(a.job_id);
  s->set_attempt(a.number);
  s->set_rank(r.assignment.rank());
  s->set_state(state);
  s->set_pid(r.pid);
  if (state == v1::RANK_STATE_FAILED || state == v1::RANK_STATE_STOPPED || state == v1::RANK_STATE_SUCCEEDED) {
    v1::ExitInfo* e = s->mutable_exit();
    e->set_exit_code(-1);
    for (const std::string& l : r.last_lines) e->add_last_log_lines(l);
  }
  Enqueue(m, /*critical=*/true);
}

void WorkerDaemon::ReportLaunchFailure(const LocalAttempt& a, LocalRank& r, const std::string& why,
                                       v1::FailureKind kind) {
  r.exited = true;
  r.reported_end = true;
  v1::WorkerMessage m;
  v1::RankStatus* st = m.mutable_rank_status();
  st->set_job_id(a.job_id);
  st->set_attempt(a.number);
  st->set_rank(r.assignment.rank());
  st->set_state(v1::RANK_STATE_FAILED);
  st->mutable_exit()->set_kind(kind);
  st->mutable_exit()->set_exit_code(-1);
  st->mutable_exit()->set_message(why);
  Enqueue(m, true);
}

void WorkerDaemon::OnPreflight(const v1::Preflight& p) {
  PreflightContext ctx;
  ctx.job_id = p.job_id();
  ctx.base_dir = base_dir_;
  ctx.work_dir = options_.work_dir;
  ctx.data_roots = options_.data_roots;
  ctx.checkpoint_roots = options_.checkpoint_roots;
  ctx.allow_commands = options_.allow_commands;
  ctx.checkpoint_bytes = p.has_resume() ? p.resume().size_bytes() : 0;
  for (const v1::RankAssignment& r : p.ranks()) {
    if (r.slot().kind() == v1::Slot::KIND_GPU) ctx.gpu_indices.push_back(r.slot().index());
  }
  std::vector<std::string> problems = PreflightProblems(p.spec(), ctx);
  LogEvent(problems.empty() ? LogLevel::kInfo : LogLevel::kWarn, "worker", "preflight",
           {{"job_id", p.job_id()}, {"attempt", absl::StrCat(p.attempt())},
            {"problems", absl::StrJoin(problems, "; ").substr(0, 500)}});
  v1::WorkerMessage m;
  v1::PreflightReport* rep = m.mutable_preflight();
  rep->set_job_id(p.job_id());
  rep->set_attempt(p.attempt());
  for (std::string& line : problems) rep->add_problems(std::move(line));
  Enqueue(m, /*critical=*/true);
}

void WorkerDaemon::OnStartRanks(const v1::StartRanks& s) {
  std::string akey = absl::StrCat(s.job_id(), "/", s.attempt());
  if (attempts_.count(akey) > 0) return;  // A re-send after a reconnect.
  auto a = std::make_unique<LocalAttempt>();
  a->job_id = s.job_id();
  a->number = s.attempt();
  a->spec = s.spec();
  a->produce_rendezvous = s.produce_rendezvous();
  if (s.has_resume()) a->resume = s.resume();
  a->spec_hash = s.spec_hash();
  a->skip_steps = absl::StrJoin(s.skip_steps(), ",");
  a->command = s.spec().has_command();
  if (a->command && !options_.allow_commands) {
    a->path_error = "this worker does not run commands (start trainctl-worker with --allow-commands)";
  } else if (a->command && !s.spec().command().working_dir().empty()) {
    absl::StatusOr<std::string> dir = ResolveJobPath("command.working_dir", s.spec().command().working_dir(),
                                                     base_dir_, options_.data_roots, "--data-root");
    std::error_code ec;
    if (!dir.ok()) {
      a->path_error = std::string(dir.status().message());
    } else if (!fs::is_directory(*dir, ec)) {
      a->path_error = absl::StrCat("command.working_dir: ", *dir, " is not a directory on this worker");
    } else {
      a->command_dir = *dir;
    }
  }
  // A coordinator that sends none (older than this daemon, or a test's
  // stand-in) still gets a store no stranger can use: a secret made here
  // works where every rank of the attempt runs on this worker.
  a->store_secret = s.rendezvous_secret().empty() ? NewSecretHex() : s.rendezvous_secret();
  // Absolute (against the daemon's working directory) so the rank, whose
  // working directory differs, reads and writes the same place; a directory
  // the job chose must lie inside --checkpoint_root when one is set.
  if (s.spec().checkpoint().dir().empty()) {
    a->checkpoint_dir =
        fs::absolute(absl::StrCat(options_.work_dir, "/jobs/", s.job_id(), "/checkpoints")).lexically_normal().string();
  } else {
    absl::StatusOr<std::string> dir = ResolveJobPath("checkpoint.dir", s.spec().checkpoint().dir(),
                                                     base_dir_, options_.checkpoint_roots,
                                                     "--checkpoint-root");
    if (dir.ok()) {
      a->checkpoint_dir = *dir;
    } else {
      a->path_error = std::string(dir.status().message());
    }
  }
  if (s.spec().tensorboard().enabled() || !s.spec().tensorboard().dir().empty()) {
    if (s.spec().tensorboard().dir().empty()) {
      a->tensorboard_dir = a->checkpoint_dir.empty() ? "" : a->checkpoint_dir + "/tensorboard";
    } else {
      absl::StatusOr<std::string> dir = ResolveJobPath("tensorboard.dir", s.spec().tensorboard().dir(),
                                                       base_dir_, options_.checkpoint_roots,
                                                       "--checkpoint-root");
      if (dir.ok()) {
        a->tensorboard_dir = *dir;
      } else if (a->path_error.empty()) {
        a->path_error = std::string(dir.status().message());
      }
    }
  }
  for (const v1::RankAssignment& ra : s.ranks()) {
    LocalRank& r = a->ranks[ra.rank()];
    r.assignment = ra;
    r.key = absl::StrCat(akey, "/", ra.rank());
    a->gpu = ra.slot().kind() == v1::Slot::KIND_GPU;
  }
  LocalAttempt& at = *a;
  attempts_[akey] = std::move(a);
  if (!at.produce_rendezvous) return;  // Wait for the delivery.
  if (at.gpu && !at.command) {
    absl::StatusOr<std::string> id = GenerateNcclUniqueId();
    if (!id.ok()) {
      for (auto& [rank, r] : at.ranks) ReportLaunchFailure(at, r, std::string(id.status().message()));
      MaybeForget(akey);
      return;
    }
    v1::WorkerMessage m;
    v1::RendezvousReport* rep = m.mutable_rendezvous();
    rep->set_job_id(at.job_id);
    rep->set_attempt(at.number);
    rep->mutable_info()->set_nccl_unique_id(*id);
    rep->mutable_info()->set_master_addr(options_.address);
    at.rendezvous = rep->info();
    at.rendezvous_reported = true;
    Enqueue(m, true);
    LaunchPending(at);  // The local ranks need nothing more.
    return;
  }
  // CPU: rank 0 hosts the store. Its port is reserved here, so the address is
  // known before any rank runs: report it and start every local rank at once
  // (each spends ~0.5 s loading LibTorch; rank 0 first and the others after
  // it reported would take that twice).
  auto it = at.ranks.find(0);
  if (it == at.ranks.end()) return;
  if (!at.store_port.Reserve()) {
    if (at.command) {  // The user's program cannot report a port.
      for (auto& [rank, r] : at.ranks) ReportLaunchFailure(at, r, "cannot reserve a MASTER_PORT on this host");
      MaybeForget(akey);
      return;
    }
    Launch(at, it->second);  // Rank 0 picks a port and reports it.
    return;
  }
  v1::WorkerMessage m;
  v1::RendezvousReport* rep = m.mutable_rendezvous();
  rep->set_job_id(at.job_id);
  rep->set_attempt(at.number);
  rep->mutable_info()->set_gloo_store_address(absl::StrCat(options_.address, ":", at.store_port.port()));
  rep->mutable_info()->set_master_addr(options_.address);
  rep->mutable_info()->set_master_port(at.store_port.port());
  at.rendezvous = rep->info();
  at.rendezvous_reported = true;
  Enqueue(m, true);
  LaunchPending(at);
}

void WorkerDaemon::OnRendezvous(const v1::RendezvousDelivery& d) {
  auto it = attempts_.find(absl::StrCat(d.job_id(), "/", d.attempt()));
  if (it == attempts_.end()) return;
  it->second->rendezvous = d.info();
  LaunchPending(*it->second);
}

void WorkerDaemon::LaunchPending(LocalAttempt& a) {
  for (auto& [rank, r] : a.ranks) {
    if (!r.launched && !r.stop_requested && !r.reported_end) Launch(a, r);
  }
}

void WorkerDaemon::Launch(LocalAttempt& a, LocalRank& r) {
  const v1::RankAssignment& ra = r.assignment;
  if (!a.path_error.empty()) {
    ReportLaunchFailure(a, r, a.path_error, v1::FAILURE_KIND_CONFIG);
    return;
  }
  if (a.command) {
    LaunchCommand(a, r);
    return;
  }
  std::string dir = absl::StrCat(options_.work_dir, "/jobs/", a.job_id, "/attempt-", a.number, "/rank-", ra.rank());
  std::error_code ec;
  fs::create_directories(dir, ec);  // the checkpoint dir is the writer rank's to create (and check)

  rankproto::FlatConfig cfg = JobSpecToFlat(a.spec);
  cfg[rk::kJobId] = a.job_id;
  cfg[rk::kAttempt] = absl::StrCat(a.number);
  cfg[rk::kRank] = absl::StrCat(ra.rank());
  cfg[rk::kLocalRank] = absl::StrCat(ra.local_rank());
  cfg[rk::kWorldSize] = absl::StrCat(ra.world_size());
  cfg[rk::kLocalWorldSize] = absl::StrCat(ra.local_world_size());
  cfg[rk::kNodeRank] = absl::StrCat(ra.node_rank());
  cfg[rk::kDevice] = a.gpu ? "cuda" : "cpu";
  cfg[rk::kCudaDevice] = a.gpu ? "0" : "";
  cfg[rk::kBackend] = a.gpu ? "nccl" : "gloo";
  if (!a.gpu) cfg[rk::kStoreSecret] = a.store_secret;
  cfg[rk::kWorkDir] = dir;
  if (absl::Status paths = ResolveDataPaths(cfg, base_dir_, options_.data_roots);
      !paths.ok()) {
    ReportLaunchFailure(a, r, std::string(paths.message()), v1::FAILURE_KIND_CONFIG);
    return;
  }
  cfg[rk::kCheckpointDir] = a.checkpoint_dir;
  if (!a.tensorboard_dir.empty()) cfg[rk::kTensorBoardDir] = a.tensorboard_dir;
  // One writer per host (its first rank), or only rank 0 on a shared dir.
  const bool writer = a.spec.checkpoint().shared() ? ra.rank() == 0 : ra.local_rank() == 0;
  cfg[rk::kCheckpointWriter] = writer ? "true" : "false";
  cfg[rk::kSpecHash] = a.spec_hash;
  if (!a.skip_steps.empty()) cfg[rk::kSkipSteps] = a.skip_steps;
  if (a.resume.has_value()) {
    cfg[rk::kResumeFrom] = a.resume->path();
    cfg[rk::kResumeChecksum] = a.resume->checksum();
    cfg[rk::kResumeJobId] = a.resume->job_id();
  }
  cfg[rk::kStatusFd] = "3";
  cfg[rk::kTimeoutSeconds] = absl::StrCat(options_.rank_timeout_s);
  cfg[rk::kAdvertiseHost] = options_.address;
  std::string master_addr = options_.address, master_port = "0";
  if (a.rendezvous.has_value()) {
    if (a.rendezvous->has_nccl_unique_id()) {
      cfg[rk::kNcclUniqueId] = absl::BytesToHexString(a.rendezvous->nccl_unique_id());
    }
    if (ra.rank() != 0 || !a.produce_rendezvous) {
      cfg[rk::kStoreAddress] = a.rendezvous->gloo_store_address();
    } else if (!a.gpu) {
      cfg[rk::kStorePort] = absl::StrCat(a.rendezvous->master_port());
    }
    master_addr = a.rendezvous->master_addr();
    master_port = absl::StrCat(a.rendezvous->master_port());
  } else {
    cfg[rk::kStoreAddress] = "";
  }
  std::string config_path = dir + "/rank.conf";
  if (absl::Status s = rankproto::WriteConfigFile(config_path, cfg); !s.ok()) {
    r.error_message = std::string(s.message());
  }

  RankLaunch l;
  l.key = r.key;
  l.binary = options_.rank_binary;
  l.args = options_.rank_binary_args;
  l.args.push_back("--config");
  l.args.push_back(config_path);
  l.work_dir = dir;
  l.env = {absl::StrCat("RANK=", ra.rank()),
           absl::StrCat("LOCAL_RANK=", ra.local_rank()),
           absl::StrCat("WORLD_SIZE=", ra.world_size()),
           absl::StrCat("LOCAL_WORLD_SIZE=", ra.local_world_size()),
           absl::StrCat("GROUP_RANK=", ra.node_rank()),
           absl::StrCat("MASTER_ADDR=", master_addr),
           absl::StrCat("MASTER_PORT=", master_port),
           absl::StrCat("TRAINCTL_JOB_ID=", a.job_id),
           absl::StrCat("TRAINCTL_ATTEMPT=", a.number)};
  if (a.gpu) l.env.push_back(absl::StrCat("CUDA_VISIBLE_DEVICES=", ra.slot().index()));
  r.launched = true;
  r.oom_kills_at_launch = ReadOomKillCount();
  absl::StatusOr<pid_t> pid = supervisor_->Launch(l);
  if (!pid.ok()) {
    ReportLaunchFailure(a, r, absl::StrCat("cannot start the rank process: ", pid.status().message()));
    return;
  }
  r.pid = *pid;
  LogEvent(LogLevel::kInfo, "worker", "rank_started",
           {{"job_id", a.job_id}, {"attempt", absl::StrCat(a.number)}, {"rank", absl::StrCat(r.assignment.rank())},
            {"pid", absl::StrCat(r.pid)}});
  ReportStatus(a, r, v1::RANK_STATE_STARTING);
}

void WorkerDaemon::LaunchCommand(LocalAttempt& a, LocalRank& r) {
  const v1::RankAssignment& ra = r.assignment;
  const v1::CommandSpec& cmd = a.spec.command();
  std::string scratch =
      absl::StrCat(options_.work_dir, "/jobs/", a.job_id, "/attempt-", a.number, "/rank-", ra.rank());
  std::error_code ec;
  fs::create_directories(scratch, ec);
  fs::create_directories(a.checkpoint_dir, ec);
  std::string dir = a.command_dir.empty() ? scratch : a.command_dir;

  RankLaunch l;
  l.key = r.key;
  l.work_dir = dir;
  // argv[0] as a shell finds it: through PATH without a '/', else against
  // the working directory.
  std::string program = cmd.argv(0);
  if (program.find('/') == std::string::npos) {
    const char* path = std::getenv("PATH");
    std::string found;
    for (absl::string_view d : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
      std::string candidate = absl::StrCat(d.empty() ? "." : d, "/", program);
      if (access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate, ec)) {
        found = candidate;
        break;
      }
    }
    program = found.empty() ? program : found;
  } else if (program[0] != '/') {
    program = (fs::path(dir) / program).lexically_normal().string();
  }
  l.binary = program;
  l.args.assign(cmd.argv().begin() + 1, cmd.argv().end());
  if (cmd.local_rank() == v1::LOCAL_RANK_MODE_ARG || cmd.local_rank() == v1::LOCAL_RANK_MODE_BOTH) {
    l.args.push_back(absl::StrCat(cmd.arg_style() == v1::LOCAL_RANK_ARG_STYLE_DASH ? "--local-rank=" : "--local_rank=",
                                  ra.local_rank()));
  }
  std::string master_addr = options_.address, master_port = "0";
  if (a.rendezvous.has_value()) {
    master_addr = a.rendezvous->master_addr();
    master_port = absl::StrCat(a.rendezvous->master_port());
  }
  for (const auto& [k, v] : cmd.env()) l.env.push_back(absl::StrCat(k, "=", v));
  // torchrun's rule: one thread per rank when several share the host,
  // unless the job (or the daemon's environment) says otherwise.
  if (ra.local_world_size() > 1 && cmd.env().count("OMP_NUM_THREADS") == 0 &&
      std::getenv("OMP_NUM_THREADS") == nullptr) {
    l.env.push_back("OMP_NUM_THREADS=1");
  }
  std::vector<std::string> contract = CommandEnvironment(a.job_id, a.number, ra, a.spec.restart().max_restarts(),
                                                         master_addr, master_port, a.checkpoint_dir);
  l.env.insert(l.env.end(), contract.begin(), contract.end());
  if (a.gpu) {
    // Every local rank's GPU, in local-rank order: LOCAL_RANK indexes the
    // visible devices, as under torchrun (torch.cuda.set_device(local_rank)).
    std::vector<std::pair<int32_t, int32_t>> local;
    for (const auto& [rank, other] : a.ranks) {
      local.emplace_back(other.assignment.local_rank(), other.assignment.slot().index());
    }
    std::sort(local.begin(), local.end());
    std::vector<std::string> devices;
    for (const auto& [lr, index] : local) devices.push_back(absl::StrCat(index));
    l.env.push_back(absl::StrCat("CUDA_VISIBLE_DEVICES=", absl::StrJoin(devices, ",")));
  }
  if (!options_.python_dir.empty() && cmd.env().count("PYTHONPATH") == 0) {
    const char* existing = std::getenv("PYTHONPATH");
    l.env.push_back(absl::StrCat("PYTHONPATH=", options_.python_dir,
                                 existing != nullptr && *existing != 0 ? absl::StrCat(":", existing) : ""));
  }
  r.launched = true;
  r.oom_kills_at_launch = ReadOomKillCount();
  absl::StatusOr<pid_t> pid = supervisor_->Launch(l);
  if (!pid.ok()) {
    ReportLaunchFailure(a, r, absl::StrCat("cannot start ", cmd.argv(0), ": ", pid.status().message()));
    return;
  }
  r.pid = *pid;
  ReportStatus(a, r, v1::RANK_STATE_STARTING);
  // The program need not speak the rank protocol: started is ready.
  ReportStatus(a, r, v1::RANK_STATE_RUNNING);
}

void WorkerDaemon::OnStopRanks(const v1::StopRanks& s) {
  std::string akey = absl::StrCat(s.job_id(), "/", s.attempt());
  auto it = attempts_.find(akey);
  absl::Duration grace = absl::Milliseconds(std::max(0, s.grace_period_ms()));
  if (it == attempts_.end()) {
    // Not ours (any more): a rank still running under that key is stopped.
    for (int32_t rank : s.ranks()) supervisor_->Stop(absl::StrCat(akey, "/", rank), grace);
    return;
  }
  LocalAttempt& a = *it->second;
  for (auto& [rank, r] : a.ranks) {
    bool listed = s.ranks_size() == 0 ||
                  std::find(s.ranks().begin(), s.ranks().end(), rank) != s.ranks().end();
    if (!listed || r.reported_end) continue;
    r.stop_requested = true;
    if (r.launched && !r.exited) {
      supervisor_->Stop(r.key, grace);
    } else {
      r.exited = true;
      r.reported_end = true;
      ReportStatus(a, r, v1::RANK_STATE_STOPPED);
    }
  }
  MaybeForget(akey);
}

WorkerDaemon::LocalRank* WorkerDaemon::FindRank(const std::string& key, LocalAttempt** attempt) {
  size_t slash = key.rfind('/');
  auto it = attempts_.find(key.substr(0, slash));
  if (it == attempts_.end()) return nullptr;
  int rank = std::stoi(key.substr(slash + 1));
  auto r = it->second->ranks.find(rank);
  if (r == it->second->ranks.end()) return nullptr;
  *attempt = it->second.get();
  return &r->second;
}

void WorkerDaemon::OnStatusLine(const std::string& key, const std::string& line) {
  LocalAttempt* a = nullptr;
  LocalRank* r = FindRank(key, &a);
  if (r == nullptr) return;
  absl::StatusOr<rankproto::StatusMessage> msg = rankproto::ParseStatusLine(line);
  if (!msg.ok()) {
    RankLogBatch note;
    note.lines.push_back(RankLogLine{2, absl::Now(), absl::StrCat("[trainctl-worker] ignored status line: ", line)});
    note.recent.push_back(note.lines.back().text);
    OnLogBatch(key, note);
    return;
  }
  switch (msg->type) {
    case rankproto::StatusMessage::Type::kRendezvous: {
      if (r->assignment.rank() != 0 || !a->produce_rendezvous) return;
      a->store_port.Release();  // The store listens on it now.
      if (a->rendezvous_reported) return;
      v1::WorkerMessage m;
      v1::RendezvousReport* rep = m.mutable_rendezvous();
      rep->set_job_id(a->job_id);
      rep->set_attempt(a->number);
      rep->mutable_info()->set_gloo_store_address(msg->address);
      std::string host = msg->address.substr(0, msg->address.rfind(':'));
      int port = 0;
      (void)absl::SimpleAtoi(msg->address.substr(msg->address.rfind(':') + 1), &port);
      rep->mutable_info()->set_master_addr(host);
      rep->mutable_info()->set_master_port(port);
      Enqueue(m, true);
      break;
    }
    case rankproto::StatusMessage::Type::kReady:
      r->ready = true;
      ReportStatus(*a, *r, v1::RANK_STATE_RUNNING);
      break;
    case rankproto::StatusMessage::Type::kProgress: {
      v1::WorkerMessage m;
      v1::RankProgress* p = m.mutable_progress();
      p->set_job_id(a->job_id);
      p->set_attempt(a->number);
      p->set_rank(r->assignment.rank());
      p->set_epoch(msg->epoch);
      p->set_step(msg->step);
      if (const rankproto::RankHeartbeat& hb = msg->heartbeat; hb.present) {
        p->set_has_heartbeat(true);
        p->set_phase(hb.phase == "train"        ? v1::RANK_PHASE_TRAIN
                     : hb.phase == "eval"       ? v1::RANK_PHASE_EVAL
                     : hb.phase == "checkpoint" ? v1::RANK_PHASE_CHECKPOINT
                                                : v1::RANK_PHASE_INIT);
        p->set_collective_seq(hb.seq);
        p->set_waiting_seq(hb.waiting_seq);
        p->set_op(hb.op == "allreduce"   ? v1::COLLECTIVE_OP_ALL_REDUCE
                  : hb.op == "broadcast" ? v1::COLLECTIVE_OP_BROADCAST
                  : hb.op == "barrier"   ? v1::COLLECTIVE_OP_BARRIER
                                         : v1::COLLECTIVE_OP_UNSPECIFIED);
        p->set_op_step(hb.op_step);
        p->set_op_bucket(hb.op_bucket);
        p->set_waiting_ms(hb.waiting_ms);
        p->set_p99_step_ms(hb.p99_step_ms);
        p->set_compute_ms(hb.compute_ms);
        p->set_pid(static_cast<int32_t>(r->pid));
      }
      Enqueue(m, false);
      break;
    }
    case rankproto::StatusMessage::Type::kCheckpoint: {
      const rankproto::CheckpointNote& c = msg->checkpoint;
      v1::WorkerMessage m;
      v1::CheckpointReport* rep = m.mutable_checkpoint();
      rep->set_job_id(a->job_id);
      rep->set_attempt(a->number);
      rep->set_rank(r->assignment.rank());
      v1::CheckpointRecord* rec = rep->mutable_record();
      rec->set_epochs_done(c.epochs_done);
      rec->set_global_step(c.global_step);
      rec->set_epoch_consumed(c.epoch_consumed);
      rec->set_size_bytes(c.size_bytes);
      rec->set_checksum(c.checksum);
      rec->set_path(c.path);  // absolute: the rank got an absolute checkpoint dir
      RememberArtifact(c.path);
      Enqueue(m, true);
      break;
    }
    case rankproto::StatusMessage::Type::kModel: {
      if (r->assignment.rank() != 0) return;
      v1::WorkerMessage m;
      v1::FinalModelReport* rep = m.mutable_final_model();
      rep->set_job_id(a->job_id);
      rep->set_attempt(a->number);
      rep->set_rank(0);
      rep->set_path(msg->path);  // absolute: the rank got an absolute checkpoint dir
      RememberArtifact(msg->path);
      Enqueue(m, true);
      break;
    }
    case rankproto::StatusMessage::Type::kMetric: {
      const rankproto::RankMetric& rm = msg->metric;
      v1::MetricPoint p;
      p.set_kind(rm.kind == "epoch_end" ? v1::MetricPoint::KIND_EPOCH_END : v1::MetricPoint::KIND_TRAIN);
      p.set_rank(r->assignment.rank());
      p.set_epoch(rm.epoch);
      p.set_step(rm.step);
      p.set_steps_per_epoch(rm.steps_per_epoch);
      SetTimestamp(absl::Now(), p.mutable_time());
      p.set_loss(rm.loss);
      p.set_lr(rm.lr);
      p.set_samples_per_sec(rm.samples_per_sec);
      p.set_data_ms(rm.data_ms);
      p.set_compute_ms(rm.compute_ms);
      p.set_comm_ms(rm.comm_ms);
      p.set_loss_scale(rm.loss_scale);
      p.set_skipped_steps(rm.skipped_steps);
      p.set_peak_memory_bytes(rm.peak_memory_bytes);
      p.set_samples_seen(rm.samples_seen);
      if (rm.has_eval) {
        p.mutable_eval()->set_epoch(rm.epoch);
        p.mutable_eval()->set_loss(rm.eval_loss);
        p.mutable_eval()->set_accuracy(rm.eval_accuracy);
        p.mutable_eval()->set_samples(rm.eval_samples);
      }
      if (p.kind() == v1::MetricPoint::KIND_TRAIN) r->last_train = p;
      a->pending_metrics.push_back(std::move(p));
      if (a->pending_metrics.size() > 10000) a->pending_metrics.erase(a->pending_metrics.begin());
      break;
    }
    case rankproto::StatusMessage::Type::kError:
      r->error_kind = msg->error_kind;
      r->error_message = msg->message;
      r->error_step = msg->step;
      break;
  }
}

void WorkerDaemon::OnLogBatch(const std::string& key, const RankLogBatch& batch) {
  LocalAttempt* a = nullptr;
  LocalRank* r = FindRank(key, &a);
  if (r == nullptr) return;
  r->dropped += batch.dropped;
  for (const std::string& line : batch.recent) {
    r->last_lines.push_back(line);
    if (r->last_lines.size() > kLastLogLines) r->last_lines.pop_front();
  }
  for (const RankLogLine& line : batch.lines) {
    // Bounded between flushes too (the supervisor's rate makes this rare).
    if (r->pending_logs.size() >= static_cast<size_t>(std::max(options_.log_burst, 1))) {
      ++r->dropped;
      continue;
    }
    v1::LogLine l;
    l.set_rank(r->assignment.rank());
    l.set_stream(line.stream == 1 ? v1::LogLine::STREAM_STDOUT : v1::LogLine::STREAM_STDERR);
    SetTimestamp(line.time, l.mutable_time());
    l.set_text(line.text);
    r->pending_logs.push_back(std::move(l));
  }
}

void WorkerDaemon::FlushMetrics() {
  for (auto& [k, a] : attempts_) {
    if (a->pending_metrics.empty()) continue;
    v1::WorkerMessage m;
    v1::MetricBatch* b = m.mutable_metrics();
    b->set_job_id(a->job_id);
    b->set_attempt(a->number);
    for (auto& p : a->pending_metrics) *b->add_points() = std::move(p);
    a->pending_metrics.clear();
    // Epoch ends carry eval results: keep them across a reconnect.
    bool has_epoch_end = false;
    for (const auto& p : b->points()) has_epoch_end |= p.kind() == v1::MetricPoint::KIND_EPOCH_END;
    Enqueue(std::move(m), has_epoch_end);
  }
}

void WorkerDaemon::FlushLogs() {
  for (auto& [k, a] : attempts_) {
    for (auto& [rank, r] : a->ranks) {
      if (r.pending_logs.empty() && r.dropped == 0) continue;
      v1::WorkerMessage m;
      v1::LogChunk* c = m.mutable_logs();
      c->set_job_id(a->job_id);
      c->set_attempt(a->number);
      c->set_rank(rank);
      c->set_dropped_lines(r.dropped);
      for (auto& l : r.pending_logs) *c->add_lines() = std::move(l);
      if (r.dropped > 0) {
        v1::LogLine* note = c->add_lines();
        note->set_rank(rank);
        note->set_stream(v1::LogLine::STREAM_STDERR);
        SetTimestamp(absl::Now(), note->mutable_time());
        note->set_text(absl::StrCat("[trainctl-worker] ", r.dropped, " log lines dropped (rate limit)"));
      }
      r.pending_logs.clear();
      r.dropped = 0;
      Enqueue(std::move(m), false);
    }
  }
}

std::optional<std::string> WorkerDaemon::OomKilled(const LocalRank& r, int signal) const {
  if (signal != SIGKILL || r.stop_requested || !r.oom_kills_at_launch.has_value()) return std::nullopt;
  std::optional<int64_t> now = ReadOomKillCount();
  if (!now.has_value() || *now <= *r.oom_kills_at_launch) return std::nullopt;
  std::string at;
  if (r.last_train.has_value() && r.last_train->peak_memory_bytes() > 0) {
    at = absl::StrFormat(" at %.1f GiB", static_cast<double>(r.last_train->peak_memory_bytes()) / (1 << 30));
  }
  return absl::StrCat("rank ", r.assignment.rank(), " was killed by the OOM killer", at,
                      " (its memory cgroup's oom_kill count rose from ", *r.oom_kills_at_launch, " to ", *now,
                      "); lower data.batch_size");
}

void WorkerDaemon::OnExit(const std::string& key, int code, int signal) {
  LocalAttempt* a = nullptr;
  LocalRank* r = FindRank(key, &a);
  if (r == nullptr) return;
  r->exited = true;
  if (r->reported_end) return;
  r->reported_end = true;
  FlushMetrics();
  FlushLogs();
  v1::WorkerMessage m;
  v1::RankStatus* s = m.mutable_rank_status();
  s->set_job_id(a->job_id);
  s->set_attempt(a->number);
  s->set_rank(r->assignment.rank());
  s->set_pid(r->pid);
  v1::ExitInfo* e = s->mutable_exit();
  e->set_exit_code(code);
  e->set_signal(signal);
  for (const std::string& l : r->last_lines) e->add_last_log_lines(l);
  if (r->stop_requested) {
    s->set_state(v1::RANK_STATE_STOPPED);
    e->set_message("stopped on request");
  } else if (code == 0) {
    s->set_state(v1::RANK_STATE_SUCCEEDED);
  } else {
    s->set_state(v1::RANK_STATE_FAILED);
    e->set_message(r->error_message);
    if (r->error_kind.has_value()) {
      switch (*r->error_kind) {
        case rankproto::ErrorKind::kConfig: e->set_kind(v1::FAILURE_KIND_CONFIG); break;
        case rankproto::ErrorKind::kCollective: e->set_kind(v1::FAILURE_KIND_COLLECTIVE); break;
        case rankproto::ErrorKind::kRendezvous: e->set_kind(v1::FAILURE_KIND_RENDEZVOUS); break;
        case rankproto::ErrorKind::kDiskFull: e->set_kind(v1::FAILURE_KIND_DISK_FULL); break;
        case rankproto::ErrorKind::kData: e->set_kind(v1::FAILURE_KIND_DATA); break;
        case rankproto::ErrorKind::kOutOfMemory: e->set_kind(v1::FAILURE_KIND_OUT_OF_MEMORY); break;
        case rankproto::ErrorKind::kNan:
          e->set_kind(v1::FAILURE_KIND_NAN);
          e->set_step(r->error_step);
          break;
        default: e->set_kind(v1::FAILURE_KIND_EXIT);
      }
    } else if (std::optional<std::string> oom = OomKilled(*r, signal)) {
      // A SIGKILL this daemon did not send, while the cgroup's OOM-kill
      // count rose: the kernel's OOM killer.
      e->set_kind(v1::FAILURE_KIND_OUT_OF_MEMORY);
      e->set_message(*oom);
      if (r->last_train.has_value()) e->set_peak_memory_bytes(r->last_train->peak_memory_bytes());
    } else if (signal != 0) {
      e->set_kind(v1::FAILURE_KIND_SIGNAL);
      if (e->message().empty()) {
        e->set_message(signal == SIGKILL ? "killed (SIGKILL: out of memory, or killed from outside)"
                                         : absl::StrCat("killed by signal ", signal, " (", strsignal(signal), ")"));
      }
    } else {
      e->set_kind(code == 127 ? v1::FAILURE_KIND_LAUNCH : v1::FAILURE_KIND_EXIT);
      if (e->message().empty()) e->set_message(absl::StrCat("exited with code ", code));
    }
    if (a->command && !r->error_kind.has_value() && e->kind() != v1::FAILURE_KIND_OUT_OF_MEMORY) {
      // The user's program: say which rank, how it ended and, for a Python
      // traceback, the exception line.
      std::string how = signal != 0 ? absl::StrCat("killed by signal ", signal, " (", strsignal(signal), ")")
                                    : absl::StrCat("exited with code ", code);
      if (code == 127) how += " (the program could not be executed)";
      if (code == 2) how += " (a usage error, e.g. argparse rejected an argument)";
      e->set_message(absl::StrCat("rank ", r->assignment.rank(), " ", how));
      std::string exception = ExceptionLine(r->last_lines);
      if (!exception.empty()) e->set_message(absl::StrCat(e->message(), ": ", exception));
      if (signal == 0 && code != 127) e->set_kind(v1::FAILURE_KIND_USER_CODE);
    }
  }
  LogEvent(s->state() == v1::RANK_STATE_FAILED ? LogLevel::kWarn : LogLevel::kInfo, "worker", "rank_exited",
           {{"job_id", a->job_id}, {"attempt", absl::StrCat(a->number)}, {"rank", absl::StrCat(r->assignment.rank())},
            {"pid", absl::StrCat(r->pid)}, {"state", v1::RankState_Name(s->state())},
            {"exit_code", absl::StrCat(code)}, {"signal", absl::StrCat(signal)},
            {"reason", e->message().substr(0, 300)}});
  Enqueue(m, true);
  MaybeForget(key.substr(0, key.rfind('/')));
}

void WorkerDaemon::MaybeForget(const std::string& akey) {
  auto it = attempts_.find(akey);
  if (it == attempts_.end()) return;
  for (auto& [rank, r] : it->second->ranks) {
    if (!r.reported_end) return;
  }
  FlushMetrics();
  FlushLogs();
  attempts_.erase(it);
}

}  // namespace trainctl::worker
