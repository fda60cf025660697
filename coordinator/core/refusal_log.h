// Bounded logging of refused requests (bad tokens, wrong roles, failed
// dashboard sign-ins). Each refusal is worth a line — an operator must see
// someone knocking — but not one line each: 300 bad tokens in 0.13 s once
// wrote 300 lines (about 1.4 GB an hour from one client). Per peer (its IP
// address), the first refusal of an interval is logged at once; the others
// in that interval are counted, and Flush() writes one line with the count
// (and the last reason) once the interval is over. So a peer costs at most
// two lines per interval however fast it knocks, and a quiet one loses
// nothing: every line carries `count`, the refusals it stands for.
//
// Memory is bounded too: at most `max_peers` peers are tracked; refusals of
// further peers share one entry, peer "(other peers)".
//
// Thread-safe (gRPC and HTTP threads note, the loop flushes): one mutex.
#pragma once

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/log.h"

namespace trainctl::coordinator {

class RefusalLog {
 public:
  // Lines are `component event peer=... count=N` + the refusal's fields.
  RefusalLog(std::string component, std::string event, absl::Duration interval = absl::Seconds(10),
             const Clock* clock = SystemClock::Get(), size_t max_peers = 1024)
      : component_(std::move(component)),
        event_(std::move(event)),
        interval_(interval),
        clock_(clock),
        max_peers_(max_peers) {}

  // A refusal from `peer` ("" when unknown), described by `fields`.
  void Note(const std::string& peer, LogFields fields);
  // Logs the counted refusals of every peer whose interval is over, and
  // forgets peers with nothing pending. Call periodically (the coordinator
  // does every second).
  void Flush();

  // Lines written so far (tests).
  int64_t lines() const {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  struct Peer {
    // When this peer's last line was written; its interval runs from here.
    absl::Time logged_at;
    // Refusals since that line, not yet in any line.
    int64_t pending = 0;
    // The fields of the latest pending refusal.
    LogFields last;
  };
  void Write(const std::string& peer, int64_t count, LogFields fields)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string component_;
  const std::string event_;
  const absl::Duration interval_;
  const Clock* const clock_;
  const size_t max_peers_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
  int64_t lines_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trainctl::coordinator
