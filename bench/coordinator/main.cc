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
//
// main.cc parses the flags and dispatches to the scenario of --mode
// (scenario_<mode>.cc, declared in scenarios.h); shared support is in
// bench_support.h (flags, time, /proc, results, job calls), hub.h (the
// simulated workers) and failure_trials.h.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "bench/coordinator/bench_support.h"
#include "bench/coordinator/scenarios.h"
#include "common/auth/secret.h"
#include "common/daemon_flags.h"
#include "trainctl/v1/auth.grpc.pb.h"

int main(int argc, char** argv) {
  trainctl::ParseDaemonFlags(
      argc, argv,
      "trainctl-bench-coordinator --target HOST:PORT --mode "
      "heartbeat|jobs|failure|telemetry|single_worker\n"
      "Load generator for a running trainctl-coordinator (bench/coordinator/run.sh).",
      "bench/coordinator/bench_support.cc");
  signal(SIGPIPE, SIG_IGN);
  using namespace trainctl::bench;
  if (absl::GetFlag(FLAGS_target).empty()) {
    std::cerr << "--target HOST:PORT is required\n";
    return 2;
  }
  absl::StatusOr<std::string> admin =
      trainctl::auth::ReadTokenFile(absl::GetFlag(FLAGS_admin_token_file));
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
    grpc::Status s = trainctl::v1::AuthService::NewStub(
                         MakeChannel(absl::GetFlag(FLAGS_target), -1, g_admin_token))
                         ->CreateToken(&ctx, req, &resp);
    if (!s.ok()) {
      std::cerr << "creating the simulated workers' token: " << s.error_message() << "\n";
      return 1;
    }
    g_worker_token = resp.secret();
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  int rc;
  if (mode == "heartbeat")
    rc = RunHeartbeat();
  else if (mode == "jobs")
    rc = RunJobs();
  else if (mode == "failure")
    rc = RunFailure();
  else if (mode == "telemetry")
    rc = RunTelemetry();
  else if (mode == "single_worker")
    return RunSingleWorker();
  else {
    std::cerr << "unknown --mode " << mode << "\n";
    return 2;
  }
  WriteResults();
  // Skip static destructors racing gRPC's threads.
  std::cout.flush();
  _exit(rc);
}
