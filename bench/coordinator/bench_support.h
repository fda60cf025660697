// Shared support of trainctl-bench-coordinator's scenarios: the flags (defined
// in bench_support.cc), time and /proc helpers, results (Put, WriteResults),
// latency distributions, channels and bearer tokens, and the job calls
// (SubmitJob, GetJob, CancelJob, a WatchJob stream).
#pragma once

#include <grpcpp/grpcpp.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "trainctl/v1/job_service.grpc.pb.h"

ABSL_DECLARE_FLAG(std::string, mode);
ABSL_DECLARE_FLAG(std::string, target);
ABSL_DECLARE_FLAG(std::string, admin_token_file);
ABSL_DECLARE_FLAG(int, coord_pid);
ABSL_DECLARE_FLAG(int, store_pid);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, prefix);
ABSL_DECLARE_FLAG(int, channels);
ABSL_DECLARE_FLAG(int, heartbeat_ms);
ABSL_DECLARE_FLAG(int, tickers);
// heartbeat
ABSL_DECLARE_FLAG(int, workers);
ABSL_DECLARE_FLAG(int, slots);
ABSL_DECLARE_FLAG(double, ramp_per_s);
ABSL_DECLARE_FLAG(int, ramp_timeout_s);
ABSL_DECLARE_FLAG(int, warmup_s);
ABSL_DECLARE_FLAG(int, steady_s);
ABSL_DECLARE_FLAG(int, trials_under_load);
ABSL_DECLARE_FLAG(double, mass_loss_fraction);
ABSL_DECLARE_FLAG(int, mass_loss_timeout_s);
// jobs
ABSL_DECLARE_FLAG(int, jobs);
ABSL_DECLARE_FLAG(int, concurrency);
ABSL_DECLARE_FLAG(int, submit_budget_s);
ABSL_DECLARE_FLAG(int, busy_workers);
ABSL_DECLARE_FLAG(int, sched_trials);
ABSL_DECLARE_FLAG(int, probe_calls);
// failure
ABSL_DECLARE_FLAG(int, trials_cut);
ABSL_DECLARE_FLAG(int, trials_kill);
ABSL_DECLARE_FLAG(int, batch);
// telemetry
ABSL_DECLARE_FLAG(int, telemetry_jobs);
ABSL_DECLARE_FLAG(int, ranks_per_job);
ABSL_DECLARE_FLAG(int, log_lines_per_s);
ABSL_DECLARE_FLAG(int, drain_s);
// single_worker
ABSL_DECLARE_FLAG(std::string, worker_id);
ABSL_DECLARE_FLAG(std::string, slot_kind);
ABSL_DECLARE_FLAG(int, max_life_s);

namespace trainctl::bench {

// ---------------------------------------------------------------- utilities

inline int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}
inline void SleepNs(int64_t ns) {
  if (ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
}
inline void SleepUntilNs(int64_t t) { SleepNs(t - NowNs()); }
inline double Ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

// CPU seconds (user+system) of a process, from /proc/PID/stat.
double ProcCpuSeconds(int pid);
// The same for `pid` and its live children (a PostgreSQL postmaster and its
// backends, WAL writer, checkpointer): differences between two readings are
// exact while no child exits in between (the coordinator's backend lives as
// long as its connection). -1 when `pid` is gone.
double ProcTreeCpuSeconds(int pid);

// Resident set size in KiB, from /proc/PID/status.
int64_t ProcRssKb(int pid);

// One result: printed now as "  KEY = VALUE", appended to --out by
// WriteResults (the key prefixed with --prefix in both).
void Put(const std::string& key, const std::string& value);
void Put(const std::string& key, double v);
void Put(const std::string& key, int64_t v);
void Put(const std::string& key, int v);
void WriteResults();

// Per-thread CPU seconds and run-queue wait (seconds runnable but not
// running, /proc/PID/task/TID/schedstat) of a process.
struct ThreadStat {
  std::string comm;
  double cpu = 0;
  double wait = 0;
};
std::map<int, ThreadStat> ThreadStats(int pid);

// Reports the busiest threads and the run-queue wait over a window.
void ReportThreads(const std::string& key, const std::map<int, ThreadStat>& a,
                   const std::map<int, ThreadStat>& b, double secs);

// Percentiles of durations (ns), reported in ms.
struct Dist {
  std::vector<int64_t> v;
  void Add(int64_t ns) { v.push_back(ns); }
  double Pct(double p) {
    if (v.empty()) return -1;
    std::sort(v.begin(), v.end());
    size_t i = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
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
extern std::string g_admin_token;
extern std::string g_worker_token;

// A channel of its own (one TCP connection) to `target`, every call carrying
// `token`.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, int index,
                                           const std::string& token);

// The spec of a small one-rank job (synthetic data; on CUDA if `cuda`) that
// restarts at most `max_restarts` times.
v1::JobSpec MakeSpec(int max_restarts, bool cuda);

bool IsFailedOrRestarting(v1::JobState s);

// CPU seconds of the coordinator and of this process, and when.
struct CpuSnap {
  double coord, self;
  int64_t t;
};
CpuSnap SnapCpu(int coord_pid);

// -------------------------------------------------------------- job calls

std::string SubmitSync(v1::JobService::Stub* stub, const v1::JobSpec& spec,
                       int64_t* latency = nullptr);

v1::JobState GetState(v1::JobService::Stub* stub, const std::string& id,
                      std::string* reason = nullptr);

bool WaitState(v1::JobService::Stub* stub, const std::string& id, v1::JobState want,
               int64_t timeout_ns);

void CancelJob(v1::JobService::Stub* stub, const std::string& id);

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
  int64_t running_ns() {
    std::lock_guard<std::mutex> l(mu_);
    return running_ns_;
  }
  int64_t failed_ns() {
    std::lock_guard<std::mutex> l(mu_);
    return failed_ns_;
  }
  v1::JobState failed_state() {
    std::lock_guard<std::mutex> l(mu_);
    return failed_state_;
  }
  std::string reason() {
    std::lock_guard<std::mutex> l(mu_);
    return reason_;
  }

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

}  // namespace trainctl::bench
