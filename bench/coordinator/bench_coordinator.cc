// trainctl-bench-coordinator: the control plane at scale, measured.
//
// One process simulates thousands of worker daemons, each a real
// WorkerService.Session stream driven by the gRPC callback API
// (grpc::ClientBidiReactor) on a handful of channels, with one timer thread
// for every heartbeat. Modes (one per coordinator process; run.sh starts a
// fresh coordinator for each):
//
//   heartbeat      N workers registered at a ramp rate, then heartbeating every
//                  interval; measures heartbeat round trips, the coordinator's
//                  CPU and RSS over a steady window, this process's own CPU;
//                  optionally failure detection under that load and a mass
//                  loss (a fraction of the workers cut at once).
//   jobs           With every slot busy, submits N jobs (SubmitJob, C in
//                  flight); then, with N queued, the latency of one more
//                  submission, of GetJob/ListJobs, of placing a job on a
//                  worker that registers, and on a slot that frees.
//   failure        Time from a worker's death to its job's attempt failing
//                  (WatchJob): (a) session stream cancelled, (b) a worker
//                  process (this binary, --mode=single_worker) SIGKILLed.
//   telemetry      J jobs of R simulated ranks (one worker with R slots per
//                  job) beside N heartbeating workers; every rank sends one
//                  metric point a second and L log lines a second (sequenced
//                  as the real daemon does); a WatchJob stream per job. Measures
//                  the coordinator's CPU, heartbeat round trips, ingest latency
//                  (point stamped at send → a watcher reads it), its write
//                  syscalls, and points and log lines lost.
//   single_worker  One scripted worker; prints REG/HB/START lines on stdout
//                  for the parent of mode failure.
//
// Results are printed and appended as key=value lines to --out.
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "common/daemon_flags.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/auth/secret.h"
#include "common/jobspec/job_spec.h"
#include "common/subprocess.h"
#include "trainctl/v1/auth.grpc.pb.h"
#include "trainctl/v1/job_service.grpc.pb.h"
#include "trainctl/v1/worker_service.grpc.pb.h"

ABSL_FLAG(std::string, mode, "heartbeat", "heartbeat | jobs | failure | telemetry | single_worker");
ABSL_FLAG(std::string, target, "", "coordinator host:port");
ABSL_FLAG(std::string, admin_token_file, "",
          "the coordinator's --admin_token_file: jobs go through the admin token, simulated "
          "workers through a worker token made with it");
ABSL_FLAG(int, coord_pid, 0, "coordinator pid (for /proc CPU and RSS)");
ABSL_FLAG(std::string, out, "", "append key=value results to this file");
ABSL_FLAG(std::string, prefix, "", "prefix for every result key");
ABSL_FLAG(int, channels, 16, "gRPC channels (TCP connections) the simulated workers share");
ABSL_FLAG(int, heartbeat_ms, 1000, "heartbeat interval of the simulated workers");
ABSL_FLAG(int, tickers, 4, "timer threads sending heartbeats (workers are sharded over them)");
// heartbeat
ABSL_FLAG(int, workers, 1000, "heartbeat: simulated workers");
ABSL_FLAG(int, slots, 8, "heartbeat: CPU slots per simulated worker");
ABSL_FLAG(double, ramp_per_s, 250, "heartbeat: registrations started per second");
ABSL_FLAG(int, ramp_timeout_s, 150, "heartbeat: give up waiting for registrations after this");
ABSL_FLAG(int, warmup_s, 5, "heartbeat: settle time after the ramp");
ABSL_FLAG(int, steady_s, 30, "heartbeat: measurement window");
ABSL_FLAG(int, trials_under_load, 0, "heartbeat: failure-detection trials (stream cut) under the load");
ABSL_FLAG(double, mass_loss_fraction, 0.0, "heartbeat: cut this fraction of workers at once at the end");
ABSL_FLAG(int, mass_loss_timeout_s, 90, "heartbeat: wait at most this long for the mass loss to be seen");
// jobs
ABSL_FLAG(int, jobs, 10000, "jobs: jobs to queue");
ABSL_FLAG(int, concurrency, 32, "jobs: SubmitJob calls in flight");
ABSL_FLAG(int, submit_budget_s, 240, "jobs: stop submitting after this long");
ABSL_FLAG(int, busy_workers, 2, "jobs: one-slot workers kept busy by running jobs");
ABSL_FLAG(int, sched_trials, 20, "jobs: placement-latency trials (new worker; freed slot)");
ABSL_FLAG(int, probe_calls, 30, "jobs: sequential probe calls (submit/get/list) at full queue");
// failure
ABSL_FLAG(int, trials_cut, 20, "failure: trials where the session stream is cancelled");
ABSL_FLAG(int, trials_kill, 10, "failure: trials where a worker process is SIGKILLed");
ABSL_FLAG(int, batch, 10, "failure: trials run at once");
// single_worker
ABSL_FLAG(int, telemetry_jobs, 125, "telemetry: running jobs, each on its own simulated worker");
ABSL_FLAG(int, ranks_per_job, 8, "telemetry: simulated ranks per job");
ABSL_FLAG(int, log_lines_per_s, 10, "telemetry: log lines per rank and second");
ABSL_FLAG(int, drain_s, 10, "telemetry: wait this long after sending stops for the last points");

ABSL_FLAG(std::string, worker_id, "", "single_worker: worker id");
ABSL_FLAG(std::string, slot_kind, "cpu", "single_worker: cpu | gpu");
ABSL_FLAG(int, max_life_s, 120, "single_worker: exit after this long");

