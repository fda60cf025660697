#include "coordinator/auth/live_calls.h"

#include <utility>
#include <vector>

#include "common/log.h"

namespace trainctl::coordinator {

void LiveCalls::CheckOnLoop() const {
  if (loop_ != nullptr) loop_->CheckInLoop("LiveCalls");
}

LiveCalls::Id LiveCalls::Add(Principal who, End end) {
  CheckOnLoop();
  const Id id = next_++;
  calls_.emplace(id, Call{std::move(who), std::move(end)});
  return id;
}

void LiveCalls::Remove(Id id) {
  CheckOnLoop();
  calls_.erase(id);
}

int LiveCalls::Sweep() {
  CheckOnLoop();
  // Collected first: an `end` may finish its call, whose OnDone later calls
  // Remove (a no-op by then), but never re-enters this loop.
  std::vector<std::pair<Call, absl::Status>> lapsed;
  for (auto it = calls_.begin(); it != calls_.end();) {
    absl::Status valid = auth_->StillValid(it->second.who);
    if (valid.ok()) {
      ++it;
      continue;
    }
    lapsed.emplace_back(std::move(it->second), std::move(valid));
    it = calls_.erase(it);
  }
  for (auto& [call, why] : lapsed) {
    LogEvent(LogLevel::kInfo, "coordinator", "live_call_ended",
             {{"token_id", call.who.token_id},
              {"name", call.who.name},
              {"reason", std::string(why.message())}});
    call.end(why);
  }
  return static_cast<int>(lapsed.size());
}

}  // namespace trainctl::coordinator
