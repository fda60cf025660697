#include "coordinator/jobs/job_owners.h"

namespace trainctl::coordinator {

JobOwners::JobOwners(StateStore* store, WorkerRegistry* registry, MetricsHub* hub,
                     const Clock* clock, const JobManagerOptions& options)
    : book(store, hub, clock),
      owner_numbers(store),
      manager(store, registry, clock, options,
              {&book, &owner_numbers, &starter, &placer, &ingest, &health}),
      starter(&book, registry, manager.actions(), &owner_numbers,
              {options.preflight, options.stop_grace}),
      placer(&book, registry, &starter, clock, options.placer, store),
      ingest(&book, store, hub, clock, options.rank_watch),
      health(&book, registry, manager.actions(),
             {options.progress_timeout, options.rendezvous_timeout}),
      queries(&book, registry, &placer, &health, store, clock) {}

JobGauges JobOwners::Gauges() const {
  JobGauges g = queries.Gauges();
  g.stale_reports_refused = manager.stale_reports_refused();
  return g;
}

}  // namespace trainctl::coordinator
