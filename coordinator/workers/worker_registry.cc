#include "coordinator/workers/worker_registry.h"
#include "coordinator/core/retry_log.h"

#include <algorithm>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/jobspec/gpu_flavor.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/time_util.h"

namespace trainctl::coordinator {
namespace {

// "WORKER_STATE_ALIVE" -> "alive".
std::string Lower(const std::string& name) {
  std::string s = name.substr(name.rfind('_') + 1);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

constexpr int kMaxSlots = 1024;
constexpr int kMaxLabels = 64;

absl::Status ValidateRegister(const v1::Register& m) {
  if (!m.worker_id().empty())
    TRAINCTL_RETURN_IF_ERROR(CheckWorkerId("register.worker_id", m.worker_id()));
  if (m.hostname().empty() || m.hostname().size() > 255) {
    return absl::InvalidArgumentError("register.hostname: required, at most 255 bytes");
  }
  if (m.address().size() > 255)
    return absl::InvalidArgumentError("register.address: at most 255 bytes");
  if (m.slots_size() == 0 || m.slots_size() > kMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("register.slots: 1 to ", kMaxSlots, " slots, got ", m.slots_size()));
  }
  absl::flat_hash_set<int> seen;
  for (int i = 0; i < m.slots_size(); ++i) {
    const v1::Slot& s = m.slots(i);
    if (s.kind() != v1::Slot::KIND_GPU && s.kind() != v1::Slot::KIND_CPU) {
      return absl::InvalidArgumentError(
          absl::StrCat("register.slots[", i, "].kind: must be GPU or CPU"));
    }
    if (s.kind() != m.slots(0).kind()) {
      return absl::InvalidArgumentError(
          absl::StrCat("register.slots[", i, "].kind: every slot of a worker has one kind"));
    }
    if (s.index() < 0 || !seen.insert(s.index()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("register.slots[", i, "].index: must be >= 0 and unique, got ", s.index()));
    }
    // One naming rule with the job's resources.gpu_flavor (gpu_flavor.h);
    // a GPU may have none, a CPU slot never has one.
    if (!s.flavor().empty()) {
      if (s.kind() == v1::Slot::KIND_CPU) {
        return absl::InvalidArgumentError(
            absl::StrCat("register.slots[", i, "].flavor: CPU slots have no flavor"));
      }
      if (std::string problem = GpuFlavorProblem(s.flavor()); !problem.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("register.slots[", i, "].flavor: ", problem));
      }
    }
  }
  if (m.labels_size() > kMaxLabels) {
    return absl::InvalidArgumentError(absl::StrCat("register.labels: at most ", kMaxLabels));
  }
  if (m.running_size() > kMaxSlots) {
    return absl::InvalidArgumentError("register.running: more ranks than slots");
  }
  return absl::OkStatus();
}

std::string NewWorkerId() {
  static std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("w-%012x", rng() & 0xffffffffffffULL);
}

}  // namespace

absl::Status CheckWorkerId(absl::string_view field, absl::string_view id) {
  const bool ok = !id.empty() && id.size() <= 128 && !absl::StrContains(id, "..") &&
                  std::all_of(id.begin(), id.end(), [](char c) {
                    return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
                  });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": 1 to 128 of [A-Za-z0-9._-] (no \"..\")"));
}

WorkerRegistry::WorkerRegistry(StateStore* store, const Clock* clock, RegistryOptions options)
    : store_(store), clock_(clock), options_(options) {}

absl::Status WorkerRegistry::Persist(const v1::Worker& w) { return store_->workers().PutWorker(w); }

void WorkerRegistry::SetLeaseDeadline(Entry& e, absl::Time deadline) {
  e.lease_deadline = deadline;
  expiry_check_after_ = std::min(expiry_check_after_, deadline);
}

void WorkerRegistry::NoteGone(const Entry& e) {
  forget_check_after_ = std::min(forget_check_after_,
                                 FromTimestamp(e.worker.last_heartbeat_time()) + options_.gone_ttl);
}

void WorkerRegistry::SetChannel(Entry& e, WorkerChannel* channel) {
  open_sessions_ += (channel != nullptr ? 1 : 0) - (e.channel != nullptr ? 1 : 0);
  e.channel = channel;
}

absl::Duration WorkerRegistry::IntervalForFleet() const {
  const absl::Duration base = options_.heartbeat_interval;
  if (options_.max_heartbeats_per_sec <= 0) return base;
  // open_sessions_ heartbeats every `interval` is at most the bound a second;
  // rounded up to 100 ms, so a worker's terms change in steps, not with
  // every registration.
  const absl::Duration step = absl::Milliseconds(100);
  const absl::Duration need =
      absl::Seconds(static_cast<double>(open_sessions_) / options_.max_heartbeats_per_sec);
  if (need <= base) return base;
  return std::max(base, absl::Ceil(need, step));
}

