// Submits a job.yaml and follows it to the end with the trainctl client
// library: the smallest complete program against the public API.
//
//   trainctl-example-submit job.yaml [coordinator host:port]
//
// Exits 0 when the job SUCCEEDED, 1 otherwise, 2 when the file is invalid.
#include <iostream>

#include "trainctl/client.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: " << argv[0] << " job.yaml [host:port]\n";
    return 2;
  }
  trainctl::ClientOptions options;
  if (argc == 3) options.address = argv[2];

  absl::StatusOr<std::unique_ptr<trainctl::Client>> client = trainctl::Client::Connect(options);
  if (!client.ok()) {
    std::cerr << client.status().message() << "\n";
    return 1;
  }
  // Validated locally first: every problem comes back, one per line.
  absl::StatusOr<trainctl::v1::Job> job = (*client)->SubmitFile(argv[1]);
  if (!job.ok()) {
    std::cerr << job.status().message() << "\n";
    return job.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::cout << "submitted " << job->id() << "\n";

  absl::StatusOr<trainctl::v1::Job> done = (*client)->Watch(
      job->id(), /*include_history=*/true, [](const trainctl::v1::JobUpdate& update) {
        if (update.has_event()) {
          std::cout << update.event().type() << ": " << update.event().message() << "\n";
        } else if (update.has_metrics()) {
          for (const trainctl::v1::MetricPoint& p : update.metrics().points()) {
            if (p.kind() == trainctl::v1::MetricPoint::KIND_TRAIN && p.rank() == 0) {
              std::cout << "  epoch " << p.epoch() << " step " << p.step() << " loss " << p.loss()
                        << "\n";
            }
          }
        }
        return true;  // Keep watching until the job ends.
      });
  if (!done.ok()) {
    std::cerr << done.status().message() << "\n";
    return 1;
  }
  std::cout << trainctl::v1::JobState_Name(done->state());
  if (!done->state_reason().empty()) std::cout << ": " << done->state_reason();
  std::cout << "\n";
  return done->state() == trainctl::v1::JOB_STATE_SUCCEEDED ? 0 : 1;
}