namespace trainctl::bench {
namespace {

// ---------------------------------------------------------------- utilities

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}
void SleepNs(int64_t ns) {
  if (ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
}
void SleepUntilNs(int64_t t) { SleepNs(t - NowNs()); }
double Ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

// CPU seconds (user+system) of a process, from /proc/PID/stat.
double ProcCpuSeconds(int pid) {
  std::ifstream f(pid == 0 ? std::string("/proc/self/stat") : absl::StrCat("/proc/", pid, "/stat"));
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t p = s.rfind(')');
  if (p == std::string::npos) return -1;
  std::vector<std::string> fields = absl::StrSplit(s.substr(p + 2), ' ');
  // fields[0] is field 3 (state); utime is field 14, stime 15.
  if (fields.size() < 13) return -1;
  double ticks = std::stod(fields[11]) + std::stod(fields[12]);
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Resident set size in KiB, from /proc/PID/status.
int64_t ProcRssKb(int pid) {
  std::ifstream f(pid == 0 ? std::string("/proc/self/status") : absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

std::vector<std::pair<std::string, std::string>>& Results() {
  static auto* r = new std::vector<std::pair<std::string, std::string>>();
  return *r;
}
void Put(const std::string& key, const std::string& value) {
  std::string k = absl::GetFlag(FLAGS_prefix) + key;
  std::cout << "  " << k << " = " << value << std::endl;
  Results().emplace_back(k, value);
}
void Put(const std::string& key, double v) { Put(key, absl::StrFormat("%.3f", v)); }
void Put(const std::string& key, int64_t v) { Put(key, absl::StrCat(v)); }
void Put(const std::string& key, int v) { Put(key, absl::StrCat(v)); }
void WriteResults() {
  std::string path = absl::GetFlag(FLAGS_out);
  if (path.empty()) return;
  std::ofstream f(path, std::ios::app);
  for (const auto& [k, v] : Results()) f << k << "=" << v << "\n";
}

// Per-thread CPU seconds and run-queue wait (seconds runnable but not
// running, /proc/PID/task/TID/schedstat) of a process.
struct ThreadStat {
  std::string comm;
  double cpu = 0;
  double wait = 0;
};
std::map<int, ThreadStat> ThreadStats(int pid) {
  std::map<int, ThreadStat> out;
  std::string dir = pid == 0 ? std::string("/proc/self/task") : absl::StrCat("/proc/", pid, "/task");
  std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(dir.c_str()), closedir);
  if (!d) return out;
  while (dirent* e = readdir(d.get())) {
    int tid = atoi(e->d_name);
    if (tid <= 0) continue;
    std::string base = absl::StrCat(dir, "/", tid);
    std::ifstream f(base + "/stat");
    std::string st((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    size_t a = st.find('('), b = st.rfind(')');
    if (a == std::string::npos || b == std::string::npos) continue;
    ThreadStat t;
    t.comm = st.substr(a + 1, b - a - 1);
    std::vector<std::string> fields = absl::StrSplit(st.substr(b + 2), ' ');
    if (fields.size() < 13) continue;
    t.cpu = (std::stod(fields[11]) + std::stod(fields[12])) / static_cast<double>(sysconf(_SC_CLK_TCK));
    std::ifstream ss(base + "/schedstat");
    double run = 0, wait = 0;
    if (ss >> run >> wait) t.wait = wait / 1e9;
    out[tid] = t;
  }
  return out;
}

// Reports the busiest threads and the run-queue wait over a window.
void ReportThreads(const std::string& key, const std::map<int, ThreadStat>& a,
                   const std::map<int, ThreadStat>& b, double secs) {
  std::vector<std::pair<double, std::string>> busy;
  double wait = 0;
  for (const auto& [tid, t1] : b) {
    auto it = a.find(tid);
    double cpu = t1.cpu - (it == a.end() ? 0 : it->second.cpu);
    wait += t1.wait - (it == a.end() ? 0 : it->second.wait);
    busy.push_back({cpu / secs, t1.comm});
  }
  std::sort(busy.rbegin(), busy.rend());
  std::string top;
  for (size_t i = 0; i < busy.size() && i < 4; ++i) {
    absl::StrAppend(&top, i ? ", " : "", busy[i].second, " ", absl::StrFormat("%.2f", busy[i].first));
  }
  Put(key + ".threads", static_cast<int64_t>(b.size()));
  Put(key + ".top_threads_cores", top);
  Put(key + ".top_thread_cores", busy.empty() ? 0.0 : busy[0].first);
  // Average number of this process's threads that were runnable but waiting
  // for a CPU (other processes on the machine included).
  Put(key + ".runqueue_wait_threads", wait / secs);
}

// Percentiles of durations (ns), reported in ms.
struct Dist {
  std::vector<int64_t> v;
  void Add(int64_t ns) { v.push_back(ns); }
  double Pct(double p) {
    if (v.empty()) return -1;
    std::sort(v.begin(), v.end());
    size_t i = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size()))) ;
    i = std::min(v.size() - 1, i == 0 ? 0 : i - 1);
    return Ms(v[i]);
  }
  double Max() { return v.empty() ? -1 : Ms(*std::max_element(v.begin(), v.end())); }
  double Min() { return v.empty() ? -1 : Ms(*std::min_element(v.begin(), v.end())); }
  void Report(const std::string& key) {
    Put(key + ".n", static_cast<int64_t>(v.size()));
    if (v.empty()) return;
    Put(key + ".min_ms", Min());
    Put(key + ".p50_ms", Pct(50));
    Put(key + ".p90_ms", Pct(90));
    Put(key + ".p99_ms", Pct(99));
    Put(key + ".max_ms", Max());
  }
};

// A thread-safe sample sink that records only while enabled.
class Recorder {
 public:
  void Add(int64_t ns) {
    if (!on_.load(std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> l(mu_);
    d_.Add(ns);
  }
  void Enable(bool on) { on_ = on; }
  Dist Take() {
    std::lock_guard<std::mutex> l(mu_);
    Dist out = std::move(d_);
    d_ = Dist();
    return out;
  }

 private:
  std::atomic<bool> on_{false};
  std::mutex mu_;
  Dist d_;
};

// The bearer tokens every call carries (set in main, before any thread).
std::string g_admin_token;
std::string g_worker_token;

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, int index,
                                           const std::string& token) {
  grpc::ChannelArguments args;
  // A distinct argument and a local subchannel pool: one TCP connection each.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("trainctl.bench.channel", index);
  args.SetMaxReceiveMessageSize(64 << 20);
  auth::ChannelSecurity security;
  security.token = token;
  return *auth::MakeChannel(target, security, args);
}

v1::JobSpec MakeSpec(int max_restarts, bool cuda) {
  std::string yaml =
      "name: bench\nmodel: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n";
  if (cuda) yaml += "device: cuda\n";
  ParsedJobSpec p = ParseJobSpecYaml(
      yaml, "bench.yaml", {"world_size=1", absl::StrCat("restart.max_restarts=", max_restarts)});
  if (!p.ok()) {
    for (const auto& e : p.errors) std::cerr << "spec: " << e.ToString() << "\n";
    std::exit(2);
  }
  return p.spec;
}

bool IsFailedOrRestarting(v1::JobState s) {
  return s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_RESTARTING;
}

// ------------------------------------------------------- simulated workers

class SimWorker;

// Owns the channels and the one timer thread that sends every heartbeat.
class Hub {
 public:
  Hub(const std::string& target, int channels, int64_t heartbeat_ns) : heartbeat_ns_(heartbeat_ns) {
    for (int i = 0; i < channels; ++i) {
      channels_.push_back(MakeChannel(target, i, g_worker_token));
      stubs_.push_back(v1::WorkerService::NewStub(channels_.back()));
    }
    job_channel_ = MakeChannel(target, channels, g_admin_token);
    jobs_ = v1::JobService::NewStub(job_channel_);
    workers_stub_ = v1::WorkerService::NewStub(job_channel_);
    int n = std::max(1, absl::GetFlag(FLAGS_tickers));
    for (int i = 0; i < n; ++i) shards_.push_back(std::make_unique<Shard>());
    for (int i = 0; i < n; ++i) {
      shards_[i]->thread = std::thread([this, i] { TickLoop(*shards_[i]); });
      pthread_setname_np(shards_[i]->thread.native_handle(), "bench-ticker");
    }
  }
  ~Hub() { StopTicker(); }

  void StopTicker() {
    for (auto& sh : shards_) {
      {
        std::lock_guard<std::mutex> l(sh->mu);
        sh->stop = true;
      }
      sh->cv.notify_all();
      if (sh->thread.joinable()) sh->thread.join();
    }
  }

  v1::WorkerService::Stub* stub(int i) { return stubs_[i % stubs_.size()].get(); }
  v1::JobService::Stub* jobs() { return jobs_.get(); }
  v1::WorkerService::Stub* workers_stub() { return workers_stub_.get(); }
  int64_t heartbeat_ns() const { return heartbeat_ns_; }

  void ScheduleHeartbeat(SimWorker* w, int index, int64_t at) {
    Shard& sh = *shards_[static_cast<size_t>(index) % shards_.size()];
    {
      std::lock_guard<std::mutex> l(sh.mu);
      sh.heap.push({at, w});
    }
    sh.cv.notify_one();
  }

  Recorder rtt;          // heartbeat → heartbeat_ack
  Recorder lateness;     // ticker: actual send − planned send
  Recorder register_lat; // register sent → register_ack
  std::atomic<int64_t> heartbeats_sent{0};
  std::atomic<int64_t> acks{0};
  std::atomic<int64_t> registered{0};
  std::atomic<int64_t> ended{0};  // streams that ended (any reason)

 private:
  struct Ev {
    int64_t t;
    SimWorker* w;
    bool operator>(const Ev& o) const { return t > o.t; }
  };
  struct Shard {
    std::mutex mu;
    std::condition_variable cv;
    std::priority_queue<Ev, std::vector<Ev>, std::greater<Ev>> heap;
    bool stop = false;
    std::thread thread;
  };
  void TickLoop(Shard& sh);

  int64_t heartbeat_ns_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> stubs_;
  std::shared_ptr<grpc::Channel> job_channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_stub_;
  std::vector<std::unique_ptr<Shard>> shards_;
};

// One simulated worker daemon: a Session stream with at most one write in
// flight (later messages queue), one read always pending.
class SimWorker : public grpc::ClientBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
 public:
  using Listener = std::function<void(SimWorker*, const v1::CoordinatorMessage&, int64_t)>;

  SimWorker(Hub* hub, int index, std::string id, v1::Slot::Kind kind, int slots)
      : hub_(hub), index_(index), id_(std::move(id)), kind_(kind), slots_(slots) {}

  // Drive assigned ranks like a daemon whose ranks start instantly: report the
  // rendezvous (rank-0 side) and, once it is delivered, RUNNING.
  bool auto_run = true;
  // Called on the gRPC thread for every message received (after auto-run).
  Listener listener;
  // Called on the timer thread after each heartbeat was handed to gRPC.
  std::function<void(int64_t)> on_heartbeat;

  void Start() {
    hub_->stub(index_)->async()->Session(&ctx_, this);
    AddHold();  // Writes come from outside reactions (the timer thread).
    StartRead(&in_);
    v1::WorkerMessage reg;
    v1::Register* r = reg.mutable_register_();
    r->set_worker_id(id_);
    r->set_hostname(id_.empty() ? absl::StrCat("sim-", index_) : id_);
    r->set_address("127.0.0.1");
    r->set_version("bench");
    for (int i = 0; i < slots_; ++i) {
      v1::Slot* s = r->add_slots();
      s->set_kind(kind_);
      s->set_index(i);
    }
    register_sent_ns = NowNs();
    Send(std::move(reg));
    StartCall();
  }

  bool Send(v1::WorkerMessage m) {
    std::unique_lock<std::mutex> l(mu_);
    if (stopping_) return false;
    if (writing_) {
      queue_.push_back(std::move(m));
      return true;
    }
    writing_ = true;
    current_ = std::move(m);
    l.unlock();
    StartWrite(&current_);
    return true;
  }

  bool SendStatus(const std::string& job, int attempt, int rank, v1::RankState state) {
    v1::WorkerMessage m;
    v1::RankStatus* s = m.mutable_rank_status();
    s->set_job_id(job);
    s->set_attempt(attempt);
    s->set_rank(rank);
    s->set_state(state);
    return Send(std::move(m));
  }

  // Timer thread: sends the next heartbeat; false once the stream is over.
  bool Heartbeat(int64_t planned) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_) return false;
    }
    int64_t seq = ++seq_;
    v1::WorkerMessage hb;
    hb.mutable_heartbeat()->set_seq(seq);
    int64_t now = NowNs();
    sent_ns_[seq % kRing].store(now, std::memory_order_relaxed);
    sent_seq_[seq % kRing].store(seq, std::memory_order_relaxed);
    if (!Send(std::move(hb))) return false;
    last_hb_sent_ns = now;
    hub_->heartbeats_sent++;
    hub_->lateness.Add(now - planned);
    if (on_heartbeat) on_heartbeat(now);
    return true;
  }

