// A scripted worker daemon for coordinator tests: opens a real WorkerService
// Session stream, registers, heartbeats, records what the coordinator
// pushes, and sends whatever the test tells it to.
//
// Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "trainctl/v1/worker_service.grpc.pb.h"

namespace trainctl::testing {

class FakeWorker {
 public:
  // `token`: the worker-role bearer token its Session sends ("" = none;
  // give it a channel that sends none itself).
  FakeWorker(std::shared_ptr<grpc::Channel> channel, std::string id, int cpu_slots,
             absl::Duration heartbeat = absl::Milliseconds(100), std::string token = "");
  ~FakeWorker();

  // Labels sent at the next Connect().
  void set_labels(std::map<std::string, std::string> labels) { labels_ = std::move(labels); }
  // The CPUs, memory and limit enforcement registered at the next Connect()
  // (default: none, as a worker that does not know them).
  void set_allocatable(v1::Allocatable allocatable) { allocatable_ = std::move(allocatable); }
  // The address registered at the next Connect() (default 127.0.0.1).
  void set_address(std::string address) { address_ = std::move(address); }
  // Registers its slots as GPUs of this name and flavor at the next
  // Connect() (default: CPU slots).
  void set_gpus(std::string name, std::string flavor) {
    gpu_name_ = std::move(name);
    gpu_flavor_ = std::move(flavor);
  }
  // Whether it registers as running command jobs (Register.allow_commands).
  void set_allow_commands(bool allow) { allow_commands_ = allow; }
  // Opens the session and registers; true when the coordinator acknowledged.
  bool Connect(std::vector<v1::RunningRank> running = {});
  // Stops heartbeating and cuts the stream, as a crashed daemon would.
  void Crash();
  // Cleanly ends the session (Goodbye).
  void Leave();

  bool Send(const v1::WorkerMessage& msg);
  bool SendStatus(const std::string& job, int attempt, int rank, v1::RankState state,
                  v1::FailureKind kind = v1::FAILURE_KIND_UNSPECIFIED, int exit_code = 0);

  // Waits for the first received message (from index `from`) matching pred.
  std::optional<v1::CoordinatorMessage> WaitFor(
      const std::function<bool(const v1::CoordinatorMessage&)>& pred,
      absl::Duration timeout = absl::Seconds(10), size_t from = 0);
  size_t received_count();
  // The status the stream ended with, once it ended.
  std::optional<grpc::Status> ended();

  const std::string& id() const { return id_; }

 private:
  void ReadLoop();
  void StopThreads();

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::string id_;
  std::map<std::string, std::string> labels_;
  v1::Allocatable allocatable_;
  std::string address_ = "127.0.0.1";
  bool allow_commands_ = false;
  std::string gpu_name_, gpu_flavor_;
  int slots_;
  absl::Duration heartbeat_;
  std::string token_;

  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream_;
  absl::Mutex write_mu_;
  std::thread reader_;
  std::thread heartbeater_;
  std::atomic<bool> stop_{false};

  absl::Mutex mu_;
  std::vector<v1::CoordinatorMessage> received_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> ended_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainctl::testing
