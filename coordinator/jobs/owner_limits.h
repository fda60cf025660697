// Per-owner limits of a queue (docs/queues.md "Per-owner limits"; Slurm's
// MaxJobsPerUser and a per-user GrpTRES): the most jobs one owner may have
// running in a queue, and the most slots they may hold there. The placer
// asks before each scheduling pass which pending jobs may enter it: a job
// whose owner is at a limit stays pending, saying which; one that may
// enter is counted at once, so two jobs of one owner cannot both pass the
// last place in the same pass.
//
// Loop-only value type (built per pass); not thread-safe.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "coordinator/scheduler/scheduler.h"

namespace trainctl::coordinator {

class OwnerLimits {
 public:
  // The queues' limits (only those with one matter).
  explicit OwnerLimits(const std::vector<scheduler::QueueSpec>& queues);

  // True when no queue has a per-owner limit (nothing to count).
  bool empty() const { return limits_.empty(); }

  // A job of `owner` in `queue` runs now holding `slots` slots.
  void AddRunning(const std::string& queue, const std::string& owner, int slots);

  // "" when a job of `owner` asking for `slots` slots in `queue` may enter
  // this pass (then it is counted as running); otherwise why it waits.
  std::string Admit(const std::string& queue, const std::string& owner, int slots);

 private:
  struct Limit {
    int jobs = 0;
    int slots = 0;
  };
  struct Load {
    int jobs = 0;
    int slots = 0;
  };
  absl::flat_hash_map<std::string, Limit> limits_;
  absl::flat_hash_map<std::pair<std::string, std::string>, Load> loads_;
};

}  // namespace trainctl::coordinator