  // Cuts the stream as a crashed daemon's would be.
  void Cancel() { ctx_.TryCancel(); }

  // Per running rank: one metric point (stamped with the wall clock) and a
  // chunk of `log_lines` lines, each message sequenced like the daemon's.
  void SendTelemetry(int log_lines) {
    std::map<std::string, std::pair<int, std::vector<int>>> running;
    {
      std::lock_guard<std::mutex> l(mu_);
      running = running_;
    }
    for (const auto& [job, attempt_ranks] : running) {
      for (int rank : attempt_ranks.second) {
        v1::WorkerMessage m;
        v1::MetricBatch* b = m.mutable_metrics();
        b->set_job_id(job);
        b->set_attempt(attempt_ranks.first);
        v1::MetricPoint* p = b->add_points();
        p->set_kind(v1::MetricPoint::KIND_TRAIN);
        p->set_rank(rank);
        p->set_step(++steps_);
        p->set_steps_per_epoch(1 << 30);
        absl::Time now = absl::Now();
        p->mutable_time()->set_seconds(absl::ToUnixSeconds(now));
        p->mutable_time()->set_nanos(static_cast<int32_t>(
            absl::ToInt64Nanoseconds(now - absl::FromUnixSeconds(absl::ToUnixSeconds(now)))));
        p->set_loss(1.0 / static_cast<double>(steps_));
        p->set_samples_per_sec(1000);
        m.set_seq(++telemetry_seq_);
        if (!Send(std::move(m))) return;
        points_sent++;
        if (log_lines <= 0) continue;
        v1::WorkerMessage lm;
        v1::LogChunk* c = lm.mutable_logs();
        c->set_job_id(job);
        c->set_attempt(attempt_ranks.first);
        c->set_rank(rank);
        for (int i = 0; i < log_lines; ++i) {
          v1::LogLine* line = c->add_lines();
          line->set_rank(rank);
          line->set_stream(v1::LogLine::STREAM_STDOUT);
          *line->mutable_time() = p->time();
          line->set_text(absl::StrCat("epoch 0 step ", steps_, " line ", i,
                                      ": loss=0.1234 lr=0.001 samples/s=1000.0"));
        }
        lm.set_seq(++telemetry_seq_);
        if (!Send(std::move(lm))) return;
        lines_sent += log_lines;
      }
    }
  }
  std::atomic<int64_t> points_sent{0};
  std::atomic<int64_t> lines_sent{0};

  bool WaitDone(int64_t timeout_ns) {
    std::unique_lock<std::mutex> l(mu_);
    return done_cv_.wait_for(l, std::chrono::nanoseconds(timeout_ns), [this] { return done_; });
  }
  bool done() {
    std::lock_guard<std::mutex> l(mu_);
    return done_;
  }
  std::string assigned_id() {
    std::lock_guard<std::mutex> l(mu_);
    return assigned_id_;
  }
  grpc::Status status() {
    std::lock_guard<std::mutex> l(mu_);
    return status_;
  }

  std::atomic<int64_t> register_sent_ns{0};
  std::atomic<int64_t> register_ack_ns{0};
  std::atomic<int64_t> last_hb_sent_ns{0};

  // gRPC reactions.
  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> l(mu_);
    if (!ok) {
      writing_ = false;
      queue_.clear();
      StopLocked(l);
      return;
    }
    if (!queue_.empty() && !stopping_) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      l.unlock();
      StartWrite(&current_);
      return;
    }
    writing_ = false;
    if (stopping_) ReleaseLocked(l);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      std::unique_lock<std::mutex> l(mu_);
      read_done_ = true;
      StopLocked(l);
      return;
    }
    int64_t now = NowNs();
    const v1::CoordinatorMessage& m = in_;
    switch (m.msg_case()) {
      case v1::CoordinatorMessage::kHeartbeatAck: {
        int64_t seq = m.heartbeat_ack().seq();
        if (sent_seq_[seq % kRing].load(std::memory_order_relaxed) == seq) {
          hub_->rtt.Add(now - sent_ns_[seq % kRing].load(std::memory_order_relaxed));
        }
        hub_->acks++;
        break;
      }
      case v1::CoordinatorMessage::kRegisterAck: {
        {
          std::lock_guard<std::mutex> l(mu_);
          assigned_id_ = m.register_ack().worker_id();
        }
        register_ack_ns = now;
        hub_->register_lat.Add(now - register_sent_ns);
        hub_->registered++;
        int64_t interval = m.register_ack().heartbeat_interval_ms() > 0
                               ? int64_t{m.register_ack().heartbeat_interval_ms()} * 1000000
                               : hub_->heartbeat_ns();
        hb_interval_ns = interval;
        hub_->ScheduleHeartbeat(this, index_, now + std::min(interval, hub_->heartbeat_ns()));
        break;
      }
      case v1::CoordinatorMessage::kPreflight: {
        // A simulated host has whatever a job needs: every check passes
        // (the coordinator's --preflight is on by default).
        v1::WorkerMessage rep;
        rep.mutable_preflight()->set_job_id(m.preflight().job_id());
        rep.mutable_preflight()->set_attempt(m.preflight().attempt());
        Send(std::move(rep));
        break;
      }
      case v1::CoordinatorMessage::kStartRanks:
        if (auto_run && m.start_ranks().produce_rendezvous()) {
          v1::WorkerMessage rdv;
          rdv.mutable_rendezvous()->set_job_id(m.start_ranks().job_id());
          rdv.mutable_rendezvous()->set_attempt(m.start_ranks().attempt());
          rdv.mutable_rendezvous()->mutable_info()->set_gloo_store_address("127.0.0.1:29500");
          rdv.mutable_rendezvous()->mutable_info()->set_master_addr("127.0.0.1");
          rdv.mutable_rendezvous()->mutable_info()->set_master_port(29500);
          Send(std::move(rdv));
        }
        if (auto_run) {
          std::lock_guard<std::mutex> l(mu_);
          for (const auto& r : m.start_ranks().ranks()) {
            my_ranks_[m.start_ranks().job_id()].push_back(r.rank());
          }
        }
        break;
      case v1::CoordinatorMessage::kRendezvous:
        if (auto_run) {
          std::vector<int> ranks;
          {
            std::lock_guard<std::mutex> l(mu_);
            ranks = my_ranks_[m.rendezvous().job_id()];
            running_[m.rendezvous().job_id()] = {m.rendezvous().attempt(), ranks};
          }
          for (int r : ranks) {
            SendStatus(m.rendezvous().job_id(), m.rendezvous().attempt(), r, v1::RANK_STATE_RUNNING);
          }
        }
        break;
      default:
        break;
    }
    if (listener) listener(this, m, now);
    StartRead(&in_);
  }

  void OnDone(const grpc::Status& s) override {
    hub_->ended++;
    std::lock_guard<std::mutex> l(mu_);
    status_ = s;
    done_ = true;
    done_cv_.notify_all();
  }

  std::atomic<int64_t> hb_interval_ns{0};

 private:
  static constexpr int kRing = 16;

  void StopLocked(std::unique_lock<std::mutex>& l) {
    stopping_ = true;
    if (!writing_) ReleaseLocked(l);
  }
  void ReleaseLocked(std::unique_lock<std::mutex>& l) {
    if (released_) return;
    released_ = true;
    l.unlock();
    RemoveHold();
  }

  Hub* hub_;
  int index_;
  std::string id_;
  v1::Slot::Kind kind_;
  int slots_;
  grpc::ClientContext ctx_;
  v1::CoordinatorMessage in_;

  std::mutex mu_;
  std::condition_variable done_cv_;
  std::deque<v1::WorkerMessage> queue_;
  v1::WorkerMessage current_;
  bool writing_ = false;
  bool stopping_ = false;
  bool released_ = false;
  bool read_done_ = false;
  bool done_ = false;
  grpc::Status status_;
  std::string assigned_id_;
  std::map<std::string, std::vector<int>> my_ranks_;
  // Jobs whose ranks this worker reported RUNNING: attempt and ranks.
  std::map<std::string, std::pair<int, std::vector<int>>> running_;
  int64_t steps_ = 0;             // timer thread only
  int64_t telemetry_seq_ = 0;     // timer thread only

  std::atomic<int64_t> seq_{0};
  std::atomic<int64_t> sent_ns_[kRing] = {};
  std::atomic<int64_t> sent_seq_[kRing] = {};
};

void Hub::TickLoop(Shard& sh) {
  std::vector<Ev> due;
  while (true) {
    {
      std::unique_lock<std::mutex> l(sh.mu);
      while (!sh.stop) {
        int64_t now = NowNs();
        if (!sh.heap.empty() && sh.heap.top().t <= now) break;
        int64_t wait = sh.heap.empty() ? 50000000 : std::min<int64_t>(sh.heap.top().t - now, 50000000);
        sh.cv.wait_for(l, std::chrono::nanoseconds(wait));
      }
      if (sh.stop) return;
      int64_t now = NowNs();
      while (!sh.heap.empty() && sh.heap.top().t <= now) {
        due.push_back(sh.heap.top());
        sh.heap.pop();
      }
    }
    std::vector<Ev> next;
    for (const Ev& e : due) {
      int64_t own = e.w->hb_interval_ns.load();
      int64_t interval = own > 0 ? std::min(own, heartbeat_ns_) : heartbeat_ns_;
      if (e.w->Heartbeat(e.t)) next.push_back({e.t + interval, e.w});
    }
    due.clear();
    std::lock_guard<std::mutex> l(sh.mu);
    for (const Ev& e : next) sh.heap.push(e);
  }
}

