// A coordinator of a PostgreSQL store that another coordinator holds waits
// here as a standby until it takes the store's lock (docs/operator.md,
// "High availability").
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/server/coordinator_server.h"
#include "coordinator/store/state_store.h"

namespace trainctl::coordinator {

// Serves as a standby (StandbyServer) on o.listen until this process takes
// the store's lock, trying every `poll`; then stops it and returns the
// opened store (its epoch taken, o.listen's port the one bound, and
// o.store.leader_address set: `advertise_address`, else o.listen's host, or
// this host's name for a wildcard one, with the bound port). CANCELLED when
// a stop signal came first; another error when the store refuses this
// coordinator for good (not a trainctl database, a newer schema, a bad URI).
absl::StatusOr<std::unique_ptr<StateStore>> AwaitLeadership(CoordinatorOptions& o,
                                                            absl::Duration poll,
                                                            const std::string& advertise_address);

}  // namespace trainctl::coordinator
