#include "coordinator/jobs/owner_numbers.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace trainctl::coordinator {

absl::Status OwnerNumbers::LoadOnce() {
  if (loaded_) return absl::OkStatus();
  TRAINCTL_ASSIGN_OR_RETURN(auto rows, store_->auth().LoadOwnerNumbers());
  for (auto& [owner, number] : rows) {
    highest_ = std::max(highest_, number);
    numbers_[std::move(owner)] = number;
  }
  loaded_ = true;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> OwnerNumbers::Get(const std::string& owner) {
  TRAINCTL_RETURN_IF_ERROR(LoadOnce());
  if (auto it = numbers_.find(owner); it != numbers_.end()) return it->second;
  const int64_t next = highest_ + 1;
  if (absl::Status s = store_->auth().PutOwnerNumber(owner, next); !s.ok()) {
    // Nothing else writes the table while this coordinator holds the
    // database, so a taken row means memory is behind: read it again.
    if (absl::IsAlreadyExists(s)) loaded_ = false;
    return absl::UnavailableError(
        absl::StrCat("could not store a number for owner '", owner, "': ", s.message()));
  }
  highest_ = next;
  numbers_[owner] = next;
  return next;
}

}  // namespace trainctl::coordinator