// -------------------------------------------------------------- job calls

std::string SubmitSync(v1::JobService::Stub* stub, const v1::JobSpec& spec, int64_t* latency = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  v1::SubmitJobResponse resp;
  int64_t t0 = NowNs();
  grpc::Status s = stub->SubmitJob(&ctx, req, &resp);
  if (latency) *latency = NowNs() - t0;
  if (!s.ok()) {
    std::cerr << "SubmitJob: " << s.error_message() << "\n";
    return "";
  }
  return resp.job().id();
}

v1::JobState GetState(v1::JobService::Stub* stub, const std::string& id, std::string* reason = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::GetJobRequest req;
  req.set_job_id(id);
  v1::Job job;
  if (!stub->GetJob(&ctx, req, &job).ok()) return v1::JOB_STATE_UNSPECIFIED;
  if (reason) *reason = job.state_reason();
  return job.state();
}

bool WaitState(v1::JobService::Stub* stub, const std::string& id, v1::JobState want, int64_t timeout_ns) {
  int64_t deadline = NowNs() + timeout_ns;
  while (NowNs() < deadline) {
    if (GetState(stub, id) == want) return true;
    SleepNs(20000000);
  }
  return false;
}

void CancelJob(v1::JobService::Stub* stub, const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::CancelJobRequest req;
  req.set_job_id(id);
  req.set_reason("bench cleanup");
  v1::Job job;
  (void)stub->CancelJob(&ctx, req, &job);
}

// A WatchJob stream on the callback API: records when the job first reached
// RUNNING and when its attempt failed (FAILED or RESTARTING).
class JobWatch : public grpc::ClientReadReactor<v1::JobUpdate> {
 public:
  JobWatch(v1::JobService::Stub* stub, const std::string& job) {
    v1::WatchJobRequest req;
    req.set_job_id(job);
    stub->async()->WatchJob(&ctx_, &req, this);
    StartRead(&u_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    int64_t now = NowNs();
    if (u_.has_job()) {
      std::lock_guard<std::mutex> l(mu_);
      v1::JobState s = u_.job().state();
      last_ = s;
      if (s == v1::JOB_STATE_RUNNING && running_ns_ == 0) running_ns_ = now;
      if (IsFailedOrRestarting(s) && failed_ns_ == 0) {
        failed_ns_ = now;
        failed_state_ = s;
        reason_ = u_.job().state_reason();
      }
    }
    StartRead(&u_);
  }
  void OnDone(const grpc::Status&) override {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
    cv_.notify_all();
  }
  void Cancel() { ctx_.TryCancel(); }
  void WaitDone() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return done_; });
  }
  int64_t running_ns() { std::lock_guard<std::mutex> l(mu_); return running_ns_; }
  int64_t failed_ns() { std::lock_guard<std::mutex> l(mu_); return failed_ns_; }
  v1::JobState failed_state() { std::lock_guard<std::mutex> l(mu_); return failed_state_; }
  std::string reason() { std::lock_guard<std::mutex> l(mu_); return reason_; }

 private:
  grpc::ClientContext ctx_;
  v1::JobUpdate u_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  int64_t running_ns_ = 0;
  int64_t failed_ns_ = 0;
  v1::JobState last_ = v1::JOB_STATE_UNSPECIFIED;
  v1::JobState failed_state_ = v1::JOB_STATE_UNSPECIFIED;
  std::string reason_;
};

// ------------------------------------------------------ failure detection

// A worker that dies: either an in-process stream (cut) or a child process
// running --mode=single_worker (SIGKILL).
struct Victim {
  bool process = false;
  std::unique_ptr<SimWorker> sim;
  Subprocess child;  // process = true: a single_worker child
  int out_fd = -1;
  std::thread reader;
  std::mutex mu;
  std::condition_variable cv;
  bool registered = false;
  std::string started_job;
  std::vector<int64_t> hb_times;

  std::string job;
  std::unique_ptr<JobWatch> watch;
  int64_t cut_ns = 0;
  int64_t last_hb_ns = 0;
};

void ReadChildLines(Victim* v) {
  std::string buf;
  char chunk[4096];
  while (true) {
    ssize_t n = read(v->out_fd, chunk, sizeof chunk);
    if (n <= 0) break;
    buf.append(chunk, static_cast<size_t>(n));
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      std::lock_guard<std::mutex> l(v->mu);
      if (line.rfind("REG ", 0) == 0) v->registered = true;
      if (line.rfind("START ", 0) == 0 && v->started_job.empty()) v->started_job = line.substr(6);
      if (line.rfind("HB ", 0) == 0) v->hb_times.push_back(std::stoll(line.substr(3)));
      v->cv.notify_all();
    }
  }
  close(v->out_fd);
}

struct FailureStats {
  Dist from_cut, from_last_hb;
  int failed = 0, restarting = 0, undetected = 0, not_running = 0;
  std::string sample_reason;
};

// Runs `count` trials, `batch` at a time. process=true: SIGKILLed child
// processes; false: in-process streams cancelled.
void RunFailureTrials(Hub& hub, int count, int batch, bool process, bool cuda, const std::string& tag,
                      FailureStats& st) {
  static std::mt19937_64 rng(12345);
  v1::JobService::Stub* jobs = hub.jobs();
  const std::string self = "/proc/self/exe";
  char exe[4096];
  ssize_t exe_len = readlink(self.c_str(), exe, sizeof exe - 1);
  exe[exe_len > 0 ? exe_len : 0] = 0;
  int trial = 0;
  while (trial < count) {
    int n = std::min(batch, count - trial);
    std::vector<std::unique_ptr<Victim>> vs;
    for (int i = 0; i < n; ++i) {
      auto v = std::make_unique<Victim>();
      v->process = process;
      std::string id = absl::StrCat("fail-", tag, "-", trial + i);
      if (process) {
        int fds[2];
        if (pipe2(fds, O_CLOEXEC) != 0) { perror("pipe"); std::exit(1); }
        SpawnOptions o;
        o.argv = {exe, "--mode=single_worker", "--target=" + absl::GetFlag(FLAGS_target), "--worker_id=" + id,
                  std::string("--slot_kind=") + (cuda ? "gpu" : "cpu"),
                  absl::StrCat("--heartbeat_ms=", absl::GetFlag(FLAGS_heartbeat_ms)),
                  "--admin_token_file=" + absl::GetFlag(FLAGS_admin_token_file)};
        o.fds = {{1, fds[1]}};
        o.parent_death_signal = SIGKILL;
        absl::StatusOr<Subprocess> child = Subprocess::Spawn(o);
        close(fds[1]);
        if (!child.ok()) { std::cerr << child.status() << "\n"; std::exit(1); }
        v->child = std::move(*child);
        v->out_fd = fds[0];
        Victim* raw = v.get();
        v->reader = std::thread([raw] { ReadChildLines(raw); });
      } else {
        v->sim = std::make_unique<SimWorker>(&hub, trial + i, id,
                                             cuda ? v1::Slot::KIND_GPU : v1::Slot::KIND_CPU, 1);
        Victim* raw = v.get();
        v->sim->listener = [raw](SimWorker*, const v1::CoordinatorMessage& m, int64_t) {
          std::lock_guard<std::mutex> l(raw->mu);
          if (m.has_register_ack()) raw->registered = true;
          if (m.has_start_ranks() && raw->started_job.empty()) raw->started_job = m.start_ranks().job_id();
          raw->cv.notify_all();
        };
        v->sim->Start();
      }
      vs.push_back(std::move(v));
    }
    for (auto& v : vs) {
      std::unique_lock<std::mutex> l(v->mu);
      if (!v->cv.wait_for(l, std::chrono::seconds(20), [&] { return v->registered; })) {
        std::cerr << "failure trial: a worker did not register\n";
      }
    }
    // One single-rank job per victim; jobs land on whichever victim is free.
    std::vector<std::string> ids;
    std::map<std::string, std::unique_ptr<JobWatch>> watches;
    for (int i = 0; i < n; ++i) {
      std::string id = SubmitSync(jobs, MakeSpec((trial + i) % 2 == 0 ? 0 : 1, cuda));
      if (id.empty()) continue;
      ids.push_back(id);
      watches[id] = std::make_unique<JobWatch>(jobs, id);
    }
    for (auto& v : vs) {
      std::unique_lock<std::mutex> l(v->mu);
      v->cv.wait_for(l, std::chrono::seconds(20), [&] { return !v->started_job.empty(); });
      v->job = v->started_job;
      if (watches.count(v->job)) v->watch = std::move(watches[v->job]);
    }
    for (auto& v : vs) {
      int64_t deadline = NowNs() + int64_t{20} * 1000000000;
      while (v->watch && v->watch->running_ns() == 0 && NowNs() < deadline) SleepNs(5000000);
    }
    // Every victim heartbeats before it dies (its lease is then refreshed by
    // heartbeats, not by its registration).
    for (auto& v : vs) {
      int64_t deadline = NowNs() + int64_t{5} * 1000000000;
      auto has_hb = [&] {
        if (v->sim) return v->sim->last_hb_sent_ns.load() > 0;
        std::lock_guard<std::mutex> l(v->mu);
        return !v->hb_times.empty();
      };
      while (!has_hb() && NowNs() < deadline) SleepNs(5000000);
    }
    // Kill each at a random phase of its heartbeat, spread over ~1.2 s.
    std::vector<std::pair<int64_t, Victim*>> plan;
    int64_t base = NowNs() + 100000000;
    std::uniform_int_distribution<int64_t> phase(0, 1200000000);
    for (auto& v : vs) plan.push_back({base + phase(rng), v.get()});
    std::sort(plan.begin(), plan.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [t, v] : plan) {
      SleepUntilNs(t);
      if (v->process) {
        v->child.Signal(SIGKILL);
        v->cut_ns = NowNs();
      } else {
        v->last_hb_ns = v->sim->last_hb_sent_ns;
        v->cut_ns = NowNs();
        v->sim->Cancel();
      }
    }
    for (auto& v : vs) {
      if (v->process) {
        v->child.Wait();
        v->reader.join();  // The pipe is drained: every HB line is in.
        std::lock_guard<std::mutex> l(v->mu);
        for (int64_t t : v->hb_times) if (t <= v->cut_ns) v->last_hb_ns = std::max(v->last_hb_ns, t);
      }
    }
    for (auto& v : vs) {
      if (!v->watch || v->watch->running_ns() == 0) {
        ++st.not_running;
        continue;
      }
      int64_t deadline = v->cut_ns + int64_t{15} * 1000000000;
      while (v->watch->failed_ns() == 0 && NowNs() < deadline) SleepNs(2000000);
      int64_t f = v->watch->failed_ns();
      if (f == 0) {
        ++st.undetected;
        continue;
      }
      st.from_cut.Add(f - v->cut_ns);
      if (v->last_hb_ns > 0) st.from_last_hb.Add(f - v->last_hb_ns);
      if (v->watch->failed_state() == v1::JOB_STATE_FAILED) ++st.failed; else ++st.restarting;
      if (st.sample_reason.empty()) st.sample_reason = v->watch->reason();
    }
    for (const std::string& id : ids) {
      if (GetState(jobs, id) == v1::JOB_STATE_RESTARTING || GetState(jobs, id) == v1::JOB_STATE_PENDING) {
        CancelJob(jobs, id);
      }
    }
    for (auto& v : vs) {
      if (v->watch) {
        v->watch->Cancel();
        v->watch->WaitDone();
      }
      if (v->sim) {
        v->sim->WaitDone(int64_t{10} * 1000000000);
        // The timer thread may still hold it until its next heartbeat is due.
        static auto* graveyard = new std::vector<std::unique_ptr<SimWorker>>();
        graveyard->push_back(std::move(v->sim));
      }
    }
    for (auto& [id, w] : watches) {
      if (w) {
        w->Cancel();
        w->WaitDone();
      }
    }
    trial += n;
  }
}