absl::Duration WorkerRegistry::LeaseFor(absl::Duration interval) const {
  if (interval <= options_.heartbeat_interval) return options_.lease_timeout;
  return options_.lease_timeout * absl::FDivDuration(interval, options_.heartbeat_interval);
}

WorkerRegistry::LeaseTerms WorkerRegistry::TermsOf(const std::string& id) const {
  auto it = workers_.find(id);
  const absl::Duration interval = it != workers_.end() && it->second.interval > absl::ZeroDuration()
                                      ? it->second.interval
                                      : options_.heartbeat_interval;
  return LeaseTerms{interval, LeaseFor(interval)};
}

void WorkerRegistry::Recover(const std::vector<v1::Worker>& workers) {
  CheckOnLoop();
  absl::Time now = clock_->Mono();
  for (const v1::Worker& w : workers) {
    Entry& e = workers_[w.id()];
    e.worker = w;
    SetChannel(e, nullptr);
    SetLeaseDeadline(e, now + std::max(options_.lease_timeout, options_.recovery_grace));
    if (w.state() == v1::WORKER_STATE_LOST || w.state() == v1::WORKER_STATE_LEFT) NoteGone(e);
    e.awaiting =
        absl::StrCat("its worker did not reconnect within ",
                     absl::FormatDuration(e.lease_deadline - now), " of the coordinator's restart");
  }
}

absl::StatusOr<std::string> WorkerRegistry::Register(const v1::Register& msg,
                                                     WorkerChannel* channel) {
  CheckOnLoop();
  if (absl::Status s = ValidateRegister(msg); !s.ok()) return s;
  absl::Time now = clock_->Now();
  std::string id = msg.worker_id();
  if (id.empty()) {
    do {
      id = NewWorkerId();
    } while (workers_.contains(id));
  }
  auto it = workers_.find(id);
  if (it != workers_.end() && it->second.channel != nullptr && it->second.channel != channel &&
      it->second.worker.state() == v1::WORKER_STATE_ALIVE &&
      clock_->Mono() < it->second.lease_deadline) {
    return absl::AlreadyExistsError(absl::StrCat(
        "worker id ", id, " is held by a live session (host ", it->second.worker.hostname(),
        "); two daemons share a work dir, or the old session has not expired yet"));
  }
  const std::string before =
      it != workers_.end() ? Lower(v1::WorkerState_Name(it->second.worker.state())) : "new";
  v1::Worker w = it != workers_.end() ? it->second.worker : v1::Worker();
  w.set_id(id);
  w.set_hostname(msg.hostname());
  w.set_address(msg.address().empty() ? msg.hostname() : msg.address());
  *w.mutable_slots() = msg.slots();
  *w.mutable_labels() = msg.labels();
  w.set_version(msg.version());
  w.set_allow_commands(msg.allow_commands());
  *w.mutable_allocatable() = msg.allocatable();
  w.set_state(v1::WORKER_STATE_ALIVE);
  SetTimestamp(now, w.mutable_registered_time());
  SetTimestamp(now, w.mutable_last_heartbeat_time());
  // Memory goes ahead of a failed write (a full or failing store): refusing
  // would turn a store outage into lost workers. A coordinator restarted
  // from the older row sees the worker register again.
  if (absl::Status s = Persist(w); !s.ok()) {
    LogDeferred(s, "memory goes ahead; the row is written at its next change",
                {{"worker_id", id}, {"on", "registered"}});
  }
  Entry& e = workers_[id];
  if (e.channel != nullptr && e.channel != channel) {
    e.channel->Close(absl::AbortedError("replaced by a new session of the same worker"));
  }
  LogEvent(LogLevel::kInfo, "coordinator", "worker_registered",
           {{"worker_id", id},
            {"host", w.hostname()},
            {"address", w.address()},
            {"slots", absl::StrCat(w.slots_size())},
            {"running_ranks", absl::StrCat(msg.running_size())},
            {"was", before}});
  e.worker = std::move(w);
  SetChannel(e, channel);
  e.interval = IntervalForFleet();
  e.last_heard_mono = clock_->Mono();
  SetLeaseDeadline(e, e.last_heard_mono + LeaseFor(e.interval));
  e.awaiting.clear();
  e.lost_reason.clear();
  return id;
}

