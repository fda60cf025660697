#include "coordinator/telemetry/telemetry_writer.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

namespace trainctl::coordinator {

TelemetryWriter::TelemetryWriter(EventLoop* loop) : loop_(loop), thread_([this] { Run(); }) {}

TelemetryWriter::~TelemetryWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void TelemetryWriter::Start(Write write, Done done) {
  if (busy_) {
    std::fprintf(stderr, "trainctl: TelemetryWriter::Start while a write is in progress\n");
    std::abort();
  }
  busy_ = true;
  done_ = std::move(done);
  absl::MutexLock lock(&mu_);
  write_ = std::move(write);
}

void TelemetryWriter::Wait() {
  if (!busy_) return;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &TelemetryWriter::Finished));
  }
  Complete();
}

void TelemetryWriter::Complete() {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    // A done posted for a write that Wait already completed.
    if (!result_.has_value()) return;
    status = *std::move(result_);
    result_.reset();
  }
  busy_ = false;
  Done done = std::move(done_);
  done_ = nullptr;
  done(status);
}

void TelemetryWriter::Run() {
  while (true) {
    Write write;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &TelemetryWriter::HasWork));
      // A write started before the stop still runs: it may be committing.
      if (write_ == nullptr) return;
      write = std::move(write_);
      write_ = nullptr;
    }
    absl::Status status = write();
    {
      absl::MutexLock lock(&mu_);
      result_ = std::move(status);
    }
    if (loop_ != nullptr) {
      loop_->Post([this] {
        AssertOnLoop(loop_, "the telemetry writer's done");
        Complete();
      });
    }
  }
}

}  // namespace trainctl::coordinator