void ReportFailure(const std::string& key, FailureStats& st) {
  st.from_cut.Report(key + ".cut_to_failed");
  st.from_last_hb.Report(key + ".last_hb_to_failed");
  Put(key + ".jobs_failed", st.failed);
  Put(key + ".jobs_restarting", st.restarting);
  Put(key + ".undetected", st.undetected);
  Put(key + ".never_running", st.not_running);
  if (!st.sample_reason.empty()) std::cout << "  (" << key << " reason: " << st.sample_reason << ")\n";
}

// --------------------------------------------------------------- scenarios

struct CpuSnap {
  double coord, self;
  int64_t t;
};
CpuSnap SnapCpu(int coord_pid) { return {ProcCpuSeconds(coord_pid), ProcCpuSeconds(0), NowNs()}; }

int64_t CountAlive(Hub& hub, int64_t* total = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ListWorkersRequest req;
  req.set_include_gone(true);
  v1::ListWorkersResponse resp;
  if (!hub.workers_stub()->ListWorkers(&ctx, req, &resp).ok()) return -1;
  int64_t alive = 0;
  for (const auto& w : resp.workers()) alive += w.state() == v1::WORKER_STATE_ALIVE;
  if (total) *total = resp.workers_size();
  return alive;
}

// A WatchJob stream that counts metric points and how long after their send
// stamp they arrive (telemetry mode).
class PointWatch : public grpc::ClientReadReactor<v1::JobUpdate> {
 public:
  PointWatch(v1::JobService::Stub* stub, const std::string& job, Recorder* latency)
      : latency_(latency) {
    v1::WatchJobRequest req;
    req.set_job_id(job);
    stub->async()->WatchJob(&ctx_, &req, this);
    StartRead(&u_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (u_.has_metrics()) {
      absl::Time now = absl::Now();
      for (const v1::MetricPoint& p : u_.metrics().points()) {
        if (p.kind() != v1::MetricPoint::KIND_TRAIN) continue;
        absl::Time sent = absl::FromUnixSeconds(p.time().seconds()) + absl::Nanoseconds(p.time().nanos());
        latency_->Add(absl::ToInt64Nanoseconds(now - sent));
        points++;
      }
    }
    skipped += u_.skipped();
    StartRead(&u_);
  }
  void OnDone(const grpc::Status&) override {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
    cv_.notify_all();
  }
  void Cancel() { ctx_.TryCancel(); }
  void WaitDone() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return done_; });
  }
  std::atomic<int64_t> points{0};
  std::atomic<int64_t> skipped{0};

 private:
  Recorder* latency_;
  grpc::ClientContext ctx_;
  v1::JobUpdate u_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

// Write syscalls and bytes of a process (/proc/PID/io): every SQLite commit
// is at least a WAL write, so this bounds the commit rate from above.
std::pair<int64_t, int64_t> ProcWrites(int pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/io"));
  std::string k;
  int64_t v = 0, syscw = -1, bytes = -1;
  while (f >> k >> v) {
    if (k == "syscw:") syscw = v;
    if (k == "write_bytes:") bytes = v;
  }
  return {syscw, bytes};
}

// Log lines the coordinator holds for one job (every rank, latest attempt).
int64_t StoredLogLines(v1::JobService::Stub* stub, const std::string& job) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::GetLogsRequest req;
  req.set_job_id(job);
  auto reader = stub->GetLogs(&ctx, req);
  v1::LogChunk c;
  int64_t n = 0;
  while (reader->Read(&c)) n += c.lines_size();
  return reader->Finish().ok() ? n : -1;
}

