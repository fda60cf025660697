#include "coordinator/core/refusal_log.h"

#include <utility>
#include <vector>

namespace trainctl::coordinator {

void RefusalLog::Write(const std::string& peer, int64_t count, LogFields fields) {
  fields.insert(fields.begin(), {{"peer", peer}, {"count", std::to_string(count)}});
  LogEvent(LogLevel::kInfo, component_, event_, fields);
  ++lines_;
}

void RefusalLog::Note(const std::string& peer_in, LogFields fields) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  std::string peer = peer_in.empty() ? "(unknown)" : peer_in;
  if (!peers_.contains(peer) && peers_.size() >= max_peers_) peer = "(other peers)";
  auto [it, fresh] = peers_.try_emplace(peer);
  Peer& p = it->second;
  if (fresh || (p.pending == 0 && now - p.logged_at >= interval_)) {
    // The first refusal of an interval: logged now.
    p.logged_at = now;
    Write(peer, 1, std::move(fields));
    return;
  }
  ++p.pending;
  p.last = std::move(fields);
}

void RefusalLog::Flush() {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  std::vector<std::string> idle;
  for (auto& [peer, p] : peers_) {
    if (now - p.logged_at < interval_) continue;
    if (p.pending == 0) {
      idle.push_back(peer);
      continue;
    }
    Write(peer, p.pending, std::move(p.last));
    p.pending = 0;
    p.last.clear();
    p.logged_at = now;
  }
  for (const std::string& peer : idle) peers_.erase(peer);
}

}  // namespace trainctl::coordinator
