// Error helpers the engine's files share: the range check behind every
// "X must be >= N, got V" option error, and the first line of a LibTorch
// exception's text (c10 appends a backtrace that does not belong in a
// status line). No LibTorch here: the format readers use it too.
//
// Threading: stateless functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trainctl::engine {

// InvalidArgument "WHAT must be >= MIN, got VALUE" when value < min, else OK.
absl::Status CheckAtLeast(absl::string_view what, int64_t value, int64_t min);

// `what` up to its first line break.
std::string FirstLine(const char* what);

}  // namespace trainctl::engine