int RunTelemetry() {
  const int idle = absl::GetFlag(FLAGS_workers);
  const int jobs = absl::GetFlag(FLAGS_telemetry_jobs);
  const int ranks = absl::GetFlag(FLAGS_ranks_per_job);
  const int lines = absl::GetFlag(FLAGS_log_lines_per_s);
  const int pid = absl::GetFlag(FLAGS_coord_pid);
  const int64_t hb_ns = int64_t{absl::GetFlag(FLAGS_heartbeat_ms)} * 1000000;
  Hub hub(absl::GetFlag(FLAGS_target), absl::GetFlag(FLAGS_channels), hb_ns);
  Put("idle_workers", idle);
  Put("jobs", jobs);
  Put("ranks_per_job", ranks);
  Put("ranks", jobs * ranks);
  Put("log_lines_per_rank_s", lines);

  // Rank hosts (CPU slots, one job each) first, then the idle workers (a GPU
  // slot each, so the CPU jobs never land there), at the ramp rate.
  std::vector<std::unique_ptr<SimWorker>> hosts, ws;
  std::atomic<bool> sending{false};
  const double rate = absl::GetFlag(FLAGS_ramp_per_s);
  int64_t start = NowNs();
  for (int i = 0; i < jobs + idle; ++i) {
    SleepUntilNs(start + static_cast<int64_t>(1e9 * i / rate));
    bool host = i < jobs;
    auto w = std::make_unique<SimWorker>(&hub, i, "", host ? v1::Slot::KIND_CPU : v1::Slot::KIND_GPU,
                                         host ? ranks : 1);
    if (host) {
      SimWorker* raw = w.get();
      w->on_heartbeat = [raw, &sending, lines](int64_t) {
        if (sending.load(std::memory_order_relaxed)) raw->SendTelemetry(lines);
      };
    }
    w->Start();
    (host ? hosts : ws).push_back(std::move(w));
  }
  int64_t deadline = start + int64_t{absl::GetFlag(FLAGS_ramp_timeout_s)} * 1000000000;
  while (hub.registered + hub.ended < jobs + idle && NowNs() < deadline) SleepNs(10000000);
  Put("workers_registered", static_cast<int64_t>(hub.registered));
  Put("ramp_s", (NowNs() - start) / 1e9);

  // The jobs, and a watcher on each.
  v1::JobSpec spec = MakeSpec(0, false);
  spec.set_world_size(ranks);
  spec.set_device(v1::DEVICE_CPU);
  std::vector<std::string> ids;
  for (int j = 0; j < jobs; ++j) ids.push_back(SubmitSync(hub.jobs(), spec));
  int running = 0;
  for (const std::string& id : ids) {
    if (!id.empty() && WaitState(hub.jobs(), id, v1::JOB_STATE_RUNNING, int64_t{60} * 1000000000)) {
      ++running;
    }
  }
  Put("jobs_running", running);
  if (running < jobs) std::cerr << "only " << running << " of " << jobs << " jobs are running\n";
  Recorder ingest;
  std::vector<std::unique_ptr<PointWatch>> watches;
  for (const std::string& id : ids) {
    if (!id.empty()) watches.push_back(std::make_unique<PointWatch>(hub.jobs(), id, &ingest));
  }
  SleepNs(1000000000);

  // Send; measure over the steady window after a warm-up.
  sending = true;
  SleepNs(int64_t{absl::GetFlag(FLAGS_warmup_s)} * 1000000000);
  const int steady = absl::GetFlag(FLAGS_steady_s);
  CpuSnap c0 = SnapCpu(pid);
  auto w0 = ProcWrites(pid);
  auto coord_t0 = ThreadStats(pid);
  int64_t sent0 = hub.heartbeats_sent, acks0 = hub.acks;
  hub.rtt.Enable(true);
  ingest.Enable(true);
  // Each second of the window is one row of the series (report.py draws
  // bench/plots/telemetry.png from it): coordinator CPU, heartbeat RTT p99,
  // ingest p99 and write syscalls of that second.
  Dist rtt_all, ingest_all;
  CpuSnap prev = c0;
  auto w_prev = w0;
  for (int s = 1; s <= steady; ++s) {
    SleepUntilNs(c0.t + int64_t{s} * 1000000000);
    Dist rtt = hub.rtt.Take(), ing = ingest.Take();
    CpuSnap c = SnapCpu(pid);
    auto w = ProcWrites(pid);
    const double dt = (c.t - prev.t) / 1e9;
    Put(absl::StrCat("series.", s),
        absl::StrFormat("%.3f %.2f %.2f %.0f", (c.coord - prev.coord) / dt, rtt.Pct(99), ing.Pct(99),
                        w.first >= 0 && w_prev.first >= 0 ? (w.first - w_prev.first) / dt : -1.0));
    rtt_all.v.insert(rtt_all.v.end(), rtt.v.begin(), rtt.v.end());
    ingest_all.v.insert(ingest_all.v.end(), ing.v.begin(), ing.v.end());
    prev = c;
    w_prev = w;
  }
  hub.rtt.Enable(false);
  ingest.Enable(false);
  CpuSnap c1 = SnapCpu(pid);
  auto w1 = ProcWrites(pid);
  auto coord_t1 = ThreadStats(pid);
  const double secs = (c1.t - c0.t) / 1e9;
  sending = false;
  ReportThreads("coord", coord_t0, coord_t1, secs);
  Put("steady_s", secs);
  Put("coord_cpu_cores", (c1.coord - c0.coord) / secs);
  Put("bench_cpu_cores", (c1.self - c0.self) / secs);
  Put("heartbeats_per_s", (hub.heartbeats_sent - sent0) / secs);
  Put("acks_per_s", (hub.acks - acks0) / secs);
  if (w0.first >= 0 && w1.first >= 0) {
    Put("coord_write_syscalls_per_s", (w1.first - w0.first) / secs);
    Put("coord_write_mb_per_s", (w1.second - w0.second) / secs / 1e6);
  }
  rtt_all.Report("rtt");
  ingest_all.Report("ingest");

  // Drain, then count what arrived.
  SleepNs(int64_t{absl::GetFlag(FLAGS_drain_s)} * 1000000000);
  int64_t points_sent = 0, lines_sent = 0, points_seen = 0, skipped = 0;
  for (auto& h : hosts) points_sent += h->points_sent, lines_sent += h->lines_sent;
  for (auto& w : watches) points_seen += w->points, skipped += w->skipped;
  Put("points_sent", points_sent);
  Put("points_received_by_watchers", points_seen);
  Put("points_lost", points_sent - points_seen);
  Put("watch_updates_skipped", skipped);
  int64_t lines_stored = 0;
  for (const std::string& id : ids) {
    int64_t n = id.empty() ? -1 : StoredLogLines(hub.jobs(), id);
    if (n < 0) {
      lines_stored = -1;
      break;
    }
    lines_stored += n;
  }
  Put("lines_sent", lines_sent);
  Put("lines_stored", lines_stored);
  Put("lines_lost", lines_stored < 0 ? -1 : lines_sent - lines_stored);
  {
    double l[3];
    if (getloadavg(l, 3) == 3) Put("loadavg_1m", l[0]);
  }

  for (auto& w : watches) w->Cancel();
  for (auto& w : watches) w->WaitDone();
  for (const std::string& id : ids) {
    if (!id.empty()) CancelJob(hub.jobs(), id);
  }
  for (auto* group : {&hosts, &ws}) {
    for (auto& w : *group) w->Cancel();
    for (auto& w : *group) w->WaitDone(int64_t{10} * 1000000000);
  }
  hub.StopTicker();
  return 0;
}

int RunHeartbeat() {
  const int n = absl::GetFlag(FLAGS_workers);
  const int pid = absl::GetFlag(FLAGS_coord_pid);
  const int64_t hb_ns = int64_t{absl::GetFlag(FLAGS_heartbeat_ms)} * 1000000;
  Hub hub(absl::GetFlag(FLAGS_target), absl::GetFlag(FLAGS_channels), hb_ns);
  Put("workers_target", n);
  Put("channels", absl::GetFlag(FLAGS_channels));
  int64_t rss0 = ProcRssKb(pid);
  int64_t self_rss0 = ProcRssKb(0);
  Put("coord_rss_idle_mb", rss0 / 1024.0);

  // Ramp.
  std::vector<std::unique_ptr<SimWorker>> ws;
  ws.reserve(n);
  hub.register_lat.Enable(true);
  CpuSnap r0 = SnapCpu(pid);
  const double rate = absl::GetFlag(FLAGS_ramp_per_s);
  int64_t start = NowNs();
  for (int i = 0; i < n; ++i) {
    SleepUntilNs(start + static_cast<int64_t>(1e9 * i / rate));
    ws.push_back(std::make_unique<SimWorker>(&hub, i, "", v1::Slot::KIND_CPU, absl::GetFlag(FLAGS_slots)));
    ws.back()->Start();
    if (i % 1000 == 999) {
      std::cout << "  ramp: started " << i + 1 << ", registered " << hub.registered << ", rss "
                << ProcRssKb(pid) / 1024 << " MB" << std::endl;
    }
  }
  int64_t ramp_deadline = start + int64_t{absl::GetFlag(FLAGS_ramp_timeout_s)} * 1000000000;
  while (hub.registered < n && hub.ended == 0 && NowNs() < ramp_deadline) SleepNs(10000000);
  while (hub.registered + hub.ended < n && NowNs() < ramp_deadline) SleepNs(10000000);
  int64_t ramp_end = NowNs();
  CpuSnap r1 = SnapCpu(pid);
  hub.register_lat.Enable(false);
  const int64_t reg = hub.registered;
  Put("workers_registered", reg);
  Put("ramp_s", (ramp_end - start) / 1e9);
  Put("ramp_registrations_per_s", reg / ((ramp_end - start) / 1e9));
  Put("ramp_coord_cpu_cores", (r1.coord - r0.coord) / ((r1.t - r0.t) / 1e9));
  hub.register_lat.Take().Report("register_latency");
  if (reg == 0) {
    std::cerr << "no worker registered\n";
    return 1;
  }

  // Steady window.
  SleepNs(int64_t{absl::GetFlag(FLAGS_warmup_s)} * 1000000000);
  const int steady = absl::GetFlag(FLAGS_steady_s);
  int64_t sent0 = hub.heartbeats_sent, acks0 = hub.acks, ended0 = hub.ended;
  CpuSnap c0 = SnapCpu(pid);
  auto coord_t0 = ThreadStats(pid), self_t0 = ThreadStats(0);
  hub.rtt.Enable(true);
  hub.lateness.Enable(true);
  int64_t rss_max = 0;
  for (int s = 0; s < steady; ++s) {
    SleepNs(1000000000);
    rss_max = std::max(rss_max, ProcRssKb(pid));
  }
  hub.rtt.Enable(false);
  hub.lateness.Enable(false);
  CpuSnap c1 = SnapCpu(pid);
  auto coord_t1 = ThreadStats(pid), self_t1 = ThreadStats(0);
  double secs = (c1.t - c0.t) / 1e9;
  int64_t rss1 = ProcRssKb(pid);
  ReportThreads("coord", coord_t0, coord_t1, secs);
  ReportThreads("bench", self_t0, self_t1, secs);
  Put("steady_s", secs);
  Put("heartbeats_per_s", (hub.heartbeats_sent - sent0) / secs);
  Put("acks_per_s", (hub.acks - acks0) / secs);
  Put("streams_ended_in_window", static_cast<int64_t>(hub.ended - ended0));
  Put("coord_cpu_cores", (c1.coord - c0.coord) / secs);
  Put("bench_cpu_cores", (c1.self - c0.self) / secs);
  Put("coord_rss_mb", rss1 / 1024.0);
  Put("coord_rss_max_mb", rss_max / 1024.0);
  Put("coord_kb_per_worker", static_cast<double>(rss1 - rss0) / static_cast<double>(reg));
  Put("bench_rss_mb", ProcRssKb(0) / 1024.0);
  Put("bench_kb_per_worker", static_cast<double>(ProcRssKb(0) - self_rss0) / static_cast<double>(reg));
  hub.rtt.Take().Report("rtt");
  hub.lateness.Take().Report("send_lateness");
  {
    double l[3];
    if (getloadavg(l, 3) == 3) Put("loadavg_1m", l[0]);
  }

  // Failure detection under the load.
  if (int t = absl::GetFlag(FLAGS_trials_under_load); t > 0) {
    FailureStats st;
    RunFailureTrials(hub, t, std::min(t, absl::GetFlag(FLAGS_batch)), /*process=*/false,
                     /*cuda=*/true, "load", st);
    ReportFailure("under_load", st);
  }

  // Mass loss: cut a fraction at once; watch survivors' round trips and how
  // long the coordinator takes to declare all of them LOST.
  if (double f = absl::GetFlag(FLAGS_mass_loss_fraction); f > 0) {
    int64_t alive0 = CountAlive(hub);
    int k = static_cast<int>(f * static_cast<double>(ws.size()));
    Put("mass_loss_workers", k);
    hub.rtt.Take();
    hub.rtt.Enable(true);
    int64_t t0 = NowNs();
    for (int i = 0; i < k; ++i) ws[i]->Cancel();
    int64_t want = alive0 - k, alive = alive0, seen_ns = 0;
    int64_t deadline = t0 + int64_t{absl::GetFlag(FLAGS_mass_loss_timeout_s)} * 1000000000;
    int64_t probe_max = 0;
    while (NowNs() < deadline) {
      SleepNs(500000000);
      int64_t p0 = NowNs();
      alive = CountAlive(hub);
      probe_max = std::max(probe_max, NowNs() - p0);
      if (alive >= 0 && alive <= want) {
        seen_ns = NowNs() - t0;
        break;
      }
    }
    hub.rtt.Enable(false);
    Put("mass_loss_alive_before", alive0);
    Put("mass_loss_alive_after", alive);
    Put("mass_loss_all_lost_s", seen_ns > 0 ? seen_ns / 1e9 : -1.0);
    Put("mass_loss_listworkers_max_ms", Ms(probe_max));
    hub.rtt.Take().Report("mass_loss_survivor_rtt");
  }

  // Teardown.
  for (auto& w : ws) w->Cancel();
  for (auto& w : ws) w->WaitDone(int64_t{10} * 1000000000);
  hub.StopTicker();
  return 0;
}

