// An elastic job's next size (see elastic_size.h).
#include "coordinator/jobs/elastic_size.h"

#include <algorithm>

#include "common/time_util.h"
#include "coordinator/jobs/job_transitions.h"

namespace trainctl::coordinator {

bool IsElastic(const v1::JobSpec& spec) {
  return spec.has_elastic() && spec.elastic().min_ranks() >= 1 &&
         spec.elastic().min_ranks() < spec.world_size();
}

absl::Time ElasticDeadline(const v1::Job& job) {
  if (!IsElastic(job.spec()) || job.attempts_size() == 0) return absl::InfiniteFuture();
  const v1::Attempt& last = job.attempts(job.attempts_size() - 1);
  if (!AttemptEnded(last.state()) || last.grow_to() > 0) return absl::InfiniteFuture();
  return FromTimestamp(last.end_time()) + absl::Seconds(job.spec().elastic().replace_timeout_s());
}

int ElasticMinimum(const v1::Job& job, absl::Time now) {
  if (!IsElastic(job.spec())) return 0;
  const v1::ElasticSpec& el = job.spec().elastic();
  const int world = job.spec().world_size();
  // A first attempt starts with what is free (at least min_ranks).
  if (job.attempts_size() == 0) return el.min_ranks();
  const v1::Attempt& last = job.attempts(job.attempts_size() - 1);
  // Stopped to grow: exactly the size it stopped for (or more).
  if (last.grow_to() > 0) return last.grow_to() >= world ? 0 : last.grow_to();
  // After a failure: the size it ran with until the replace timeout, then
  // what is free down to min_ranks.
  if (now >= ElasticDeadline(job)) return el.min_ranks();
  const int before = std::max(el.min_ranks(), last.ranks_size());
  return before >= world ? 0 : before;
}

}  // namespace trainctl::coordinator
