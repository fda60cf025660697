// --mode=jobs: with every slot busy, submits N jobs (C in flight), then
// probes at a full queue: one more submission, GetJob/ListJobs, placement on
// a worker that registers and on a slot that frees.
#include <algorithm>
#include <condition_variable>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/coordinator/bench_support.h"
#include "bench/coordinator/hub.h"
#include "bench/coordinator/scenarios.h"

namespace trainctl::bench {

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
    busy.push_back(
        std::make_unique<SimWorker>(&hub, i, absl::StrCat("busy-", i), v1::Slot::KIND_CPU, 1));
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
          std::cout << "  submitted " << completed << " in " << (last_print - start) / 1e9
                    << " s, rss " << ProcRssKb(pid) / 1024 << " MB" << std::endl;
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
    for (int i = 0; i < n; ++i)
      if (done_at[i] > 0) ends.push_back(done_at[i]);
    std::sort(ends.begin(), ends.end());
    std::string rates;
    int64_t prev = start;
    for (size_t k = 999; k < ends.size(); k += 1000) {
      absl::StrAppend(&rates, rates.empty() ? "" : " ",
                      absl::StrFormat("%.0f", 1000 / ((ends[k] - prev) / 1e9)));
      prev = ends[k];
    }
    Put("submit_per_s_by_thousand", rates);
    Dist all, first, last;
    std::vector<std::pair<int64_t, int64_t>> by_end;
    for (int i = 0; i < n; ++i)
      if (done_at[i] > 0) by_end.push_back({done_at[i], lat[i]});
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
    Put("flood_worker_lost.last_hb_to_failed_ms",
        f > 0 && victim_last_hb_ns > 0 ? Ms(f - victim_last_hb_ns) : -1.0);
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
  for (int i = 0; i < n; ++i)
    if (!job_ids[i].empty()) index_of[job_ids[i]] = i;
  int max_index = -1, unknown = 0;
  for (int t = 0; t < trials; ++t) {
    auto w = std::make_unique<SimWorker>(&hub, 1000 + t, absl::StrCat("fresh-", t),
                                         v1::Slot::KIND_CPU, 1);
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
      if (it == index_of.end())
        ++unknown;
      else
        max_index = std::max(max_index, it->second);
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

}  // namespace trainctl::bench