int RunJobs() {
  const int pid = absl::GetFlag(FLAGS_coord_pid);
  const int64_t hb_ns = int64_t{absl::GetFlag(FLAGS_heartbeat_ms)} * 1000000;
  Hub hub(absl::GetFlag(FLAGS_target), absl::GetFlag(FLAGS_channels), hb_ns);
  v1::JobService::Stub* jobs = hub.jobs();
  const v1::JobSpec spec = MakeSpec(0, false);

  // 1. Every slot busy: B one-slot workers, each running a job.
  const int b = absl::GetFlag(FLAGS_busy_workers);
  std::vector<std::unique_ptr<SimWorker>> busy;
  std::mutex mu;
  std::condition_variable cv;
  std::map<SimWorker*, std::vector<std::pair<std::string, int64_t>>> starts;  // job, arrival
  auto listener = [&](SimWorker* w, const v1::CoordinatorMessage& m, int64_t now) {
    if (!m.has_start_ranks()) return;
    std::lock_guard<std::mutex> l(mu);
    starts[w].push_back({m.start_ranks().job_id(), now});
    cv.notify_all();
  };
  for (int i = 0; i < b; ++i) {
    busy.push_back(std::make_unique<SimWorker>(&hub, i, absl::StrCat("busy-", i), v1::Slot::KIND_CPU, 1));
    busy.back()->listener = listener;
    busy.back()->Start();
  }
  {
    int64_t deadline = NowNs() + int64_t{60} * 1000000000;
    while (hub.registered < b && NowNs() < deadline) SleepNs(10000000);
    if (hub.registered < b) {
      std::cerr << "only " << hub.registered << " of " << b << " busy workers registered\n";
      return 1;
    }
  }
  std::vector<std::string> blockers;
  for (int i = 0; i < b; ++i) blockers.push_back(SubmitSync(jobs, spec));
  for (const auto& id : blockers) {
    if (!WaitState(jobs, id, v1::JOB_STATE_RUNNING, int64_t{20} * 1000000000)) {
      std::cerr << "blocker job " << id << " never RUNNING\n";
      return 1;
    }
  }
  Put("busy_workers", b);

  // 2. Submit N with C in flight.
  const int n = absl::GetFlag(FLAGS_jobs);
  const int c = absl::GetFlag(FLAGS_concurrency);
  const int64_t budget = int64_t{absl::GetFlag(FLAGS_submit_budget_s)} * 1000000000;
  int64_t rss0 = ProcRssKb(pid);
  struct Call {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    v1::SubmitJobResponse resp;
    int64_t t0 = 0;
    int index = 0;
  };
  std::vector<int64_t> done_at(n, 0), lat(n, 0);
  std::vector<std::string> job_ids(n);
  int issued = 0, completed = 0, failed = 0, in_flight = 0;
  std::string first_error;
  // A worker dies halfway through the flood: how long until its job fails?
  SimWorker* victim = busy.size() >= 2 ? busy.back().get() : nullptr;
  std::unique_ptr<JobWatch> victim_watch;
  if (victim) victim_watch = std::make_unique<JobWatch>(jobs, blockers.back());
  int64_t victim_cut_ns = 0, victim_last_hb_ns = 0;
  hub.rtt.Take();
  hub.rtt.Enable(true);
  CpuSnap s0 = SnapCpu(pid);
  auto coord_t0 = ThreadStats(pid);
  const int64_t start = NowNs();
  {
    // Issue from this thread only (never from a completion, never under mu).
    int64_t last_print = NowNs();
    while (true) {
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait_for(l, std::chrono::milliseconds(200), [&] { return in_flight < c; });
        if (NowNs() - last_print > 5000000000) {
          last_print = NowNs();
          std::cout << "  submitted " << completed << " in " << (last_print - start) / 1e9 << " s, rss "
                    << ProcRssKb(pid) / 1024 << " MB" << std::endl;
        }
        if (victim && victim_cut_ns == 0 && completed >= n / 2) {
          victim_last_hb_ns = victim->last_hb_sent_ns;
          victim_cut_ns = NowNs();
          victim->Cancel();
        }
        bool stop_issuing = issued == n || NowNs() - start >= budget;
        if (stop_issuing && in_flight == 0) break;
        if (stop_issuing || in_flight >= c) continue;
        ++in_flight;
      }
      auto* call = new Call;
      call->index = issued++;
      *call->req.mutable_spec() = spec;
      call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
      call->t0 = NowNs();
      jobs->async()->SubmitJob(&call->ctx, &call->req, &call->resp, [&, call](grpc::Status s) {
        int64_t now = NowNs();
        std::lock_guard<std::mutex> l(mu);
        --in_flight;
        ++completed;
        if (s.ok()) {
          done_at[call->index] = now;
          lat[call->index] = now - call->t0;
          job_ids[call->index] = call->resp.job().id();
        } else {
          ++failed;
          if (first_error.empty()) first_error = s.error_message();
        }
        delete call;
        cv.notify_all();
      });
    }
  }
  const int64_t end = NowNs();
  CpuSnap s1 = SnapCpu(pid);
  ReportThreads("submit_coord", coord_t0, ThreadStats(pid), (s1.t - s0.t) / 1e9);
  hub.rtt.Enable(false);
  int64_t rss1 = ProcRssKb(pid);
  const int ok = completed - failed;
  const double secs = (end - start) / 1e9;
  Put("jobs_target", n);
  Put("concurrency", c);
  Put("jobs_submitted", ok);
  Put("jobs_refused", failed);
  if (!first_error.empty()) std::cout << "  first error: " << first_error << "\n";
  Put("submit_s", secs);
  Put("submit_per_s", ok / secs);
  Put("submit_coord_cpu_cores", (s1.coord - s0.coord) / secs);
  Put("submit_bench_cpu_cores", (s1.self - s0.self) / secs);
  Put("coord_rss_before_jobs_mb", rss0 / 1024.0);
  Put("coord_rss_after_jobs_mb", rss1 / 1024.0);
  if (ok > 0) Put("coord_kb_per_queued_job", static_cast<double>(rss1 - rss0) / ok);
  {
    // Throughput by thousand (in completion order) and latency of each.
    std::vector<int64_t> ends;
    for (int i = 0; i < n; ++i) if (done_at[i] > 0) ends.push_back(done_at[i]);
    std::sort(ends.begin(), ends.end());
    std::string rates;
    int64_t prev = start;
    for (size_t k = 999; k < ends.size(); k += 1000) {
      absl::StrAppend(&rates, rates.empty() ? "" : " ", absl::StrFormat("%.0f", 1000 / ((ends[k] - prev) / 1e9)));
      prev = ends[k];
    }
    Put("submit_per_s_by_thousand", rates);
    Dist all, first, last;
    std::vector<std::pair<int64_t, int64_t>> by_end;
    for (int i = 0; i < n; ++i) if (done_at[i] > 0) by_end.push_back({done_at[i], lat[i]});
    std::sort(by_end.begin(), by_end.end());
    for (size_t k = 0; k < by_end.size(); ++k) {
      all.Add(by_end[k].second);
      if (k < 1000) first.Add(by_end[k].second);
      if (k + 1000 >= by_end.size()) last.Add(by_end[k].second);
    }
    all.Report("submit_latency_all");
    first.Report("submit_latency_first1000");
    last.Report("submit_latency_last1000");
  }
  hub.rtt.Take().Report("busy_worker_rtt_during_submit");

  if (victim_watch && victim_cut_ns > 0) {
    int64_t deadline = NowNs() + int64_t{20} * 1000000000;
    while (victim_watch->failed_ns() == 0 && NowNs() < deadline) SleepNs(5000000);
    int64_t f = victim_watch->failed_ns();
    Put("flood_worker_lost.cut_to_failed_ms", f > 0 ? Ms(f - victim_cut_ns) : -1.0);
    Put("flood_worker_lost.last_hb_to_failed_ms", f > 0 && victim_last_hb_ns > 0 ? Ms(f - victim_last_hb_ns) : -1.0);
    // > 0: detected only after the flood ended (lease checks wait for an idle loop).
    Put("flood_worker_lost.failed_after_flood_end_ms", f > 0 ? Ms(f - end) : -1.0);
    Put("flood_worker_lost.flood_left_at_cut_s", (end - victim_cut_ns) / 1e9);
    victim_watch->Cancel();
    victim_watch->WaitDone();
  }

  // 3. Probes at full queue, one call at a time.
  const int probes = absl::GetFlag(FLAGS_probe_calls);
  {
    Dist d;
    for (int i = 0; i < probes; ++i) {
      int64_t l = 0;
      if (!SubmitSync(jobs, spec, &l).empty()) d.Add(l);
    }
    d.Report("queued_submit_latency");
    Dist g;
    std::string mid = job_ids[n / 2].empty() ? job_ids[0] : job_ids[n / 2];
    for (int i = 0; i < probes; ++i) {
      int64_t t0 = NowNs();
      GetState(jobs, mid);
      g.Add(NowNs() - t0);
    }
    g.Report("queued_getjob_latency");
    Dist lj;
    for (int i = 0; i < std::max(1, probes / 3); ++i) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      v1::ListJobsRequest req;
      req.add_states(v1::JOB_STATE_PENDING);
      req.set_page_size(100);
      v1::ListJobsResponse resp;
      int64_t t0 = NowNs();
      if (jobs->ListJobs(&ctx, req, &resp).ok()) lj.Add(NowNs() - t0);
    }
    lj.Report("queued_listjobs100_latency");
  }
  Put("queued_jobs_at_probe", ok + probes);

  // 4. Placement on a worker that registers (one free slot, N queued).
  const int trials = absl::GetFlag(FLAGS_sched_trials);
  std::vector<std::unique_ptr<SimWorker>> fresh;
  Dist reg_to_start, ack_to_start;
  std::map<std::string, int> index_of;
  for (int i = 0; i < n; ++i) if (!job_ids[i].empty()) index_of[job_ids[i]] = i;
  int max_index = -1, unknown = 0;
  for (int t = 0; t < trials; ++t) {
    auto w = std::make_unique<SimWorker>(&hub, 1000 + t, absl::StrCat("fresh-", t), v1::Slot::KIND_CPU, 1);
    w->auto_run = false;
    w->listener = listener;
    SimWorker* raw = w.get();
    w->Start();
    std::unique_lock<std::mutex> l(mu);
    if (!cv.wait_for(l, std::chrono::seconds(30), [&] { return !starts[raw].empty(); })) {
      std::cerr << "fresh worker " << t << " got no start_ranks\n";
    } else {
      int64_t at = starts[raw][0].second;
      reg_to_start.Add(at - raw->register_sent_ns);
      ack_to_start.Add(at - raw->register_ack_ns);
      auto it = index_of.find(starts[raw][0].first);
      if (it == index_of.end()) ++unknown; else max_index = std::max(max_index, it->second);
    }
    fresh.push_back(std::move(w));
  }
  reg_to_start.Report("new_worker_register_to_start_ranks");
  ack_to_start.Report("new_worker_ack_to_start_ranks");
  Put("new_worker_placed_max_submit_index", max_index);

  // 5. Placement on a slot that frees: the busy worker's job succeeds.
  Dist free_to_start;
  SimWorker* w0 = busy[0].get();
  for (int t = 0; t < trials; ++t) {
    std::string job;
    size_t seen;
    {
      std::lock_guard<std::mutex> l(mu);
      job = starts[w0].back().first;
      seen = starts[w0].size();
    }
    if (!WaitState(jobs, job, v1::JOB_STATE_RUNNING, int64_t{20} * 1000000000)) {
      std::cerr << "job " << job << " on busy-0 never RUNNING\n";
      break;
    }
    int64_t t0 = NowNs();
    w0->SendStatus(job, 1, 0, v1::RANK_STATE_SUCCEEDED);
    std::unique_lock<std::mutex> l(mu);
    if (!cv.wait_for(l, std::chrono::seconds(30), [&] { return starts[w0].size() > seen; })) {
      std::cerr << "no start_ranks after a slot freed\n";
      break;
    }
    free_to_start.Add(starts[w0].back().second - t0);
  }
  free_to_start.Report("freed_slot_to_start_ranks");

  for (auto& w : busy) w->Cancel();
  for (auto& w : fresh) w->Cancel();
  for (auto& w : busy) w->WaitDone(int64_t{10} * 1000000000);
  for (auto& w : fresh) w->WaitDone(int64_t{10} * 1000000000);
  hub.StopTicker();
  return 0;
}

