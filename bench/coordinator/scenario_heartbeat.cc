// --mode=heartbeat: N workers registered at a ramp rate, then heartbeating;
// heartbeat round trips, the coordinator's CPU and RSS over a steady window,
// this process's own CPU; optionally failure detection under that load and a
// mass loss.
#include <stdlib.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "bench/coordinator/bench_support.h"
#include "bench/coordinator/failure_trials.h"
#include "bench/coordinator/hub.h"
#include "bench/coordinator/loop_metrics.h"
#include "bench/coordinator/scenarios.h"

namespace trainctl::bench {
namespace {

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

}  // namespace

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
    ws.push_back(
        std::make_unique<SimWorker>(&hub, i, "", v1::Slot::KIND_CPU, absl::GetFlag(FLAGS_slots)));
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
  const LoopHists loop0 = SnapLoopHists();
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
  ReportLoopHists(loop0, SnapLoopHists());
  double secs = (c1.t - c0.t) / 1e9;
  int64_t rss1 = ProcRssKb(pid);
  ReportThreads("coord", coord_t0, coord_t1, secs);
  ReportThreads("bench", self_t0, self_t1, secs);
  Put("steady_s", secs);
  Put("heartbeats_per_s", (hub.heartbeats_sent - sent0) / secs);
  {
    // The terms the workers keep to at the end of the window (the
    // coordinator lengthens them past --max-heartbeats-per-sec).
    int64_t lo = 0, hi = 0;
    for (const auto& w : ws) {
      const int64_t v = w->hb_interval_ns.load();
      if (v <= 0) continue;
      lo = lo == 0 ? v : std::min(lo, v);
      hi = std::max(hi, v);
    }
    Put("heartbeat_interval_min_ms", lo / 1e6);
    Put("heartbeat_interval_max_ms", hi / 1e6);
    Put("heartbeat_terms_changed", static_cast<int64_t>(hub.terms_changed));
  }
  Put("acks_per_s", (hub.acks - acks0) / secs);
  Put("streams_ended_in_window", static_cast<int64_t>(hub.ended - ended0));
  Put("coord_cpu_cores", (c1.coord - c0.coord) / secs);
  Put("bench_cpu_cores", (c1.self - c0.self) / secs);
  Put("coord_rss_mb", rss1 / 1024.0);
  Put("coord_rss_max_mb", rss_max / 1024.0);
  Put("coord_kb_per_worker", static_cast<double>(rss1 - rss0) / static_cast<double>(reg));
  Put("bench_rss_mb", ProcRssKb(0) / 1024.0);
  Put("bench_kb_per_worker",
      static_cast<double>(ProcRssKb(0) - self_rss0) / static_cast<double>(reg));
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

}  // namespace trainctl::bench
