// Which worker daemons exist, which are alive, and how to reach them.
//
// A worker registers on its Session stream (with a stable id kept in its
// work dir, or none on first start), heartbeats on it, and is LOST when
// silent past its lease. Reconnecting with the same id resumes it; a second
// session claiming the id of a worker whose session is still open and
// heartbeating is refused. Workers are persisted on every state change
// (not on heartbeats).
//
// Called by the gRPC WorkerService (through the event loop) and by the
// JobManager (free slots, sending assignments).
//
// Not thread-safe: runs on the coordinator's EventLoop.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/store/state_store.h"
#include "trainctl/v1/worker_service.pb.h"

namespace trainctl::coordinator {

// A worker id's one rule, wherever an id comes in (registration, a join's
// certificate, revocation): 1 to 128 of [A-Za-z0-9._-], no "..". An
// INVALID_ARGUMENT naming FIELD (the id itself is not repeated: it may hold
// anything), or OK.
absl::Status CheckWorkerId(absl::string_view field, absl::string_view id);

// The coordinator's half of one open Session stream.
class WorkerChannel {
 public:
  virtual ~WorkerChannel() = default;
  // Queues a message for the worker; never blocks. False when the stream is
  // already closed.
  virtual bool Send(const v1::CoordinatorMessage& msg) = 0;
  // Ends the stream with a status (e.g. the worker was declared LOST).
  virtual void Close(const absl::Status& status) = 0;
  // True while messages this session read off the worker's stream wait for
  // the loop: the worker spoke, the loop is behind (a slow commit). Its
  // lease does not run out meanwhile (ExpireLeases): a lease measures the
  // worker's silence, not the coordinator's.
  virtual bool Unhandled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return false; }
};

struct RegistryOptions {
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // LOST after this long without a heartbeat.
  absl::Duration lease_timeout = absl::Seconds(3);
  // The most heartbeats a second the whole fleet sends (0: no bound). With
  // more open sessions than heartbeat_interval allows for, every worker is
  // told a longer interval (workers ÷ this, rounded up to 100 ms), and its
  // lease grows in the same proportion: the coordinator's heartbeat work
  // stays bounded as the fleet grows (as Nomad's max_heartbeats_per_second).
  // A silent worker is then found later; a broken stream is not (it is LOST
  // after disconnect_grace either way).
  int max_heartbeats_per_sec = 10000;
  // A session that broke without a Goodbye (the daemon died, the host or
  // the network went away) shortens the lease to this from the break: the
  // daemon's first reconnect comes within 100 ms, so a quick reconnect still
  // loses nothing, while a dead worker is LOST well before its lease ends.
  absl::Duration disconnect_grace = absl::Seconds(1);
  // A LOST or LEFT worker is forgotten this long after its last heartbeat
  // (unless a job still has ranks on it), so registrations that never return
  // do not accumulate.
  absl::Duration gone_ttl = absl::Hours(24);
  // After a coordinator restart, workers get at least this long to notice
  // and reconnect (their backoff runs while the coordinator was down).
  absl::Duration recovery_grace = absl::Seconds(15);
};

class WorkerRegistry {
 public:
  WorkerRegistry(StateStore* store, const Clock* clock, RegistryOptions options);

  // The clock its leases run on (sessions time their own retries by it).
  const Clock* clock() const { return clock_; }

  // The loop every call must come from; checked at run time, in every build.
  // Unbound (tests that drive the registry from one thread): not checked.
  void BindToLoop(const EventLoop* loop) { loop_ = loop; }