int RunFailure() {
  const int64_t hb_ns = int64_t{absl::GetFlag(FLAGS_heartbeat_ms)} * 1000000;
  Hub hub(absl::GetFlag(FLAGS_target), absl::GetFlag(FLAGS_channels), hb_ns);
  const int batch = absl::GetFlag(FLAGS_batch);
  FailureStats cut, killed;
  RunFailureTrials(hub, absl::GetFlag(FLAGS_trials_cut), batch, false, false, "cut", cut);
  ReportFailure("stream_cut", cut);
  RunFailureTrials(hub, absl::GetFlag(FLAGS_trials_kill), batch, true, false, "kill", killed);
  ReportFailure("sigkill", killed);
  hub.StopTicker();
  return 0;
}

int RunSingleWorker() {
  const int64_t hb_ns = int64_t{absl::GetFlag(FLAGS_heartbeat_ms)} * 1000000;
  std::mutex out_mu;
  auto line = [&](const std::string& s) {
    std::lock_guard<std::mutex> l(out_mu);
    std::string t = s + "\n";
    (void)!write(1, t.data(), t.size());
  };
  Hub hub(absl::GetFlag(FLAGS_target), 1, hb_ns);
  SimWorker w(&hub, 0, absl::GetFlag(FLAGS_worker_id),
              absl::GetFlag(FLAGS_slot_kind) == "gpu" ? v1::Slot::KIND_GPU : v1::Slot::KIND_CPU, 1);
  w.listener = [&](SimWorker* self, const v1::CoordinatorMessage& m, int64_t) {
    if (m.has_register_ack()) line("REG " + m.register_ack().worker_id());
    if (m.has_start_ranks()) line("START " + m.start_ranks().job_id());
  };
  w.on_heartbeat = [&](int64_t t) { line(absl::StrCat("HB ", t)); };
  w.Start();
  w.WaitDone(int64_t{absl::GetFlag(FLAGS_max_life_s)} * 1000000000);
  hub.StopTicker();
  w.Cancel();
  w.WaitDone(int64_t{5} * 1000000000);
  return 0;
}

}  // namespace
}  // namespace trainctl::bench

int main(int argc, char** argv) {
  trainctl::ParseDaemonFlags(argc, argv,
                             "trainctl-bench-coordinator --target HOST:PORT --mode heartbeat|jobs|failure|telemetry|single_worker\n"
                             "Load generator for a running trainctl-coordinator (bench/coordinator/run.sh).",
                             "bench/coordinator/bench_coordinator.cc");
  signal(SIGPIPE, SIG_IGN);
  using namespace trainctl::bench;
  if (absl::GetFlag(FLAGS_target).empty()) {
    std::cerr << "--target HOST:PORT is required\n";
    return 2;
  }
  absl::StatusOr<std::string> admin = trainctl::auth::ReadTokenFile(absl::GetFlag(FLAGS_admin_token_file));
  if (!admin.ok()) {
    std::cerr << "--admin_token_file: " << admin.status().message() << "\n";
    return 2;
  }
  g_admin_token = *admin;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    trainctl::v1::CreateTokenRequest req;
    req.set_role(trainctl::v1::ROLE_WORKER);
    req.set_name("bench-workers");
    trainctl::v1::CreateTokenResponse resp;
    grpc::Status s = trainctl::v1::AuthService::NewStub(MakeChannel(absl::GetFlag(FLAGS_target), -1, g_admin_token))
                         ->CreateToken(&ctx, req, &resp);
    if (!s.ok()) {
      std::cerr << "creating the simulated workers' token: " << s.error_message() << "\n";
      return 1;
    }
    g_worker_token = resp.secret();
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  int rc;
  if (mode == "heartbeat") rc = RunHeartbeat();
  else if (mode == "jobs") rc = RunJobs();
  else if (mode == "failure") rc = RunFailure();
  else if (mode == "telemetry") rc = RunTelemetry();
  else if (mode == "single_worker") return RunSingleWorker();
  else {
    std::cerr << "unknown --mode " << mode << "\n";
    return 2;
  }
  WriteResults();
  // Skip static destructors racing gRPC's threads.
  std::cout.flush();
  _exit(rc);
}
