// Scheduling with queues at scale: the pure scheduler (coordinator/scheduler)
// driven by a simulated cluster, tick by tick. Prints key=value results;
// bench/scheduler/run.sh turns them into bench/RESULTS.md's section.
//
// The cluster: --workers GPU workers of --slots slots each; --queues queues
// of equal nominal quota (the cluster's slots / queues), --cohort-size of
// them per cohort. Each tick: jobs whose time is up end, victims asked to
// stop last tick are gone (their job goes back to pending with the work it
// had left: preemption loses nothing here, as a checkpointing job would), one
// Schedule() pass runs over every pending job, its placements start and its
// preemptions are marked stopping. Decayed usage (half-life --half-life
// ticks) orders the queues for fair share. Job sizes are 1..--max-size slots
// (skewed small), durations 5..60 ticks.
//
// Two scenarios:
//   saturated: every queue keeps --pending-per-queue jobs pending, so the
//              cluster holds ~queues x pending-per-queue pending jobs each
//              pass; a fair scheduler gives each queue its nominal share.
//   borrowing: only the first half of each cohort has work (the others are
//              idle: their quota is lent); the busy queues of a cohort
//              should split the cohort's slots evenly.
// Fairness error: over the measured ticks (after --warmup), the largest
// relative deviation of a busy queue's slot-ticks from the even share of
// what the busy queues used together. Pass time: wall time of each
// Schedule() call in the measured ticks, and the same inputs scheduled
// without queues (one implicit queue) as the baseline the queues add to.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/daemon_flags.h"
#include "coordinator/scheduler/scheduler.h"

ABSL_FLAG(int, workers, 2000, "simulated GPU workers");
ABSL_FLAG(int, slots, 8, "GPU slots per worker");
ABSL_FLAG(int, queues, 20, "queues, equal nominal quota each");
ABSL_FLAG(int, cohort_size, 5, "queues per cohort");
ABSL_FLAG(int, pending_per_queue, 50, "pending jobs kept per busy queue");
ABSL_FLAG(int, max_size, 32, "largest job (slots)");
ABSL_FLAG(int, ticks, 300, "measured ticks per scenario");
ABSL_FLAG(int, warmup, 150, "ticks before measuring");
ABSL_FLAG(double, half_life, 60, "usage half-life in ticks");
ABSL_FLAG(int, seed, 1, "random seed");

