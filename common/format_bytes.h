// A byte count as messages and tables show it: "1000 bytes", "2 KiB",
// "64 MiB", "1.5 GiB" (binary units, one decimal where it is not whole).
// The one form the scheduler's reasons, the CLI and the worker's
// OUT_OF_MEMORY messages share, so that a limit reads the same everywhere.
//
// Pure; thread-safe.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainctl {

inline std::string FormatBytes(int64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " bytes");
  double v = static_cast<double>(bytes);
  int unit = -1;
  while (v >= 1024 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  if (v == std::floor(v)) return absl::StrCat(static_cast<int64_t>(v), " ", kUnits[unit]);
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

}  // namespace trainctl
