// --mode=single_worker: one scripted worker that prints REG/HB/START lines on
// stdout, for the parent of --mode=failure (failure_trials.cc).
#include <unistd.h>

#include <mutex>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "bench/coordinator/hub.h"
#include "bench/coordinator/scenarios.h"

namespace trainctl::bench {

int RunSingleWorker() {
  const int64_t hb_ns = int64_t{absl::GetFlag(FLAGS_heartbeat_ms)} * 1000000;
  std::mutex out_mu;
  auto line = [&](const std::string& s) {
    std::lock_guard<std::mutex> l(out_mu);
    std::string t = s + "\n";
    (void)!write(1, t.data(), t.size());
  };
  Hub hub(absl::GetFlag(FLAGS_target), 1, hb_ns);
  SimWorker w(&hub, 0, absl::GetFlag(FLAGS_worker_id),
              absl::GetFlag(FLAGS_slot_kind) == "gpu" ? v1::Slot::KIND_GPU : v1::Slot::KIND_CPU, 1);
  w.listener = [&](SimWorker* self, const v1::CoordinatorMessage& m, int64_t) {
    if (m.has_register_ack()) line("REG " + m.register_ack().worker_id());
    if (m.has_start_ranks()) line("START " + m.start_ranks().job_id());
  };
  w.on_heartbeat = [&](int64_t t) { line(absl::StrCat("HB ", t)); };
  w.Start();
  w.WaitDone(int64_t{absl::GetFlag(FLAGS_max_life_s)} * 1000000000);
  hub.StopTicker();
  w.Cancel();
  w.WaitDone(int64_t{5} * 1000000000);
  return 0;
}

}  // namespace trainctl::bench
