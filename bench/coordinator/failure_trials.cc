// Failure-detection trials (failure_trials.h): the victims (in-process streams
// or single_worker child processes), their jobs and how long the coordinator
// takes to fail them.
#include "bench/coordinator/failure_trials.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/subprocess.h"

namespace trainctl::bench {
namespace {

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

}  // namespace

// Runs `count` trials, `batch` at a time. process=true: SIGKILLed child
// processes; false: in-process streams cancelled.
void RunFailureTrials(Hub& hub, int count, int batch, bool process, bool cuda,
                      const std::string& tag, FailureStats& st) {
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
        if (pipe2(fds, O_CLOEXEC) != 0) {
          perror("pipe");
          std::exit(1);
        }
        SpawnOptions o;
        o.argv = {exe,
                  "--mode=single_worker",
                  "--target=" + absl::GetFlag(FLAGS_target),
                  "--worker_id=" + id,
                  std::string("--slot_kind=") + (cuda ? "gpu" : "cpu"),
                  absl::StrCat("--heartbeat_ms=", absl::GetFlag(FLAGS_heartbeat_ms)),
                  "--admin_token_file=" + absl::GetFlag(FLAGS_admin_token_file)};
        o.fds = {{1, fds[1]}};
        o.parent_death_signal = SIGKILL;
        absl::StatusOr<Subprocess> child = Subprocess::Spawn(o);
        close(fds[1]);
        if (!child.ok()) {
          std::cerr << child.status() << "\n";
          std::exit(1);
        }
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
          if (m.has_start_ranks() && raw->started_job.empty())
            raw->started_job = m.start_ranks().job_id();
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
    std::sort(plan.begin(), plan.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
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
        for (int64_t t : v->hb_times)
          if (t <= v->cut_ns) v->last_hb_ns = std::max(v->last_hb_ns, t);
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
      if (v->watch->failed_state() == v1::JOB_STATE_FAILED)
        ++st.failed;
      else
        ++st.restarting;
      if (st.sample_reason.empty()) st.sample_reason = v->watch->reason();
    }
    for (const std::string& id : ids) {
      if (GetState(jobs, id) == v1::JOB_STATE_RESTARTING ||
          GetState(jobs, id) == v1::JOB_STATE_PENDING) {
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
  if (!st.sample_reason.empty())
    std::cout << "  (" << key << " reason: " << st.sample_reason << ")\n";
}

}  // namespace trainctl::bench
