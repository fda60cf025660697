// --mode=telemetry: J jobs of R simulated ranks beside N heartbeating workers,
// every rank sending metric points and log lines; measures the coordinator's
// CPU, heartbeat round trips, ingest latency, write syscalls, and what was lost.
#include <stdlib.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/coordinator/bench_support.h"
#include "bench/coordinator/hub.h"
#include "bench/coordinator/loop_metrics.h"
#include "bench/coordinator/scenarios.h"

namespace trainctl::bench {
namespace {

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
        absl::Time sent =
            absl::FromUnixSeconds(p.time().seconds()) + absl::Nanoseconds(p.time().nanos());
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

}  // namespace

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
    auto w = std::make_unique<SimWorker>(
        &hub, i, "", host ? v1::Slot::KIND_CPU : v1::Slot::KIND_GPU, host ? ranks : 1);
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
  const LoopHists loop0 = SnapLoopHists();
  CpuSnap c0 = SnapCpu(pid);
  auto w0 = ProcWrites(pid);
  auto coord_t0 = ThreadStats(pid);
  const int store_pid = absl::GetFlag(FLAGS_store_pid);
  const double store0 = store_pid > 0 ? ProcTreeCpuSeconds(store_pid) : -1;
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
        absl::StrFormat("%.3f %.2f %.2f %.0f", (c.coord - prev.coord) / dt, rtt.Pct(99),
                        ing.Pct(99),
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
  ReportLoopHists(loop0, SnapLoopHists());
  const double store1 = store_pid > 0 ? ProcTreeCpuSeconds(store_pid) : -1;
  auto coord_t1 = ThreadStats(pid);
  const double secs = (c1.t - c0.t) / 1e9;
  sending = false;
  ReportThreads("coord", coord_t0, coord_t1, secs);
  Put("steady_s", secs);
  Put("coord_cpu_cores", (c1.coord - c0.coord) / secs);
  Put("bench_cpu_cores", (c1.self - c0.self) / secs);
  if (store0 >= 0 && store1 >= 0) Put("store_cpu_cores", (store1 - store0) / secs);
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

}  // namespace trainctl::bench
