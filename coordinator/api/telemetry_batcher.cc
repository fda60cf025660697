#include "coordinator/api/telemetry_batcher.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "common/log.h"
#include "coordinator/jobs/telemetry_ingest.h"
#include "coordinator/store/state_store.h"

namespace trainctl::coordinator {
namespace {

// A refused message is logged as WorkerSession::LogRefusal does.
void LogRefused(const std::string& worker_id, const absl::Status& s) {
  if (s.ok() || s.code() == absl::StatusCode::kAborted || StateStore::IsWriteFailure(s)) return;
  LogEvent(LogLevel::kWarn, "coordinator", "report_refused",
           {{"worker_id", worker_id}, {"error", std::string(s.message())}});
}

}  // namespace

TelemetryBatcher::TelemetryBatcher(ServiceContext ctx) : ctx_(ctx), writer_(ctx.loop) {}

TelemetryBatcher::~TelemetryBatcher() = default;

bool TelemetryBatcher::Batches(const v1::WorkerMessage& msg) {
  if (msg.seq() <= 0) return false;
  if (msg.has_logs() || msg.has_progress()) return true;
  return msg.has_metrics() && !TelemetryIngest::MakesEvents(msg.metrics());
}

void TelemetryBatcher::Queue(TelemetrySession* session, const std::string& worker_id,
                             v1::WorkerMessage msg) {
  ctx_.loop->CheckInLoop("TelemetryBatcher");
  ++pending_[worker_id];
  queue_.push_back({session, worker_id, std::move(msg)});
  // Once per loop turn: what the turn queued goes as one group.
  if (!send_posted_) {
    send_posted_ = true;
    ctx_.loop->Post([this] {
      AssertOnLoop(ctx_.loop, "TelemetryBatcher");
      send_posted_ = false;
      SendQueued();
    });
  }
}

void TelemetryBatcher::SendQueued() {
  if (queue_.empty() || writer_.busy()) return;  // (the writer's done sends the rest)
  auto group = std::make_unique<Group>();
  group->items = std::move(queue_);
  queue_.clear();
  group->fates.reserve(group->items.size());
  absl::flat_hash_map<std::string, size_t> index;  // worker -> position in seqs
  for (Queued& q : group->items) {
    auto [it, fresh] = index.try_emplace(q.worker_id, group->seqs.size());
    if (fresh) group->seqs.emplace_back(q.worker_id, ctx_.telemetry->Applied(q.worker_id));
    int64_t& highest = group->seqs[it->second].second;
    if (q.msg.seq() <= highest) {  // a resend
      group->fates.push_back(Fate::kDuplicate);
      continue;
    }
    highest = q.msg.seq();
    if (q.msg.has_progress()) {  // memory only: applied after the commit, in its place
      group->fates.push_back(Fate::kApply);
      continue;
    }
    absl::Status accepted = q.msg.has_metrics()
                                ? ctx_.ingest->CheckMetrics(q.worker_id, q.msg.metrics())
                                : ctx_.ingest->CheckLogs(q.worker_id, q.msg.logs());
    if (!accepted.ok()) {
      // Refused: applied all the same (its seq counts), nothing to store.
      LogRefused(q.worker_id, accepted);
      group->fates.push_back(Fate::kRefused);
      continue;
    }
    group->fates.push_back(Fate::kWrite);
    group->writes.push_back(&q.msg);
  }
  const Group* writing = group.get();
  group_ = std::move(group);
  if (writing->writes.empty()) {
    // Nothing to store (resends, refusals, progress): no transaction either.
    Written(absl::OkStatus());
    return;
  }
  StateStore* store = ctx_.store;
  writer_.Start(
      [store, writing] { return store->telemetry().AppendGroup(writing->writes, writing->seqs); },
      [this](const absl::Status& committed)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { Written(committed); });
}

void TelemetryBatcher::Written(const absl::Status& committed) {
  std::unique_ptr<Group> group = std::move(group_);
  completing_ = true;
  // Each session once, in first-seen order.
  std::vector<TelemetrySession*> sessions;
  for (const Queued& q : group->items) {
    if (std::find(sessions.begin(), sessions.end(), q.session) == sessions.end())
      sessions.push_back(q.session);
  }
  if (committed.ok()) {
    ctx_.telemetry->MarkApplied(group->seqs);
    for (size_t i = 0; i < group->items.size(); ++i) {
      if (group->fates[i] != Fate::kWrite && group->fates[i] != Fate::kApply) continue;
      const Queued& q = group->items[i];
      LogRefused(q.worker_id,
                 q.msg.has_metrics() ? ctx_.ingest->MetricsStored(q.worker_id, q.msg.metrics())
                 : q.msg.has_logs()  ? ctx_.ingest->LogsStored(q.worker_id, q.msg.logs())
                                     : ctx_.ingest->OnProgress(q.worker_id, q.msg.progress()));
    }
    for (TelemetrySession* s : sessions) s->TelemetryApplied();
    for (const Queued& q : group->items) Release(q.worker_id);
  } else {
    // Nothing applied. Each session gets back its messages of the group and
    // those it queued since, in order: none of them may commit before the
    // failed ones do.
    std::vector<Queued> later;
    for (Queued& q : queue_) {
      if (std::find(sessions.begin(), sessions.end(), q.session) == sessions.end()) {
        later.push_back(std::move(q));
        continue;
      }
      group->items.push_back(std::move(q));
    }
    queue_ = std::move(later);
    for (TelemetrySession* s : sessions) {
      std::vector<v1::WorkerMessage> mine;
      for (Queued& q : group->items) {
        if (q.session == s) mine.push_back(std::move(q.msg));
      }
      s->TelemetryNotApplied(std::move(mine), committed);
    }
    for (const Queued& q : group->items) Release(q.worker_id);
  }
  completing_ = false;
  if (!holding_) SendQueued();  // what was queued meanwhile
}

void TelemetryBatcher::Release(const std::string& worker_id) {
  auto it = pending_.find(worker_id);
  if (it != pending_.end() && --it->second <= 0) pending_.erase(it);
}

template <typename Settled>
void TelemetryBatcher::WaitUntil(Settled settled) {
  if (completing_) return;
  while (!settled()) {
    if (writer_.busy()) {
      writer_.Wait();  // runs Written, which sends the next group
    } else if (!queue_.empty()) {
      SendQueued();
    } else {
      break;  // nothing left to wait for
    }
  }
}

void TelemetryBatcher::Settle(const std::string& worker_id) {
  ctx_.loop->CheckInLoop("TelemetryBatcher");
  WaitUntil([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return !pending_.contains(worker_id); });
}

void TelemetryBatcher::Drain() {
  ctx_.loop->CheckInLoop("TelemetryBatcher");
  WaitUntil([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return pending_.empty(); });
}

void TelemetryBatcher::ReadPublished(absl::FunctionRef<void()> read) {
  ctx_.loop->CheckInLoop("TelemetryBatcher");
  holding_ = true;
  writer_.Wait();  // the group being written, committed (or not) and published
  read();
  holding_ = false;
  SendQueued();
}

}  // namespace trainctl::coordinator
