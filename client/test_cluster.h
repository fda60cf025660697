// Test harness for the client library and the CLI: a real coordinator
// in-process on 127.0.0.1:0 with a temporary database, scripted fake
// workers on a loopback channel, and helpers that drive a job's attempt the
// way worker daemons would. Every wait is bounded.
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/cli/cli.h"
#include "coordinator/server/coordinator_server.h"
#include "tests/support/fake_worker.h"
#include "tests/support/ports.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::testing {

// A fresh directory under $TMPDIR (or /tmp; common/temp_dir.h), removed when
// the test process exits.
std::string MakeTempDir();
// Writes `content` to dir/name and returns the path.
std::string WriteFile(const std::string& dir, const std::string& name, const std::string& content);
// UnusedPort(): tests/support/ports.h.

// A valid 2-rank CPU job file's text (classic example, 2 epochs, eval set).
std::string ValidJobYaml(int world_size = 2);

// What one trainctl invocation did.
struct CliRun {
  int code = -1;
  std::string out;
  std::string err;
};
// The environment tests run the CLI in: no process variables, no config
// file, not a terminal.
cli::CliEnvironment TestEnvironment();
CliRun RunTrainctl(const std::vector<std::string>& args,
                   const cli::CliEnvironment& env = TestEnvironment());

class TestCluster {
 public:
  TestCluster();
  ~TestCluster();

  // "127.0.0.1:PORT" of the coordinator; empty when it failed to start.
  const std::string& address() const { return address_; }
  // A channel that sends the coordinator's admin token on every call.
  std::shared_ptr<grpc::Channel> channel() { return channel_; }
  const std::string& admin_token() const { return server_->admin_token(); }
  coordinator::CoordinatorServer& server() { return *server_; }

  // Connects a fake worker "id" with `cpu_slots` CPU slots (host "host-<id>").
  FakeWorker& AddWorker(const std::string& id, int cpu_slots,
                        std::map<std::string, std::string> labels = {});
  // Ends worker `id`'s session cleanly (Goodbye) and forgets it.
  void RemoveWorker(const std::string& id);

  // The id of a job the workers were told to start, other than `except`.
  std::string WaitForStartedJob(const std::string& except = "",
                                absl::Duration timeout = absl::Seconds(10));
  // Drives attempt `attempt` of `job_id`: rendezvous, every rank RUNNING,
  // metrics for `epochs` epochs (train windows and epoch ends with eval),
  // a log line per rank, then every rank SUCCEEDED. Returns false (with a
  // test failure) when a step does not happen in time.
  bool RunAttemptToSuccess(const std::string& job_id, int attempt, int epochs);
  // Brings attempt `attempt` to RUNNING, then fails rank `rank` with exit
  // code 3, message `message` and a last log line.
  bool FailRank(const std::string& job_id, int attempt, int rank, const std::string& message);
  // Sends log lines for one rank of one attempt from the worker that runs it.
  bool SendLogs(const std::string& job_id, int attempt, int rank,
                const std::vector<std::string>& lines);

  // Polls GetJob until the job is in `state`.
  bool WaitState(const std::string& job_id, v1::JobState state,
                 absl::Duration timeout = absl::Seconds(10));

 private:
  struct RankHome {
    FakeWorker* worker;
    int rank;
  };
  // Waits for every worker's StartRanks of the attempt; which worker runs
  // which rank, and who produces the rendezvous.
  bool StartAttempt(const std::string& job_id, int attempt, std::vector<RankHome>* ranks);
  FakeWorker* WorkerOf(const std::string& job_id, int attempt, int rank);

  std::string dir_;
  std::unique_ptr<coordinator::CoordinatorServer> server_;
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  // Fake workers register with this token, over a channel without one.
  std::string worker_token_;
  std::shared_ptr<grpc::Channel> worker_channel_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
};

}  // namespace trainctl::testing
