// `trainctl workers`: the worker daemons, their slots, limits and health.
#include <algorithm>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/context.h"
#include "client/cli/format.h"
#include "common/format_bytes.h"

namespace trainctl::cli {
namespace {

std::string SlotsText(const v1::Worker& w) {
  int gpus = 0, cpus = 0;
  std::string gpu_name;
  for (const v1::Slot& s : w.slots()) {
    if (s.kind() == v1::Slot::KIND_GPU) {
      ++gpus;
      if (gpu_name.empty()) gpu_name = s.name();
    } else {
      ++cpus;
    }
  }
  std::vector<std::string> parts;
  if (gpus > 0)
    parts.push_back(
        absl::StrCat(gpus, " gpu", gpu_name.empty() ? "" : absl::StrCat(" (", gpu_name, ")")));
  if (cpus > 0) parts.push_back(absl::StrCat(cpus, " cpu"));
  return parts.empty() ? "-" : absl::StrJoin(parts, ", ");
}

// Its GPU slots' flavors (Slot.flavor), in slot order without repeats;
// "-" for CPU slots. A job asking for a flavor runs here only when every
// GPU slot has it (a mixed host has none as far as placement goes).
std::string FlavorText(const v1::Worker& w) {
  std::vector<std::string> flavors;
  for (const v1::Slot& s : w.slots()) {
    if (s.kind() != v1::Slot::KIND_GPU) continue;
    const std::string f = s.flavor().empty() ? "(none)" : s.flavor();
    if (std::find(flavors.begin(), flavors.end(), f) == flavors.end()) flavors.push_back(f);
  }
  return flavors.empty() ? "-" : absl::StrJoin(flavors, ",");
}

// What its ranks may use together, as the worker reported: "-" where it
// does not know (0), as the scheduler counts it (unbounded).
std::string CpusText(const v1::Worker& w) {
  return w.allocatable().cpus() > 0 ? absl::StrCat(w.allocatable().cpus()) : "-";
}
std::string MemoryText(const v1::Worker& w) {
  return w.allocatable().memory_bytes() > 0 ? FormatBytes(w.allocatable().memory_bytes()) : "-";
}

std::string LabelsText(const v1::Worker& w) {
  std::map<std::string, std::string> sorted(w.labels().begin(), w.labels().end());
  std::vector<std::string> parts;
  for (const auto& [k, v] : sorted) parts.push_back(absl::StrCat(k, "=", v));
  return parts.empty() ? "-" : absl::StrJoin(parts, ",");
}

int RunWorkers(CliContext& ctx, bool all) {
  return ConnectCallPrint(
      ctx, [&](Client& client) { return client.ListWorkers(all); },
      [&](v1::ListWorkersResponse& resp) -> int {
        if (ctx.json()) {
          ctx.PrintJson(resp);
          return kExitOk;
        }
        absl::Time now = absl::Now();
        if (const v1::StoreHealth& store = resp.store(); store.failing()) {
          // A header above the table: the workers below stay connected meanwhile.
          ctx.out << "coordinator store FAILING (began " << Age(store.failing_since(), now)
                  << "): " << store.failed_writes() << " writes failed (" << store.last_error()
                  << "); telemetry waits, job changes are retried\n";
        }
        const auto& workers = resp.workers();
        if (workers.empty()) {
          ctx.out << (all ? "no workers\n" : "no live workers (--all shows lost and left ones)\n");
          return kExitOk;
        }
        // FLAVOR: its GPUs' flavors (resources.gpu_flavor); CPUS, MEMORY: allocatable for ranks;
        // LIMITS: whether it enforces a job's `resources` (a job with limits is placed only where
        // it does).
        Table t({"ID", "HOST", "ADDRESS", "STATE", "SLOTS", "FLAVOR", "BUSY", "CPUS", "MEMORY",
                 "LIMITS", "LABELS", "HEARTBEAT", "VERSION"});
        for (const v1::Worker& w : workers) {
          std::string address = w.address().empty() ? "-" : w.address();
          if (!w.address_refused().empty()) absl::StrAppend(&address, " (refused)");
          t.AddRow({w.id(), w.hostname(), address, WorkerStateName(w.state()), SlotsText(w),
                    FlavorText(w), absl::StrCat(w.busy_slots_size(), "/", w.slots_size()),
                    CpusText(w), MemoryText(w), w.allocatable().enforces_limits() ? "yes" : "no",
                    LabelsText(w), Age(w.last_heartbeat_time(), now),
                    w.version().empty() ? "-" : w.version()});
        }
        t.Print(ctx.out);
        for (const v1::Worker& w : workers) {
          if (!w.address_refused().empty()) {
            ctx.out << "worker " << w.id() << ": address refused: " << w.address_refused() << "\n";
          }
          if (!w.allocatable().enforces_limits() && !w.allocatable().limits_off_reason().empty()) {
            ctx.out << "worker " << w.id() << ": LIMITS no: " << w.allocatable().limits_off_reason()
                    << "\n";
          }
        }
        return kExitOk;
      });
}

}  // namespace

VerbRunner AddWorkersVerb(CLI::App& app, CliContext& ctx) {
  auto all = std::make_shared<bool>(false);
  CLI::App* sub = AddVerb(app, "workers", "List the worker daemons and their slots",
                          "  trainctl workers --all\n");
  sub->add_flag("--all", *all, "Include LOST and LEFT workers");
  return [&ctx, all] { return RunWorkers(ctx, *all); };
}

}  // namespace trainctl::cli
