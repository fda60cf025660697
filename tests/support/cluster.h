// A real trainctl cluster on loopback for end-to-end tests: the
// trainctl-coordinator binary and trainctl-worker daemons as child
// processes (each can be SIGKILLed and restarted), plus a JobService stub.
// Ports are chosen by the kernel (port 0); every wait is bounded.
//
// Not thread-safe: use from the test's thread.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/subprocess.h"
#include "trainctl/v1/auth.grpc.pb.h"
#include "trainctl/v1/job_service.grpc.pb.h"
#include "trainctl/v1/worker_service.grpc.pb.h"

namespace trainctl::testing {

// A child process with its stdout+stderr in a file (common/subprocess.h).
class Process {
 public:
  // `cwd`: the child's working directory (empty: the test's).
  Process(std::vector<std::string> argv, std::string log_path, std::string cwd = "");
  ~Process();
  bool Start();
  void Kill(int sig);
  // Waits for exit; returns the raw wait status, or -1 on timeout.
  int Wait(absl::Duration timeout);
  bool running();
  pid_t pid() const { return process_.pid(); }
  const std::string& log_path() const { return log_path_; }
  std::string ReadLog() const;

 private:
  std::vector<std::string> argv_;
  std::string log_path_;
  std::string cwd_;
  Subprocess process_;
};

class Cluster {
 public:
  // `build_dir` holds the binaries (coordinator/, worker/daemon/); `rank_binary`
  // is what workers launch.
  Cluster(std::string build_dir, std::string rank_binary);
  ~Cluster();

  // Runs `trainctl-coordinator init` into dir()/tls (CA, certificate, tokens)
  // and from then on serves TLS: the coordinator gets --tls_dir, workers
  // --ca, and jobs()/workers_stub() verify the server with the CA.
  bool InitTls();
  // The CA file clients must trust ("" without TLS).
  std::string ca_file() const { return tls_dir_.empty() ? "" : tls_dir_ + "/ca.crt"; }
  // Starts (or restarts, on the same port and database) the coordinator.
  bool StartCoordinator(std::vector<std::string> extra_flags = {});
  void KillCoordinator(int sig = 9);
  // From now on jobs()/workers_stub() (and the next StartWorker) talk to
  // `address`: another coordinator of the same store (HA tests).
  void UseCoordinatorAt(const std::string& address);
  // Starts worker `name` (its work dir persists across restarts).
  // `relative_paths`: the daemon runs in the cluster's directory and gets
  // its --work_dir and --rank_binary relative to it (as typed by hand).
  // `extra_flags` are appended to the daemon's command line (with
  // --token_file, --join_token* or --cert it gets no worker token of its own).
  bool StartWorker(const std::string& name, int slots = 1, bool relative_paths = false,
                   const std::vector<std::string>& extra_flags = {});
  void KillWorker(const std::string& name, int sig = 9);
  // Words put before the coordinator's and workers' command lines from the
  // next start on (e.g. {"/usr/bin/env", "LD_PRELOAD=..."}: libfaketime); {} = none.
  void set_command_prefix(std::vector<std::string> prefix) { prefix_ = std::move(prefix); }
  Process* worker(const std::string& name) { return workers_[name].get(); }
  Process* coordinator() { return coordinator_.get(); }

  // Waits until `n` workers are ALIVE.
  bool WaitWorkers(int n, absl::Duration timeout = absl::Seconds(15));
  // Every call of jobs()/workers_stub() carries the bootstrap admin token
  // (read from the coordinator's --admin_token_file in dir()).
  const std::string& admin_token() const { return admin_token_; }
  // The file holding it: for a CLI's --token-file (a token on a command line
  // is readable by every user of the host).
  std::string AdminTokenFile() const { return dir_ + "/admin.token"; }
  // A new token with `role` (secret), created through AuthService; "" on failure.
  std::string CreateToken(v1::Role role, const std::string& name, int64_t ttl_s = 0);
  // The worker token `name` uses (created at its first StartWorker; kept for restarts).
  std::string WorkerTokenFile(const std::string& name) const {
    return dir_ + "/worker-" + name + ".token";
  }
  v1::JobService::Stub* jobs() { return jobs_.get(); }
  v1::WorkerService::Stub* workers_stub() { return workers_stub_.get(); }
  const std::string& address() const { return address_; }
  const std::string& dir() const { return dir_; }

  // Submits and returns the job id ("" on failure; the test fails).
  std::string Submit(const v1::JobSpec& spec);
  // The same, answering the call's status (a refusal is no test failure);
  // the id goes to `*id` when it is OK.
  grpc::Status TrySubmit(const v1::JobSpec& spec, std::string* id = nullptr);
  // Submits as the holder of `token` (another owner than the admin) over
  // this cluster's transport (TLS with its CA once InitTls ran).
  grpc::Status SubmitAs(const std::string& token, const v1::JobSpec& spec, std::string* id);
  // Polls GetJob until the state is `want` (or the job ends in another terminal state).
  v1::Job WaitState(const std::string& id, v1::JobState want,
                    absl::Duration timeout = absl::Seconds(60));
  v1::Job Get(const std::string& id);
  // Polls GetJob every 25 ms until `done` holds or `timeout` passes; returns the last view.
  v1::Job WaitFor(const std::string& id, const std::function<bool(const v1::Job&)>& done,
                  absl::Duration timeout = absl::Seconds(90));
  // The stored log lines of `rank` of `attempt`, one per line.
  std::string RankLog(const std::string& id, int attempt, int rank);
  // The job's stored events so far, oldest first.
  std::vector<v1::Event> Events(const std::string& id);
  // Follows the job's WatchJob stream from its history until the stream
  // ends (the job finished) or `timeout` passes, calling `on_update` for each
  // update; returns the stream's status (DEADLINE_EXCEEDED when the job did
  // not end in time).
  grpc::Status Follow(const std::string& id, absl::Duration timeout,
                      const std::function<void(const v1::JobUpdate&)>& on_update);
  // Pids of live processes whose command line contains `needle`.
  static std::vector<pid_t> ProcessesMatching(const std::string& needle);

 private:
  void Connect();

  std::string build_dir_, rank_binary_, dir_, address_;
  std::unique_ptr<Process> coordinator_;
  std::map<std::string, std::unique_ptr<Process>> workers_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_stub_;
  std::unique_ptr<v1::AuthService::Stub> auth_stub_;
  std::string admin_token_;
  std::string tls_dir_;
  int restarts_ = 0;
  std::vector<std::string> prefix_;
};

// The build directory of the running test binary (its parent's parent when
// it sits in build/<component>/).
std::string BuildDirOfThisTest();

}  // namespace trainctl::testing
