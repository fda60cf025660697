// The Python stacks a hung command job's ranks dump when the worker stops
// them (faulthandler on SIGUSR1, registered by the ranks' start-up hook;
// docs/failures.md#hangs-in-your-own-script-command-jobs). They arrive as
// the ranks' stderr log lines after the attempt failed as HANG; the
// coordinator keeps each rank's dump until the rank's end is reported and
// then records it as the job's `stacks` event, beside the `hang` event.
//
// Memory only, bounded per rank. Not thread-safe: owned by TelemetryIngest,
// on the coordinator's loop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace trainctl::coordinator {

class StackDumps {
 public:
  // At most this many lines (and kMaxBytes) of one rank's dump are kept.
  static constexpr size_t kMaxLines = 120;
  static constexpr size_t kMaxBytes = 16 << 10;

  // A stderr line of `rank` of the attempt (`job_id`, `attempt`) that failed
  // as hung: kept when it belongs to faulthandler's dump ("Thread 0x…",
  // "Current thread 0x…", its "  File …" frames and the blank lines between).
  void OnLine(const std::string& job_id, int32_t attempt, int32_t rank, absl::string_view line);
  // The rank's dump (empty: none seen), forgotten.
  std::vector<std::string> Take(const std::string& job_id, int32_t attempt, int32_t rank);

 private:
  struct Dump {
    std::vector<std::string> lines;
    size_t bytes = 0;
    bool in_dump = false;  // the last line read was part of a dump
  };
  absl::flat_hash_map<std::string, Dump> dumps_;
};

}  // namespace trainctl::coordinator