absl::StatusOr<std::optional<WorkerRegistry::LeaseTerms>> WorkerRegistry::Heartbeat(
    const std::string& id, const WorkerChannel* channel) {
  CheckOnLoop();
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.channel != channel) {
    return absl::FailedPreconditionError("this session no longer owns the worker id");
  }
  Entry& e = it->second;
  if (e.worker.state() != v1::WORKER_STATE_ALIVE) {
    return absl::FailedPreconditionError("worker was declared LOST; register again");
  }
  // A longer interval is given at once; a shorter one only when it is a
  // fifth shorter, so that a fleet hovering at a step does not change every
  // worker's terms back and forth.
  const absl::Duration told = e.interval;
  const absl::Duration fleet = IntervalForFleet();
  std::optional<LeaseTerms> terms;
  if (fleet > told || fleet * 5 <= told * 4) {
    e.interval = fleet;
    terms = LeaseTerms{fleet, LeaseFor(fleet)};
  }
  e.last_heard_mono = clock_->Mono();
  // The worker may already wait the old interval for its next heartbeat (it
  // reads the answer after): until then the longer of the two leases holds.
  SetLeaseDeadline(e, e.last_heard_mono + LeaseFor(std::max(told, e.interval)));
  SetTimestamp(clock_->Now(), e.worker.mutable_last_heartbeat_time());
  return terms;
}

void WorkerRegistry::SessionEnded(const std::string& id, const WorkerChannel* channel, bool left) {
  CheckOnLoop();
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.channel != channel) return;
  SetChannel(it->second, nullptr);
  LogEvent(LogLevel::kInfo, "coordinator", "worker_session_ended",
           {{"worker_id", id},
            {"reason",
             left ? "goodbye (the daemon is shutting down)" : "stream broke without a goodbye"},
            {"then", left ? "LEFT"
                          : absl::StrCat("LOST unless it reconnects within ",
                                         absl::FormatDuration(options_.disconnect_grace))}});
  if (left && it->second.worker.state() == v1::WORKER_STATE_ALIVE) {
    it->second.worker.set_state(v1::WORKER_STATE_LEFT);
    NoteGone(it->second);
    // Memory goes ahead of a failed write: the worker is gone either way,
    // and a coordinator restarted from the stale row sees it expire.
    if (absl::Status s = Persist(it->second.worker); !s.ok()) {
      LogDeferred(s, "memory goes ahead; the row is written at its next change",
                  {{"worker_id", id}, {"on", "left"}});
    }
    return;
  }
  SetLeaseDeadline(it->second,
                   std::min(it->second.lease_deadline, clock_->Mono() + options_.disconnect_grace));
  it->second.awaiting = absl::StrCat(
      "its worker's stream broke without a goodbye and it did not reconnect within ",
      absl::FormatDuration(options_.disconnect_grace), " (daemon killed, host or network down)");
}

bool WorkerRegistry::Expel(const std::string& id, const absl::Status& why) {
  CheckOnLoop();
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.worker.state() != v1::WORKER_STATE_ALIVE) return false;
  Entry& e = it->second;
  e.worker.set_state(v1::WORKER_STATE_LOST);
  NoteGone(e);
  e.lost_reason = absl::StrCat("its worker was expelled: ", why.message());
  LogEvent(
      LogLevel::kWarn, "coordinator", "worker_lost",
      {{"worker_id", id}, {"host", e.worker.hostname()}, {"reason", std::string(why.message())}});
  // As in ExpireLeases: a failed write leaves a stale ALIVE row, which a
  // restarted coordinator expires (and the revocation refuses it).
  if (absl::Status s = Persist(e.worker); !s.ok()) {
    LogDeferred(s, "memory goes ahead; the row is written at its next change",
                {{"worker_id", id}, {"on", "expelled"}});
  }
  if (e.channel != nullptr) {
    e.channel->Close(why);
    SetChannel(e, nullptr);
  }
  return true;
}

std::vector<std::string> WorkerRegistry::ExpireLeases() {
  CheckOnLoop();
  absl::Time now = clock_->Mono();
  std::vector<std::string> lost;
  // No lease can have run out before the earliest deadline set since the
  // last walk: the pass is free until then (it runs every check_interval,
  // and a walk of 50,000 workers is milliseconds of the loop).
  if (now < expiry_check_after_) return lost;
  absl::Time next = absl::InfiniteFuture();
  for (auto& [id, e] : workers_) {
    if (e.worker.state() != v1::WORKER_STATE_ALIVE) continue;
    if (now < e.lease_deadline) {
      next = std::min(next, e.lease_deadline);
      continue;
    }
    // Its heartbeats may be queued behind a stalled loop (a due timer runs
    // before posted work): not silent, so not lost; they renew the lease
    // once handled. Looked at again at the next pass.
    if (e.channel != nullptr && e.channel->Unhandled()) {
      next = now;
      continue;
    }
    e.worker.set_state(v1::WORKER_STATE_LOST);
    NoteGone(e);
    e.lost_reason = e.channel != nullptr || e.awaiting.empty()
                        ? "its worker stopped heartbeating (lease expired)"
                        : e.awaiting;
    LogEvent(LogLevel::kWarn, "coordinator", "worker_lost",
             {{"worker_id", id}, {"host", e.worker.hostname()}, {"reason", e.lost_reason}});
    // As for LEFT: a failed write only leaves a stale ALIVE row, which a
    // restarted coordinator expires again.
    if (absl::Status s = Persist(e.worker); !s.ok()) {
      LogDeferred(s, "memory goes ahead; the row is written at its next change",
                  {{"worker_id", id}, {"on", "lost"}});
    }
    if (e.channel != nullptr) {
      e.channel->Close(absl::UnavailableError("lease expired: no heartbeat in time"));
      SetChannel(e, nullptr);
    }
    lost.push_back(id);
  }
  expiry_check_after_ = next;
  return lost;
}

