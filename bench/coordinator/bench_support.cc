// trainctl-bench-coordinator's flags (--help lists the flags defined in this
// file) and the shared support declared in bench_support.h.
#include "bench/coordinator/bench_support.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/auth/secret.h"
#include "common/jobspec/job_spec.h"

ABSL_FLAG(std::string, mode, "heartbeat", "heartbeat | jobs | failure | telemetry | single_worker");
ABSL_FLAG(std::string, target, "", "coordinator host:port");
ABSL_FLAG(std::string, admin_token_file, "",
          "the coordinator's --admin_token_file: jobs go through the admin token, simulated "
          "workers through a worker token made with it");
ABSL_FLAG(int, coord_pid, 0, "coordinator pid (for /proc CPU and RSS)");
ABSL_FLAG(
    int, store_pid, 0,
    "telemetry: the store server's pid (PostgreSQL's postmaster): the CPU and writes of it and "
    "its children are reported beside the coordinator's (0: none, as with SQLite)");
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
ABSL_FLAG(int, trials_under_load, 0,
          "heartbeat: failure-detection trials (stream cut) under the load");
ABSL_FLAG(double, mass_loss_fraction, 0.0,
          "heartbeat: cut this fraction of workers at once at the end");
ABSL_FLAG(int, mass_loss_timeout_s, 90,
          "heartbeat: wait at most this long for the mass loss to be seen");
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
// telemetry
ABSL_FLAG(int, telemetry_jobs, 125, "telemetry: running jobs, each on its own simulated worker");
ABSL_FLAG(int, ranks_per_job, 8, "telemetry: simulated ranks per job");
ABSL_FLAG(int, log_lines_per_s, 10, "telemetry: log lines per rank and second");
ABSL_FLAG(int, drain_s, 10, "telemetry: wait this long after sending stops for the last points");
// single_worker
ABSL_FLAG(std::string, worker_id, "", "single_worker: worker id");
ABSL_FLAG(std::string, slot_kind, "cpu", "single_worker: cpu | gpu");
ABSL_FLAG(int, max_life_s, 120, "single_worker: exit after this long");

namespace trainctl::bench {

// ---------------------------------------------------------------- utilities

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

double ProcTreeCpuSeconds(int pid) {
  double total = ProcCpuSeconds(pid);
  if (total < 0) return -1;
  DIR* d = opendir("/proc");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long child = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || child == pid) continue;
    std::ifstream f(absl::StrCat("/proc/", child, "/stat"));
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t p = s.rfind(')');
    if (p == std::string::npos) continue;
    std::vector<std::string> fields = absl::StrSplit(s.substr(p + 2), ' ');
    // fields[1] is field 4 (ppid).
    if (fields.size() < 13 || fields[1] != absl::StrCat(pid)) continue;
    const double c = ProcCpuSeconds(static_cast<int>(child));
    if (c > 0) total += c;
  }
  closedir(d);
  return total;
}

// Resident set size in KiB, from /proc/PID/status.
int64_t ProcRssKb(int pid) {
  std::ifstream f(pid == 0 ? std::string("/proc/self/status")
                           : absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

namespace {

std::vector<std::pair<std::string, std::string>>& Results() {
  static auto* r = new std::vector<std::pair<std::string, std::string>>();
  return *r;
}

}  // namespace

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

std::map<int, ThreadStat> ThreadStats(int pid) {
  std::map<int, ThreadStat> out;
  std::string dir =
      pid == 0 ? std::string("/proc/self/task") : absl::StrCat("/proc/", pid, "/task");
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
    t.cpu =
        (std::stod(fields[11]) + std::stod(fields[12])) / static_cast<double>(sysconf(_SC_CLK_TCK));
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
    absl::StrAppend(&top, i ? ", " : "", busy[i].second, " ",
                    absl::StrFormat("%.2f", busy[i].first));
  }
  Put(key + ".threads", static_cast<int64_t>(b.size()));
  Put(key + ".top_threads_cores", top);
  Put(key + ".top_thread_cores", busy.empty() ? 0.0 : busy[0].first);
  // Average number of this process's threads that were runnable but waiting
  // for a CPU (other processes on the machine included).
  Put(key + ".runqueue_wait_threads", wait / secs);
}

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

CpuSnap SnapCpu(int coord_pid) { return {ProcCpuSeconds(coord_pid), ProcCpuSeconds(0), NowNs()}; }

// -------------------------------------------------------------- job calls

std::string SubmitSync(v1::JobService::Stub* stub, const v1::JobSpec& spec, int64_t* latency) {
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

v1::JobState GetState(v1::JobService::Stub* stub, const std::string& id, std::string* reason) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::GetJobRequest req;
  req.set_job_id(id);
  v1::Job job;
  if (!stub->GetJob(&ctx, req, &job).ok()) return v1::JOB_STATE_UNSPECIFIED;
  if (reason) *reason = job.state_reason();
  return job.state();
}

bool WaitState(v1::JobService::Stub* stub, const std::string& id, v1::JobState want,
               int64_t timeout_ns) {
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

}  // namespace trainctl::bench
