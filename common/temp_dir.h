// Fresh scratch directories for tests, test harnesses and benchmarks.
//
// Threading: thread-safe (mkdtemp picks a unique name).
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace trainctl {

// Creates "$TMPDIR/<prefix>_XXXXXX" (/tmp when TMPDIR is unset or empty),
// mode 0700, and returns its path; "" when it cannot.
std::string MakeTempDir(absl::string_view prefix);

}  // namespace trainctl