namespace trainctl::scheduler {
namespace {

struct SimJob {
  std::string id;
  int queue = 0;
  int size = 1;
  int remaining = 0;  // ticks of work left
  std::uint64_t submit_seq = 0;
};

struct Running {
  SimJob job;
  std::uint64_t start_seq = 0;
  int end_tick = 0;
  bool stopping = false;
  std::vector<std::pair<int, int>> slots;  // (worker, slot)
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(std::ceil(p * v.size())) - 1);
  return v[i];
}

struct ScenarioResult {
  std::vector<double> pass_ms;
  std::vector<double> baseline_ms;
  double fairness_error = 0;
  double utilization = 0;
  long long preemptions = 0;
  long long placements = 0;
  double pending_avg = 0;
  double running_avg = 0;
};

ScenarioResult RunScenario(bool borrowing) {
  const int num_workers = absl::GetFlag(FLAGS_workers);
  const int slots_per = absl::GetFlag(FLAGS_slots);
  const int num_queues = absl::GetFlag(FLAGS_queues);
  const int cohort_size = std::max(1, absl::GetFlag(FLAGS_cohort_size));
  const int pending_per = absl::GetFlag(FLAGS_pending_per_queue);
  const int max_size = absl::GetFlag(FLAGS_max_size);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int ticks = absl::GetFlag(FLAGS_ticks);
  const double decay = std::pow(0.5, 1.0 / absl::GetFlag(FLAGS_half_life));
  std::mt19937 rng(absl::GetFlag(FLAGS_seed) + (borrowing ? 1000 : 0));
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  const int total = num_workers * slots_per;
  QueueInput input;
  std::vector<bool> busy_queue(num_queues);
  for (int q = 0; q < num_queues; ++q) {
    QueueSpec spec;
    spec.name = absl::StrCat("q", q < 10 ? "0" : "", q);
    spec.nominal_gpu = total / num_queues;
    spec.cohort = absl::StrCat("c", q / cohort_size);
    input.queues.push_back(spec);
    busy_queue[q] = !borrowing || (q % cohort_size) < (cohort_size + 1) / 2;
  }
  std::vector<std::vector<bool>> used(num_workers, std::vector<bool>(slots_per, false));
  std::vector<SimJob> pending;
  absl::flat_hash_map<std::string, Running> running;
  std::vector<double> usage(num_queues, 0);
  std::vector<double> served(num_queues, 0);
  std::uint64_t seq = 0, start_seq = 0, next_id = 0;
  ScenarioResult out;
  long long busy_slot_ticks = 0;

  auto new_job = [&](int q) {
    SimJob j;
    j.id = absl::StrCat("j", next_id++);
    j.queue = q;
    // Skewed small: most jobs take a few slots, some take many.
    j.size = std::min(max_size, 1 << uniform(0, 5));
    if (uniform(0, 3) == 0) j.size = uniform(1, max_size);
    j.remaining = uniform(5, 60);
    j.submit_seq = seq++;
    return j;
  };

  for (int tick = 0; tick < warmup + ticks; ++tick) {
    const bool measure = tick >= warmup;
    // Ends: finished jobs, and victims asked to stop (back to pending).
    for (auto it = running.begin(); it != running.end();) {
      Running& r = it->second;
      const bool done = r.end_tick <= tick;
      if (done || r.stopping) {
        for (auto [w, s] : r.slots) used[w][s] = false;
        if (!done) {
          SimJob back = r.job;
          back.remaining = r.end_tick - tick;
          pending.push_back(back);
        }
        running.erase(it++);
      } else {
        ++it;
      }
    }
    // Demand: busy queues keep pending_per jobs waiting.
    std::vector<int> waiting(num_queues, 0);
    for (const SimJob& j : pending) ++waiting[j.queue];
    for (int q = 0; q < num_queues; ++q) {
      if (!busy_queue[q]) continue;
      for (int i = waiting[q]; i < pending_per; ++i) pending.push_back(new_job(q));
    }
    // The pass's inputs.
    std::vector<PendingJob> jobs;
    jobs.reserve(pending.size());
    for (const SimJob& j : pending) {
      PendingJob pj;
      pj.job_id = j.id;
      pj.world_size = j.size;
      pj.device = DeviceRequirement::kCuda;
      pj.submit_seq = j.submit_seq;
      pj.queue = input.queues[j.queue].name;
      jobs.push_back(std::move(pj));
    }
    std::vector<WorkerSlots> workers(num_workers);
    for (int w = 0; w < num_workers; ++w) {
      workers[w].worker_id = absl::StrCat("w", w);
      workers[w].kind = SlotKind::kGpu;
      workers[w].total_slots = slots_per;
      for (int s = 0; s < slots_per; ++s) {
        if (!used[w][s]) workers[w].free_slots.push_back(s);
      }
    }
    input.running.clear();
    for (const auto& [id, r] : running) {
      RunningJob rj;
      rj.job_id = id;
      rj.queue = input.queues[r.job.queue].name;
      rj.kind = SlotKind::kGpu;
      rj.slots = r.job.size;
      rj.start_seq = r.start_seq;
      rj.stopping = r.stopping;
      input.running.push_back(rj);
    }
    for (int q = 0; q < num_queues; ++q) input.queues[q].usage_gpu = usage[q];

    auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<ScheduleResult> result = Schedule(jobs, workers, input);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!result.ok()) {
      std::fprintf(stderr, "bench_scheduler: %s\n", std::string(result.status().message()).c_str());
      std::exit(1);
    }
    if (measure) {
      out.pass_ms.push_back(ms);
      auto b0 = std::chrono::steady_clock::now();
      absl::StatusOr<ScheduleResult> base = Schedule(jobs, workers);
      out.baseline_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - b0).count());
      if (!base.ok()) std::exit(1);
      out.pending_avg += static_cast<double>(jobs.size()) / ticks;
      out.running_avg += static_cast<double>(running.size()) / ticks;
    }
    // Act on it.
    absl::flat_hash_map<std::string, size_t> index;
    for (size_t i = 0; i < pending.size(); ++i) index[pending[i].id] = i;
    std::vector<bool> placed(pending.size(), false);
    for (const Placement& p : result->placements) {
      const size_t i = index.at(p.job_id);
      placed[i] = true;
      Running r;
      r.job = pending[i];
      r.start_seq = start_seq++;
      r.end_tick = tick + r.job.remaining;
      for (const RankAssignment& a : p.ranks) {
        const int w = std::stoi(a.worker_id.substr(1));
        used[w][a.slot] = true;
        r.slots.emplace_back(w, a.slot);
      }
      running[p.job_id] = std::move(r);
      if (measure) ++out.placements;
    }
    for (const Preemption& pr : result->preemptions) {
      running.at(pr.victim_job_id).stopping = true;
      if (measure) ++out.preemptions;
    }
    std::vector<SimJob> still;
    for (size_t i = 0; i < pending.size(); ++i) {
      if (!placed[i]) still.push_back(std::move(pending[i]));
    }
    pending = std::move(still);
    // Usage this tick (slots held, stopping ones too).
    std::vector<double> now(num_queues, 0);
    for (const auto& [id, r] : running) now[r.job.queue] += r.job.size;
    for (int q = 0; q < num_queues; ++q) {
      usage[q] = usage[q] * decay + now[q];
      if (measure) {
        served[q] += now[q];
        busy_slot_ticks += static_cast<long long>(now[q]);
      }
    }
  }
  double busy_total = 0;
  int busy_count = 0;
  for (int q = 0; q < num_queues; ++q) {
    if (busy_queue[q]) {
      busy_total += served[q];
      ++busy_count;
    }
  }
  const double even = busy_total / std::max(1, busy_count);
  for (int q = 0; q < num_queues; ++q) {
    if (busy_queue[q] && even > 0)
      out.fairness_error = std::max(out.fairness_error, std::abs(served[q] - even) / even);
  }
  out.utilization = static_cast<double>(busy_slot_ticks) / (static_cast<double>(total) * ticks);
  return out;
}

