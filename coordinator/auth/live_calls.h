// Calls that outlive their first message — server streams (WatchJob,
// GetLogs with follow, FetchArtifact) and worker Sessions — and the token
// each was authenticated with. A token is checked when a call opens; a
// stream may then last hours, so a revoked or expired token must also end
// the calls already open: Sweep() re-checks every call's principal
// (TokenAuthority::StillValid) and ends those that no longer hold with
// UNAUTHENTICATED. The coordinator sweeps every second and at once after a
// revocation (TokenAuthority::OnRevoke), so a revoked viewer's `logs -f`
// stops within about a second and a revoked worker's session ends (the
// registry then treats the worker as lost and its ranks are rescheduled).
//
// Not thread-safe: runs on the coordinator's loop (Add, Remove, Sweep and
// the `end` callbacks all run there), like the reactors' loop-only state.
#pragma once

#include <cstdint>
#include <functional>
#include <map>

#include "absl/status/status.h"
#include "common/event_loop.h"
#include "coordinator/auth/token_authority.h"
#include "coordinator/core/on_loop.h"

namespace trainctl::coordinator {

class LiveCalls {
 public:
  using Id = uint64_t;
  // Ends a call with the reason its token no longer holds.
  using End = std::function<void(const absl::Status& why)>;

  explicit LiveCalls(const TokenAuthority* auth) : auth_(auth) {}

  // The loop every call must come from; checked at run time, in every build.
  void BindToLoop(const EventLoop* loop) { loop_ = loop; }

  // Tracks a call of `who`; `end` runs at most once, from Sweep, when the
  // token lapses (the call is forgotten then). Ids are never 0.
  Id Add(Principal who, End end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Forgets a call (it finished); unknown ids (already ended) are ignored.
  void Remove(Id id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Ends every call whose token no longer holds; returns how many.
  int Sweep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  size_t size() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return calls_.size(); }

 private:
  struct Call {
    Principal who;
    End end;
  };
  void CheckOnLoop() const;

  const TokenAuthority* const auth_;
  const EventLoop* loop_ = nullptr;
  Id next_ ABSL_GUARDED_BY(kLoop) = 1;
  std::map<Id, Call> calls_ ABSL_GUARDED_BY(kLoop);
};

}  // namespace trainctl::coordinator