std::string WorkerRegistry::LossReason(const std::string& id) const {
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.lost_reason.empty())
    return "its worker stopped heartbeating (lease expired)";
  return it->second.lost_reason;
}

std::vector<std::string> WorkerRegistry::ForgetGone(
    const std::function<bool(const std::string&)>& holds_ranks) {
  CheckOnLoop();
  const absl::Time now = clock_->Now();
  std::vector<std::string> forgotten;
  // Nobody gone is due before the earliest "last heartbeat + gone_ttl" noted
  // since the last walk.
  if (now < forget_check_after_) return forgotten;
  absl::Time next = absl::InfiniteFuture();
  for (auto it = workers_.begin(); it != workers_.end();) {
    const v1::Worker& w = it->second.worker;
    const bool gone = w.state() == v1::WORKER_STATE_LOST || w.state() == v1::WORKER_STATE_LEFT;
    if (!gone || it->second.channel != nullptr) {
      ++it;
      continue;
    }
    const absl::Time due = FromTimestamp(w.last_heartbeat_time()) + options_.gone_ttl;
    if (now < due) {
      next = std::min(next, due);
      ++it;
      continue;
    }
    // Still holding ranks, or the store refused: tried again a second on.
    if (holds_ranks(it->first)) {
      next = std::min(next, now + kForgetRetry);
      ++it;
      continue;
    }
    if (absl::Status s = store_->workers().DeleteWorker(it->first); !s.ok()) {
      LogDeferred(s, "forgotten again at the next sweep",
                  {{"worker_id", it->first}, {"on", "forgetting a gone worker"}});
      next = std::min(next, now + kForgetRetry);
      ++it;
      continue;
    }
    LogEvent(LogLevel::kInfo, "coordinator", "worker_forgotten", {{"worker_id", it->first}});
    forgotten.push_back(it->first);
    it = workers_.erase(it);
  }
  forget_check_after_ = next;
  return forgotten;
}

std::map<v1::WorkerState, int64_t> WorkerRegistry::CountByState() const {
  CheckOnLoop();
  std::map<v1::WorkerState, int64_t> out;
  for (const auto& [id, e] : workers_) ++out[e.worker.state()];
  return out;
}

bool WorkerRegistry::Send(const std::string& id, const v1::CoordinatorMessage& msg) {
  CheckOnLoop();
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.channel == nullptr) return false;
  return it->second.channel->Send(msg);
}

bool WorkerRegistry::OwnsSession(const std::string& id, const WorkerChannel* channel) const {
  CheckOnLoop();
  auto it = workers_.find(id);
  return it != workers_.end() && channel != nullptr && it->second.channel == channel;
}

bool WorkerRegistry::Connected(const std::string& id) const {
  CheckOnLoop();
  auto it = workers_.find(id);
  return it != workers_.end() && it->second.channel != nullptr &&
         it->second.worker.state() == v1::WORKER_STATE_ALIVE;
}

std::vector<const v1::Worker*> WorkerRegistry::Alive() const {
  CheckOnLoop();
  std::vector<const v1::Worker*> out;
  for (const auto& [id, e] : workers_) {
    if (e.worker.state() == v1::WORKER_STATE_ALIVE) out.push_back(&e.worker);
  }
  return out;
}

const v1::Worker* WorkerRegistry::Find(const std::string& id) const {
  CheckOnLoop();
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second.worker;
}

absl::Time WorkerRegistry::LastHeardMono(const std::string& id) const {
  CheckOnLoop();
  auto it = workers_.find(id);
  return it == workers_.end() ? absl::InfiniteFuture() : it->second.last_heard_mono;
}

void WorkerRegistry::SetAddressRefused(const std::string& id, const std::string& why) {
  CheckOnLoop();
  auto it = workers_.find(id);
  if (it != workers_.end()) it->second.worker.set_address_refused(why);
}

std::vector<v1::Worker> WorkerRegistry::List(bool include_gone) const {
  CheckOnLoop();
  std::vector<v1::Worker> out;
  for (const auto& [id, e] : workers_) {
    if (include_gone || e.worker.state() == v1::WORKER_STATE_ALIVE) out.push_back(e.worker);
  }
  return out;
}

}  // namespace trainctl::coordinator