void Print(const char* name, const ScenarioResult& r) {
  std::printf("%s.pass_ms_p50=%.3f\n", name, Percentile(r.pass_ms, 0.50));
  std::printf("%s.pass_ms_p99=%.3f\n", name, Percentile(r.pass_ms, 0.99));
  std::printf("%s.pass_ms_max=%.3f\n", name, Percentile(r.pass_ms, 1.0));
  std::printf("%s.baseline_ms_p50=%.3f\n", name, Percentile(r.baseline_ms, 0.50));
  std::printf("%s.baseline_ms_p99=%.3f\n", name, Percentile(r.baseline_ms, 0.99));
  std::printf("%s.fairness_error=%.4f\n", name, r.fairness_error);
  std::printf("%s.utilization=%.4f\n", name, r.utilization);
  std::printf("%s.pending_avg=%.0f\n", name, r.pending_avg);
  std::printf("%s.running_avg=%.0f\n", name, r.running_avg);
  std::printf("%s.placements=%lld\n", name, r.placements);
  std::printf("%s.preemptions=%lld\n", name, r.preemptions);
  std::fflush(stdout);
}

}  // namespace
}  // namespace trainctl::scheduler

int main(int argc, char** argv) {
  trainctl::ParseDaemonFlags(
      argc, argv,
      "trainctl-bench-scheduler [--workers N] [--queues N] ...\n"
      "Simulates a cluster shared by queues and times the scheduler's passes "
      "(bench/scheduler/run.sh).",
      "bench/scheduler/bench_scheduler.cc");
  std::printf(
      "workers=%d\nslots=%d\nqueues=%d\ncohort_size=%d\npending_per_queue=%d\nticks=%d\nwarmup=%"
      "d\n",
      absl::GetFlag(FLAGS_workers), absl::GetFlag(FLAGS_slots), absl::GetFlag(FLAGS_queues),
      absl::GetFlag(FLAGS_cohort_size), absl::GetFlag(FLAGS_pending_per_queue),
      absl::GetFlag(FLAGS_ticks), absl::GetFlag(FLAGS_warmup));
  trainctl::scheduler::Print("saturated", trainctl::scheduler::RunScenario(false));
  trainctl::scheduler::Print("borrowing", trainctl::scheduler::RunScenario(true));
  return 0;
}
