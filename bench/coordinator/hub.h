// The simulated worker daemons: a Hub owns the channels they share and the
// timer threads that send every heartbeat; a SimWorker is one daemon's
// WorkerService.Session stream on the gRPC callback API.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/coordinator/bench_support.h"
#include "trainctl/v1/job_service.grpc.pb.h"
#include "trainctl/v1/worker_service.grpc.pb.h"

namespace trainctl::bench {

class SimWorker;

// Owns the channels and the one timer thread that sends every heartbeat.
class Hub {
 public:
  Hub(const std::string& target, int channels, int64_t heartbeat_ns);
  ~Hub() { StopTicker(); }

  void StopTicker();

  v1::WorkerService::Stub* stub(int i) { return stubs_[i % stubs_.size()].get(); }
  v1::JobService::Stub* jobs() { return jobs_.get(); }
  v1::WorkerService::Stub* workers_stub() { return workers_stub_.get(); }
  int64_t heartbeat_ns() const { return heartbeat_ns_; }

  void ScheduleHeartbeat(SimWorker* w, int index, int64_t at) {
    Shard& sh = *shards_[static_cast<size_t>(index) % shards_.size()];
    {
      std::lock_guard<std::mutex> l(sh.mu);
      sh.heap.push({at, w});
    }
    sh.cv.notify_one();
  }

  Recorder rtt;           // heartbeat → heartbeat_ack
  Recorder lateness;      // ticker: actual send − planned send
  Recorder register_lat;  // register sent → register_ack
  std::atomic<int64_t> heartbeats_sent{0};
  std::atomic<int64_t> acks{0};
  std::atomic<int64_t> registered{0};
  std::atomic<int64_t> ended{0};  // streams that ended (any reason)
  // HeartbeatAcks that carried new terms (the coordinator bounds the
  // fleet's heartbeats a second: --max-heartbeats-per-sec).
  std::atomic<int64_t> terms_changed{0};

 private:
  struct Ev {
    int64_t t;
    SimWorker* w;
    bool operator>(const Ev& o) const { return t > o.t; }
  };
  struct Shard {
    std::mutex mu;
    std::condition_variable cv;
    std::priority_queue<Ev, std::vector<Ev>, std::greater<Ev>> heap;
    bool stop = false;
    std::thread thread;
  };
  void TickLoop(Shard& sh);

  int64_t heartbeat_ns_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> stubs_;
  std::shared_ptr<grpc::Channel> job_channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_stub_;
  std::vector<std::unique_ptr<Shard>> shards_;
};

// One simulated worker daemon: a Session stream with at most one write in
// flight (later messages queue), one read always pending.
class SimWorker : public grpc::ClientBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
 public:
  using Listener = std::function<void(SimWorker*, const v1::CoordinatorMessage&, int64_t)>;

  SimWorker(Hub* hub, int index, std::string id, v1::Slot::Kind kind, int slots)
      : hub_(hub), index_(index), id_(std::move(id)), kind_(kind), slots_(slots) {}

  // Drive assigned ranks like a daemon whose ranks start instantly: report the
  // rendezvous (rank-0 side) and, once it is delivered, RUNNING.
  bool auto_run = true;
  // Called on the gRPC thread for every message received (after auto-run).
  Listener listener;
  // Called on the timer thread after each heartbeat was handed to gRPC.
  std::function<void(int64_t)> on_heartbeat;

  // Opens the Session stream and sends Register.
  void Start();

  // Writes `m`, or queues it behind the write in flight; false once the stream
  // is stopping.
  bool Send(v1::WorkerMessage m);

  bool SendStatus(const std::string& job, int attempt, int rank, v1::RankState state) {
    v1::WorkerMessage m;
    v1::RankStatus* s = m.mutable_rank_status();
    s->set_job_id(job);
    s->set_attempt(attempt);
    s->set_rank(rank);
    s->set_state(state);
    return Send(std::move(m));
  }

  // Timer thread: sends the next heartbeat; false once the stream is over.
  bool Heartbeat(int64_t planned);

  // Cuts the stream as a crashed daemon's would be.
  void Cancel() { ctx_.TryCancel(); }

  // Per running rank: one metric point (stamped with the wall clock) and a
  // chunk of `log_lines` lines, each message sequenced like the daemon's.
  void SendTelemetry(int log_lines);
  std::atomic<int64_t> points_sent{0};
  std::atomic<int64_t> lines_sent{0};

  bool WaitDone(int64_t timeout_ns) {
    std::unique_lock<std::mutex> l(mu_);
    return done_cv_.wait_for(l, std::chrono::nanoseconds(timeout_ns), [this] { return done_; });
  }
  bool done() {
    std::lock_guard<std::mutex> l(mu_);
    return done_;
  }
  std::string assigned_id() {
    std::lock_guard<std::mutex> l(mu_);
    return assigned_id_;
  }
  grpc::Status status() {
    std::lock_guard<std::mutex> l(mu_);
    return status_;
  }

  std::atomic<int64_t> register_sent_ns{0};
  std::atomic<int64_t> register_ack_ns{0};
  std::atomic<int64_t> last_hb_sent_ns{0};

  // gRPC reactions.
  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;

  void OnDone(const grpc::Status& s) override {
    hub_->ended++;
    std::lock_guard<std::mutex> l(mu_);
    status_ = s;
    done_ = true;
    done_cv_.notify_all();
  }

  std::atomic<int64_t> hb_interval_ns{0};

 private:
  static constexpr int kRing = 16;

  void StopLocked(std::unique_lock<std::mutex>& l) {
    stopping_ = true;
    if (!writing_) ReleaseLocked(l);
  }
  void ReleaseLocked(std::unique_lock<std::mutex>& l) {
    if (released_) return;
    released_ = true;
    l.unlock();
    RemoveHold();
  }

  Hub* hub_;
  int index_;
  std::string id_;
  v1::Slot::Kind kind_;
  int slots_;
  grpc::ClientContext ctx_;
  v1::CoordinatorMessage in_;

  std::mutex mu_;
  std::condition_variable done_cv_;
  std::deque<v1::WorkerMessage> queue_;
  v1::WorkerMessage current_;
  bool writing_ = false;
  bool stopping_ = false;
  bool released_ = false;
  bool read_done_ = false;
  bool done_ = false;
  grpc::Status status_;
  std::string assigned_id_;
  std::map<std::string, std::vector<int>> my_ranks_;
  // Jobs whose ranks this worker reported RUNNING: attempt and ranks.
  std::map<std::string, std::pair<int, std::vector<int>>> running_;
  int64_t steps_ = 0;          // timer thread only
  int64_t telemetry_seq_ = 0;  // timer thread only

  std::atomic<int64_t> seq_{0};
  std::atomic<int64_t> sent_ns_[kRing] = {};
  std::atomic<int64_t> sent_seq_[kRing] = {};
};

}  // namespace trainctl::bench
