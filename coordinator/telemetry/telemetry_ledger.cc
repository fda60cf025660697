#include "coordinator/telemetry/telemetry_ledger.h"

#include <algorithm>

#include "common/status_macros.h"

namespace trainctl::coordinator {
namespace {

// A failure that says nothing about the message: retrying may succeed.
bool Retryable(const absl::Status& s) { return StateStore::IsWriteFailure(s); }

}  // namespace

void TelemetryLedger::Recover(const StoreSnapshot& snapshot) {
  for (const auto& [worker_id, seq] : snapshot.telemetry_seqs) {
    int64_t& applied = applied_[worker_id];
    applied = std::max(applied, seq);
  }
}

int64_t TelemetryLedger::Applied(const std::string& worker_id) const {
  auto it = applied_.find(worker_id);
  return it == applied_.end() ? 0 : it->second;
}

absl::Status TelemetryLedger::BeginGroup() {
  TRAINCTL_RETURN_IF_ERROR(store_->BeginGroup());
  if (memory_ != nullptr) memory_->GroupBegun();
  return absl::OkStatus();
}

void TelemetryLedger::RollBack() {
  store_->RollbackGroup();
  if (memory_ != nullptr) memory_->GroupEnded(/*committed=*/false);
}

absl::Status TelemetryLedger::Commit(const std::vector<std::pair<std::string, int64_t>>& seqs) {
  // A failed CommitGroup has rolled the store's group back itself.
  absl::Status committed = store_->CommitGroup(seqs);
  if (memory_ != nullptr) memory_->GroupEnded(committed.ok());
  return committed;
}

TelemetryLedger::Result TelemetryLedger::Begin(const std::string& worker_id, int64_t seq) {
  if (seq <= Applied(worker_id)) return {Outcome::kDuplicate, absl::OkStatus()};
  if (absl::Status begun = BeginGroup(); !begun.ok()) return {Outcome::kRetry, begun};
  return {Outcome::kApplied, absl::OkStatus()};
}

TelemetryLedger::Result TelemetryLedger::Finish(const std::string& worker_id, int64_t seq,
                                                absl::Status handled) {
  if (Retryable(handled)) {
    RollBack();
    return {Outcome::kRetry, handled};
  }
  if (absl::Status committed = Commit({{worker_id, seq}}); !committed.ok()) {
    return {Outcome::kRetry, committed};
  }
  int64_t& applied = applied_[worker_id];
  applied = std::max(applied, seq);
  return {Outcome::kApplied, handled};
}

TelemetryLedger::Result TelemetryLedger::Apply(const std::string& worker_id, int64_t seq,
                                               const std::function<absl::Status()>& apply) {
  Result begun = Begin(worker_id, seq);
  if (begun.outcome != Outcome::kApplied) return begun;
  return Finish(worker_id, seq, apply());
}

TelemetryLedger::Result TelemetryLedger::ApplyBatch(const std::vector<Item>& items) {
  if (items.empty()) return {Outcome::kApplied, absl::OkStatus()};
  if (absl::Status begun = BeginGroup(); !begun.ok()) return {Outcome::kRetry, begun};
  // Highest seq per worker in this batch, in first-seen order.
  std::vector<std::pair<std::string, int64_t>> seqs;
  absl::flat_hash_map<std::string, size_t> index;
  for (const Item& item : items) {
    auto [it, fresh] = index.try_emplace(item.worker_id, seqs.size());
    if (fresh) seqs.emplace_back(item.worker_id, Applied(item.worker_id));
    int64_t& highest = seqs[it->second].second;
    if (item.seq <= highest) continue;  // a resend
    absl::Status handled = item.apply();
    if (Retryable(handled)) {
      RollBack();
      return {Outcome::kRetry, handled};
    }
    highest = item.seq;
  }
  if (absl::Status committed = Commit(seqs); !committed.ok()) {
    return {Outcome::kRetry, committed};
  }
  MarkApplied(seqs);
  return {Outcome::kApplied, absl::OkStatus()};
}

void TelemetryLedger::MarkApplied(const std::vector<std::pair<std::string, int64_t>>& seqs) {
  for (const auto& [worker_id, seq] : seqs) {
    int64_t& applied = applied_[worker_id];
    applied = std::max(applied, seq);
  }
}

}  // namespace trainctl::coordinator
