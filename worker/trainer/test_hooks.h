// Test hooks that end-to-end tests set through a worker daemon's
// environment (its ranks inherit it); never set them in production.
//
// TRAINCTL_TEST_PHASE_SLEEP=PHASE:MS[,PHASE:MS...] makes a rank sleep MS
// milliseconds (0-600000) inside PHASE, after saying so on its log
// ("test hook: sleeping MS ms in PHASE"), so that a test can stop the rank
// there (SIGSTOP) or make the phase outlast the hang bound while the
// rank's heartbeat thread keeps running:
//   checkpoint   in every checkpoint write, before the file is written (a
//                slow filesystem); checkpoint writers only
//   eval         in every evaluation, before its collectives
//   epoch_start  at the start of every epoch but the attempt's first: after
//                the previous epoch's end and checkpoint, before the first
//                step (the sampler and loader of the next epoch)
//   resume       between the broadcasts of the resume checkpoint's size and
//                of its bytes (every rank of a resuming attempt)
// Malformed entries are ignored. Threading: any thread (parsed once).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/strings/string_view.h"

namespace trainctl::trainer {

// The sleep the environment asks for in `phase`, in ms; 0 when none.
int64_t TestPhaseSleepMs(absl::string_view phase);

// Sleeps TestPhaseSleepMs(phase), telling `log` first; nothing when 0.
void TestPhaseSleep(absl::string_view phase, const std::function<void(const std::string&)>& log);

}  // namespace trainctl::trainer
