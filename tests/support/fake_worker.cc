#include "tests/support/fake_worker.h"

namespace trainctl::testing {

FakeWorker::FakeWorker(std::shared_ptr<grpc::Channel> channel, std::string id, int cpu_slots,
                       absl::Duration heartbeat, std::string token)
    : channel_(std::move(channel)),
      stub_(v1::WorkerService::NewStub(channel_)),
      id_(std::move(id)),
      slots_(cpu_slots),
      heartbeat_(heartbeat),
      token_(std::move(token)) {}

FakeWorker::~FakeWorker() { Crash(); }

bool FakeWorker::Connect(std::vector<v1::RunningRank> running) {
  StopThreads();
  stop_ = false;
  {
    absl::MutexLock lock(&mu_);
    received_.clear();
    ended_.reset();
  }
  ctx_ = std::make_unique<grpc::ClientContext>();
  if (!token_.empty()) ctx_->AddMetadata("authorization", "Bearer " + token_);
  stream_ = stub_->Session(ctx_.get());
  v1::WorkerMessage reg;
  v1::Register* r = reg.mutable_register_();
  r->set_worker_id(id_);
  r->set_hostname("host-" + id_);
  r->set_address(address_);
  r->set_allow_commands(allow_commands_);
  r->mutable_labels()->insert(labels_.begin(), labels_.end());
  *r->mutable_allocatable() = allocatable_;
  for (int i = 0; i < slots_; ++i) {
    v1::Slot* s = r->add_slots();
    s->set_kind(gpu_name_.empty() ? v1::Slot::KIND_CPU : v1::Slot::KIND_GPU);
    s->set_index(i);
    if (!gpu_name_.empty()) {
      s->set_name(gpu_name_);
      s->set_flavor(gpu_flavor_);
    }
  }
  for (auto& rr : running) *r->add_running() = rr;
  if (!Send(reg)) return false;
  reader_ = std::thread([this] { ReadLoop(); });
  auto ack = WaitFor([](const v1::CoordinatorMessage& m) { return m.has_register_ack(); });
  if (!ack) return false;
  heartbeater_ = std::thread([this] {
    int64_t seq = 0;
    while (!stop_) {
      v1::WorkerMessage hb;
      hb.mutable_heartbeat()->set_seq(++seq);
      Send(hb);
      absl::SleepFor(heartbeat_);
    }
  });
  return true;
}

void FakeWorker::StopThreads() {
  stop_ = true;
  if (heartbeater_.joinable()) heartbeater_.join();
  if (ctx_) ctx_->TryCancel();
  if (reader_.joinable()) reader_.join();
}

void FakeWorker::Crash() { StopThreads(); }

void FakeWorker::Leave() {
  v1::WorkerMessage bye;
  bye.mutable_goodbye()->set_reason("test");
  Send(bye);
  {
    absl::MutexLock lock(&write_mu_);
    if (stream_) stream_->WritesDone();
  }
  stop_ = true;
  if (heartbeater_.joinable()) heartbeater_.join();
  if (reader_.joinable()) reader_.join();
}

bool FakeWorker::Send(const v1::WorkerMessage& msg) {
  absl::MutexLock lock(&write_mu_);
  return stream_ != nullptr && stream_->Write(msg);
}

bool FakeWorker::SendStatus(const std::string& job, int attempt, int rank, v1::RankState state,
                            v1::FailureKind kind, int exit_code) {
  v1::WorkerMessage m;
  v1::RankStatus* s = m.mutable_rank_status();
  s->set_job_id(job);
  s->set_attempt(attempt);
  s->set_rank(rank);
  s->set_state(state);
  if (kind != v1::FAILURE_KIND_UNSPECIFIED) {
    s->mutable_exit()->set_kind(kind);
    s->mutable_exit()->set_exit_code(exit_code);
  }
  return Send(m);
}

void FakeWorker::ReadLoop() {
  v1::CoordinatorMessage m;
  while (stream_->Read(&m)) {
    if (m.has_preflight()) {
      // A stand-in for a worker whose checks all pass.
      v1::WorkerMessage rep;
      rep.mutable_preflight()->set_job_id(m.preflight().job_id());
      rep.mutable_preflight()->set_attempt(m.preflight().attempt());
      Send(rep);
    }
    absl::MutexLock lock(&mu_);
    received_.push_back(m);
  }
  grpc::Status s = stream_->Finish();
  absl::MutexLock lock(&mu_);
  ended_ = s;
}

std::optional<v1::CoordinatorMessage> FakeWorker::WaitFor(
    const std::function<bool(const v1::CoordinatorMessage&)>& pred, absl::Duration timeout,
    size_t from) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = from; i < received_.size(); ++i) {
        if (pred(received_[i])) return received_[i];
      }
      if (ended_.has_value()) return std::nullopt;  // Nothing more will come.
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return std::nullopt;
}

size_t FakeWorker::received_count() {
  absl::MutexLock lock(&mu_);
  return received_.size();
}

std::optional<grpc::Status> FakeWorker::ended() {
  absl::MutexLock lock(&mu_);
  return ended_;
}

}  // namespace trainctl::testing
