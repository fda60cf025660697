#include "coordinator/jobs/command_pass.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace trainctl::coordinator {

absl::StatusOr<scheduler::ScheduleResult> ScheduleWithCommands(
    const std::vector<scheduler::PendingJob>& jobs,
    const absl::flat_hash_set<std::string>& command_jobs,
    std::vector<scheduler::WorkerSlots> workers, const absl::flat_hash_set<std::string>& allowing,
    scheduler::QueueInput queues) {
  std::vector<scheduler::PendingJob> engine, command;
  for (const scheduler::PendingJob& j : jobs)
    (command_jobs.contains(j.job_id) ? command : engine).push_back(j);
  scheduler::ScheduleResult out;
  if (!engine.empty()) {
    TRAINCTL_ASSIGN_OR_RETURN(out, scheduler::Schedule(engine, workers, queues));
  }
  if (command.empty()) return out;
  absl::flat_hash_map<std::string, const scheduler::PendingJob*> engine_by_id;
  for (const scheduler::PendingJob& j : engine) engine_by_id[j.job_id] = &j;
  // Each worker's flavor: a first-pass job on one flavor holds its slots
  // (RunningJob::gpu_flavor) for the second pass's preemption.
  absl::flat_hash_map<std::string, std::string> flavor_of;
  for (const scheduler::WorkerSlots& w : workers) flavor_of[w.worker_id] = w.gpu_flavor;
  std::vector<scheduler::WorkerSlots> cmd_workers;
  for (scheduler::WorkerSlots& w : workers) {
    if (!allowing.contains(w.worker_id)) continue;
    for (const scheduler::Placement& p : out.placements) {
      const scheduler::PendingJob& placed = *engine_by_id.at(p.job_id);
      for (const scheduler::RankAssignment& r : p.ranks) {
        if (r.worker_id != w.worker_id) continue;
        w.free_slots.erase(std::remove(w.free_slots.begin(), w.free_slots.end(), r.slot),
                           w.free_slots.end());
        // The first pass's ranks reserve their CPUs and memory here too,
        // and hold their slots as long as their runtime bound says.
        w.reserved_cpus += placed.cpus;
        w.reserved_memory += placed.memory_bytes;
        w.busy.push_back({1, placed.runtime_bound_s > 0 ? placed.runtime_bound_s
                                                        : std::numeric_limits<double>::infinity()});
      }
    }
    cmd_workers.push_back(std::move(w));
  }
  if (!queues.queues.empty()) {
    std::uint64_t next_seq = 0;
    for (const scheduler::RunningJob& r : queues.running)
      next_seq = std::max(next_seq, r.start_seq + 1);
    for (const scheduler::Placement& p : out.placements) {
      const auto it =
          std::find_if(engine.begin(), engine.end(),
                       [&](const scheduler::PendingJob& j) { return j.job_id == p.job_id; });
      scheduler::RunningJob r;
      r.job_id = p.job_id;
      r.queue = it->queue;
      r.kind = p.kind;
      r.slots = p.world_size;
      for (const scheduler::RankAssignment& rank : p.ranks) {
        const std::string& f = flavor_of[rank.worker_id];
        r.gpu_flavor = rank.rank == 0 || r.gpu_flavor == f ? f : "";
        if (r.gpu_flavor.empty()) break;
      }
      r.cpus = it->cpus;
      r.memory_bytes = it->memory_bytes;
      r.priority = it->priority;
      r.start_seq = next_seq++;
      queues.running.push_back(std::move(r));
    }
    for (const scheduler::Preemption& v : out.preemptions) {
      for (scheduler::RunningJob& r : queues.running) {
        if (r.job_id == v.victim_job_id) r.stopping = true;
      }
    }
  }
  TRAINCTL_ASSIGN_OR_RETURN(scheduler::ScheduleResult second,
                            scheduler::Schedule(command, cmd_workers, queues));
  for (scheduler::Placement& p : second.placements) out.placements.push_back(std::move(p));
  for (scheduler::PendingJobStatus& p : second.pending) {
    p.message = cmd_workers.empty()
                    ? "no worker allows commands (start trainctl-worker with --allow-commands)"
                    : absl::StrCat("on workers that allow commands: ", p.message);
    out.pending.push_back(std::move(p));
  }
  for (scheduler::Preemption& v : second.preemptions) out.preemptions.push_back(std::move(v));
  return out;
}

}  // namespace trainctl::coordinator
