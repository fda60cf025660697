// The size of an elastic job's next attempt (docs/elastic.md): how few
// ranks it may start with, and when that changes by itself.
#pragma once

#include "absl/time/time.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::coordinator {

// Whether `spec` may run with fewer ranks than world_size.
bool IsElastic(const v1::JobSpec& spec);
// Elastic jobs: the fewest ranks the next attempt of `job` may start with
// now (scheduler::PendingJob::min_world_size; 0 = exactly world_size), and
// when that changes by itself (a replace timeout runs out;
// absl::InfiniteFuture() when it does not).
int ElasticMinimum(const v1::Job& job, absl::Time now);
absl::Time ElasticDeadline(const v1::Job& job);

}  // namespace trainctl::coordinator
