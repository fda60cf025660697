#include "worker/engine/engine_errors.h"

#include "absl/strings/str_cat.h"

namespace trainctl::engine {

absl::Status CheckAtLeast(absl::string_view what, int64_t value, int64_t min) {
  if (value >= min) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " must be >= ", min, ", got ", value));
}

std::string FirstLine(const char* what) {
  std::string s(what);
  const size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

}  // namespace trainctl::engine