  // Loads workers from the store at start. Every ALIVE one gets
  // max(lease_timeout, recovery_grace) from now to reconnect in.
  void Recover(const std::vector<v1::Worker>& workers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // A session's Register message. Returns the worker's id (assigned when the
  // message had none). ALREADY_EXISTS when another live session holds the id;
  // INVALID_ARGUMENT for a malformed message (field named).
  absl::StatusOr<std::string> Register(const v1::Register& msg, WorkerChannel* channel)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // What a worker is told to keep to (RegisterAck, HeartbeatAck).
  struct LeaseTerms {
    absl::Duration heartbeat_interval;
    absl::Duration lease_timeout;
  };
  // The terms worker `id` was last given (at its registration or in a
  // heartbeat's answer); the options' when unknown.
  LeaseTerms TermsOf(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // A heartbeat from the session `channel` of worker `id`: renews the lease.
  // Returns new terms for the worker when the fleet's size changed them
  // (nullopt: keep the ones it has). FAILED_PRECONDITION when that session
  // no longer owns the id.
  absl::StatusOr<std::optional<LeaseTerms>> Heartbeat(const std::string& id,
                                                      const WorkerChannel* channel)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // The session ended (stream broken or closed). The worker stays ALIVE for
  // min(its lease, disconnect_grace) more, so a quick reconnect loses
  // nothing; with `left` (a Goodbye) it is LEFT at once.
  void SessionEnded(const std::string& id, const WorkerChannel* channel, bool left)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // Marks ALIVE worker `id` LOST at once (persisted) and closes its session
  // with `why`: its certificate or token was revoked. True when it was
  // ALIVE (the caller then reschedules its ranks, as for ExpireLeases).
  bool Expel(const std::string& id, const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // Marks every worker whose lease ran out LOST and returns their ids.
  std::vector<std::string> ExpireLeases() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Why LOST worker `id` was lost, for its ranks' ends ("its worker stopped
  // heartbeating (lease expired)", "its worker's stream broke ...").
  std::string LossReason(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Forgets (in memory and in the store) every LOST or LEFT worker whose last
  // heartbeat is older than gone_ttl and for which `holds_ranks` is false,
  // and returns their ids. Such a worker that comes back simply registers
  // again with its id.
  std::vector<std::string> ForgetGone(const std::function<bool(const std::string&)>& holds_ranks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // Sends to a worker's open session. False when it has none.
  bool Send(const std::string& id, const v1::CoordinatorMessage& msg)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // True when worker `id` is ALIVE with an open session. False while its
  // stream is broken (in its disconnect grace), when LOST or LEFT, or unknown.
  bool Connected(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // Records why its registered address is refused ("" when accepted; see
  // v1::Worker.address_refused): what `trainctl workers` shows.
  void SetAddressRefused(const std::string& id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // True when `channel` is the open session of worker `id`.
  bool OwnsSession(const std::string& id, const WorkerChannel* channel) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // ALIVE workers (scheduling candidates), by id.
  std::vector<const v1::Worker*> Alive() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  const v1::Worker* Find(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // When worker `id` last registered or heartbeat, on the monotonic clock
  // (Clock::Mono); absl::InfiniteFuture() when unknown (not heard since the
  // coordinator started).
  absl::Time LastHeardMono(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // How many workers are in each state (for /metrics: no copies).
  std::map<v1::WorkerState, int64_t> CountByState() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Every worker (include_gone: also LOST and LEFT ones), by id.
  std::vector<v1::Worker> List(bool include_gone) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  const RegistryOptions& options() const { return options_; }

 private:
  struct Entry {
    v1::Worker worker;
    // The open session; null while disconnected. Set through SetChannel
    // (it counts the open sessions).
    WorkerChannel* channel = nullptr;
    // The heartbeat interval the worker was last told.
    absl::Duration interval;
    // On the monotonic clock (Clock::Mono): a stepped wall clock neither
    // expires every lease at once nor keeps a dead worker alive.
    absl::Time lease_deadline;
    // The last registration or heartbeat (monotonic); unknown before one.
    absl::Time last_heard_mono = absl::InfiniteFuture();
    // What lease_deadline waits for when it is not the next heartbeat (a
    // reconnect after a broken stream or a coordinator restart); what made
    // the worker LOST. Both cleared by a registration.
    std::string awaiting;
    std::string lost_reason;
  };
  absl::Status Persist(const v1::Worker& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void SetChannel(Entry& e, WorkerChannel* channel) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Every lease_deadline is set here: it keeps expiry_check_after_.
  void SetLeaseDeadline(Entry& e, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // `e` became LOST or LEFT: it keeps forget_check_after_.
  void NoteGone(const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The interval every worker should keep to now, for open_sessions_ of them.
  absl::Duration IntervalForFleet() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The lease of a worker heartbeating every `interval`.
  absl::Duration LeaseFor(absl::Duration interval) const;
  // Checks (in every build) that the caller runs on the bound loop.
  void CheckOnLoop() const {
    if (loop_ != nullptr) loop_->CheckInLoop("WorkerRegistry");
    static_cast<void>(loop_);
  }

  StateStore* store_;
  const Clock* clock_;
  RegistryOptions options_;
  absl::btree_map<std::string, Entry> workers_ ABSL_GUARDED_BY(kLoop);
  int64_t open_sessions_ ABSL_GUARDED_BY(kLoop) = 0;
  // Lower bounds that spare the housekeeping passes their walk of every
  // worker: no ALIVE worker's lease ends before expiry_check_after_
  // (monotonic), and no gone one is due to be forgotten before
  // forget_check_after_ (wall clock, as last_heartbeat_time). Each walk
  // sets them to the earliest it saw; every change of a deadline lowers them.
  absl::Time expiry_check_after_ ABSL_GUARDED_BY(kLoop) = absl::InfinitePast();
  absl::Time forget_check_after_ ABSL_GUARDED_BY(kLoop) = absl::InfinitePast();
  static constexpr absl::Duration kForgetRetry = absl::Seconds(1);
  const EventLoop* loop_ = nullptr;
};

}  // namespace trainctl::coordinator
