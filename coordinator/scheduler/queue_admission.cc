#include "coordinator/scheduler/queue_admission.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace trainctl::scheduler::internal {
namespace {

constexpr SlotKind kKinds[kNumKinds] = {SlotKind::kGpu, SlotKind::kCpu};

const std::string& QueueName(const std::string& name) {
  static const std::string kDefault = "default";
  return name.empty() ? kDefault : name;
}

// Preemption order: lowest priority, youngest, fewest slots, job id.
bool VictimBefore(const RunningJob& a, const RunningJob& b) {
  if (a.priority != b.priority) return a.priority < b.priority;
  if (a.start_seq != b.start_seq) return a.start_seq > b.start_seq;
  if (a.slots != b.slots) return a.slots < b.slots;
  return a.job_id < b.job_id;
}

}  // namespace

absl::Status ValidateQueues(absl::Span<const PendingJob> jobs, const QueueInput& input) {
  absl::flat_hash_set<std::string> names;
  for (size_t i = 0; i < input.queues.size(); ++i) {
    const QueueSpec& queue = input.queues[i];
    if (queue.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("queues[", i, "].name: empty"));
    }
    if (!names.insert(queue.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("queue name: duplicate \"", queue.name, "\""));
    }
    const std::string where = absl::StrCat("queue \"", queue.name, "\": ");
    for (const auto& [field, value] :
         {std::pair<const char*, int>{"nominal_gpu", queue.nominal_gpu},
          std::pair<const char*, int>{"nominal_cpu", queue.nominal_cpu},
          std::pair<const char*, int>{"borrowing_limit_gpu", queue.borrowing_limit_gpu},
          std::pair<const char*, int>{"borrowing_limit_cpu", queue.borrowing_limit_cpu},
          std::pair<const char*, int>{"lending_limit_gpu", queue.lending_limit_gpu},
          std::pair<const char*, int>{"lending_limit_cpu", queue.lending_limit_cpu}}) {
      if (value < -1) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, field, ": must be >= -1 (-1 = unlimited), got ", value));
      }
    }
    if (queue.max_job_size < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "max_job_size: must be >= 0 (0 = none), got ", queue.max_job_size));
    }
    for (const auto& [field, value] :
         {std::pair<const char*, double>{"usage_gpu", queue.usage_gpu},
          std::pair<const char*, double>{"usage_cpu", queue.usage_cpu}}) {
      if (!std::isfinite(value) || value < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, field, ": must be finite and >= 0, got ", value));
      }
    }
    if (!std::isfinite(queue.weight) || queue.weight <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "weight: must be finite and > 0, got ", queue.weight));
    }
    absl::flat_hash_set<std::string> owners;
    for (const QueueSpec::Owner& owner : queue.owners) {
      const std::string at = absl::StrCat(where, "owner \"", owner.name, "\": ");
      if (!owners.insert(owner.name).second) {
        return absl::InvalidArgumentError(absl::StrCat(at, "name: duplicate"));
      }
      if (!std::isfinite(owner.weight) || owner.weight <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, "weight: must be finite and > 0, got ", owner.weight));
      }
      for (const auto& [field, value] :
           {std::pair<const char*, double>{"usage_gpu", owner.usage_gpu},
            std::pair<const char*, double>{"usage_cpu", owner.usage_cpu}}) {
        if (!std::isfinite(value) || value < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(at, field, ": must be finite and >= 0, got ", value));
        }
      }
    }
  }
  absl::flat_hash_set<std::string> pending;
  for (const PendingJob& job : jobs) pending.insert(job.job_id);
  absl::flat_hash_set<std::string> running;
  for (const RunningJob& job : input.running) {
    if (job.job_id.empty()) return absl::InvalidArgumentError("running job_id: empty");
    if (!running.insert(job.job_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("running job_id: duplicate \"", job.job_id, "\""));
    }
    const std::string where = absl::StrCat("running job \"", job.job_id, "\": ");
    if (pending.contains(job.job_id)) {
      return absl::InvalidArgumentError(absl::StrCat(where, "job_id: also a pending job"));
    }
    if (job.slots < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "slots: must be >= 0, got ", job.slots));
    }
    if (!input.queues.empty() && !names.contains(QueueName(job.queue))) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "queue: \"", QueueName(job.queue), "\" is not defined"));
    }
  }
  return absl::OkStatus();
}

QueueBook::QueueBook(const QueueInput& input) : implicit_(input.queues.empty()) {
  if (implicit_) {
    // One unlimited queue; running jobs cannot matter to it.
    Queue queue;
    queue.name = "default";
    queue.nominal = {-1, -1};
    queues_.push_back(std::move(queue));
    groups_.push_back(Group{{0}, {}, {}});
    by_name_["default"] = 0;
    return;
  }
  for (const QueueSpec& spec : input.queues) {
    Queue queue;
    queue.name = spec.name;
    queue.cohort = spec.cohort;
    queue.nominal = {spec.nominal_gpu, spec.nominal_cpu};
    const std::array<int, kNumKinds> borrow = {spec.borrowing_limit_gpu, spec.borrowing_limit_cpu};
    const std::array<int, kNumKinds> lend = {spec.lending_limit_gpu, spec.lending_limit_cpu};
    for (int k = 0; k < kNumKinds; ++k) {
      if (queue.nominal[k] < 0) continue;  // unlimited: neither lends nor borrows
      queue.borrow_limit[k] = borrow[k];
      if (lend[k] >= 0) queue.guaranteed[k] = queue.nominal[k] - std::min<long long>(lend[k], queue.nominal[k]);
    }
    queue.usage = {spec.usage_gpu, spec.usage_cpu};
    queue.weight = spec.weight;
    for (const QueueSpec::Owner& owner : spec.owners) {
      Queue::Owner& o = queue.owners[owner.name];
      o.weight = owner.weight;
      o.usage = {owner.usage_gpu, owner.usage_cpu};
    }
    queue.max_job_size = spec.max_job_size;
    queues_.push_back(std::move(queue));
  }
  std::sort(queues_.begin(), queues_.end(),
            [](const Queue& a, const Queue& b) { return a.name < b.name; });
  absl::flat_hash_map<std::string, int> cohorts;
  for (int q = 0; q < size(); ++q) {
    Queue& queue = queues_[q];
    by_name_[queue.name] = q;
    if (queue.cohort.empty()) {
      queue.group = static_cast<int>(groups_.size());
      groups_.emplace_back();
    } else {
      auto [it, added] = cohorts.try_emplace(queue.cohort, static_cast<int>(groups_.size()));
      if (added) groups_.emplace_back();
      queue.group = it->second;
    }
    Group& group = groups_[queue.group];
    group.members.push_back(q);
    for (int k = 0; k < kNumKinds; ++k) {
      if (queue.nominal[k] >= 0) group.nominal[k] += queue.nominal[k] - queue.guaranteed[k];
    }
  }
  for (const RunningJob& job : input.running) {
    const int q = Find(job.queue);
    running_.emplace_back(&job, q);
    const int k = KindIndex(job.kind);
    Queue& queue = queues_[q];
    queue.used[k] += job.slots;
    if (job.stopping) queue.stopping[k] += job.slots;
  }
  for (int g = 0; g < static_cast<int>(groups_.size()); ++g) {
    for (int k = 0; k < kNumKinds; ++k) Recount(g, k);
  }
  std::sort(running_.begin(), running_.end(),
            [](const auto& a, const auto& b) { return a.first->job_id < b.first->job_id; });
}

void QueueBook::Recount(int g, int k) {
  Group& group = groups_[g];
  group.used[k] = 0;
  for (int m : group.members) {
    if (queues_[m].nominal[k] >= 0) group.used[k] += Lent(queues_[m], k, queues_[m].used[k]);
  }
}

int QueueBook::Find(const std::string& name) const {
  if (implicit_) return 0;
  auto it = by_name_.find(QueueName(name));
  return it == by_name_.end() ? -1 : it->second;
}

long long QueueBook::MaxJobSize(int q) const {
  return queues_[q].max_job_size > 0 ? queues_[q].max_job_size : kUnbounded;
}

long long QueueBook::Ceiling(int q, SlotKind kind) const {
  if (!Finite(q, kind)) return kUnbounded;
  const int k = KindIndex(kind);
  const Queue& queue = queues_[q];
  // Its guaranteed part plus everything its group lends (its own lendable
  // part included), up to its borrowing limit.
  long long ceiling = queue.guaranteed[k] + groups_[queue.group].nominal[k];
  if (queue.borrow_limit[k] >= 0) ceiling = std::min(ceiling, queue.nominal[k] + queue.borrow_limit[k]);
  return ceiling;
}

Admission QueueBook::Admit(int q, SlotKind kind, long long slots) const {
  if (!Finite(q, kind)) return Admission::kUnlimited;
  const int k = KindIndex(kind);
  const Queue& queue = queues_[q];
  const Group& group = groups_[queue.group];
  const bool within = queue.used[k] + slots <= queue.nominal[k];
  // What the group's used grows by, against what it has idle (growth 0,
  // within the guaranteed part, fits whatever the others hold).
  const long long growth = Lent(queue, k, queue.used[k] + slots) - Lent(queue, k, queue.used[k]);
  const bool group_fits = growth <= std::max(0LL, group.nominal[k] - group.used[k]);
  if (within) return group_fits ? Admission::kWithinNominal : Admission::kReclaim;
  const bool borrow_allowed =
      queue.borrow_limit[k] < 0 || queue.used[k] + slots <= queue.nominal[k] + queue.borrow_limit[k];
  return group_fits && borrow_allowed ? Admission::kBorrow : Admission::kOverQuota;
}

long long QueueBook::Headroom(int q, SlotKind kind, bool borrow) const {
  if (!Finite(q, kind)) return kUnbounded;
  const int k = KindIndex(kind);
  const Queue& queue = queues_[q];
  const Group& group = groups_[queue.group];
  long long headroom = std::max(0LL, queue.guaranteed[k] - queue.used[k]) +
                       std::max(0LL, group.nominal[k] - group.used[k]);
  if (!borrow) {
    headroom = std::min(headroom, queue.nominal[k] - queue.used[k]);
  } else if (queue.borrow_limit[k] >= 0) {
    headroom = std::min(headroom, queue.nominal[k] + queue.borrow_limit[k] - queue.used[k]);
  }
  return std::max(0LL, headroom);
}

void QueueBook::Charge(int q, SlotKind kind, long long slots, const std::string& owner) {
  const int k = KindIndex(kind);
  Queue& queue = queues_[q];
  queue.used[k] += slots;
  queue.placed[k] += slots;
  queue.owners[owner].placed[k] += slots;
  if (queue.nominal[k] >= 0) Recount(queue.group, k);
}

double QueueBook::Share(int q) const {
  const Queue& queue = queues_[q];
  double share = 0;
  for (int k = 0; k < kNumKinds; ++k) {
    // Nominal 0: the queue only borrows this kind; unlimited: the cluster
    // is its entitlement.
    const long long entitlement = queue.nominal[k] < 0 ? capacity_[k] : queue.nominal[k];
    if (entitlement <= 0) continue;
    share = std::max(share, (queue.usage[k] + static_cast<double>(queue.placed[k])) /
                                static_cast<double>(entitlement));
  }
  return share / queue.weight;
}

double QueueBook::OwnerShare(int q, const std::string& owner) const {
  const Queue& queue = queues_[q];
  auto it = queue.owners.find(owner);
  if (it == queue.owners.end()) return 0;
  const Queue::Owner& o = it->second;
  double share = 0;
  for (int k = 0; k < kNumKinds; ++k) {
    if (capacity_[k] <= 0) continue;
    share = std::max(share, (o.usage[k] + static_cast<double>(o.placed[k])) /
                                static_cast<double>(capacity_[k]));
  }
  return share / o.weight;
}

long long QueueBook::UsedSlots(int q) const {
  long long used = 0;
  for (long long u : queues_[q].used) used += u;
  return used;
}

VictimChoice QueueBook::ChooseVictims(int q, SlotKind kind, int priority, long long need,
                                      long long available) const {
  const int k = KindIndex(kind);
  const Queue& queue = queues_[q];
  const Group& group = groups_[queue.group];
  VictimChoice choice;
  long long stopping_slots = 0;
  for (const auto& [job, jq] : running_) {
    if (job->kind != kind || !job->stopping) continue;
    choice.stopping.push_back(job);
    stopping_slots += job->slots;
  }
  long long picked = 0;
  absl::flat_hash_map<int, long long> picked_from;
  // The queue's own nominal too: a job over it only by the queue's own
  // lower-priority jobs frees them, never borrows through preemption.
  // Each member's used once its stopping jobs and the picks are gone.
  auto used_after = [&](int m) { return queues_[m].used[k] - queues_[m].stopping[k] - picked_from[m]; };
  auto enough = [&] {
    long long group_used = 0;
    for (int m : group.members) {
      if (queues_[m].nominal[k] >= 0) group_used += Lent(queues_[m], k, used_after(m));
    }
    const long long growth = Lent(queue, k, used_after(q) + need) - Lent(queue, k, used_after(q));
    return available + stopping_slots + picked >= need &&
           growth <= std::max(0LL, group.nominal[k] - group_used) &&
           used_after(q) + need <= queue.nominal[k];
  };
  if (enough()) {
    choice.enough = true;
    return choice;
  }
  // Candidates: (a) other queues of the cohort with a finite nominal, while
  // they borrow; (b) lower-priority jobs of the queue itself. Every candidate
  // is in the group, so each pick frees quota as well as slots.
  std::vector<std::pair<const RunningJob*, int>> candidates;
  for (const auto& [job, jq] : running_) {
    if (job->kind != kind || job->stopping || job->slots <= 0) continue;
    const bool same_queue_lower = jq == q && job->priority < priority;
    const bool cohort_peer = jq != q && queues_[jq].group == queue.group && Finite(jq, kind);
    if (same_queue_lower || cohort_peer) candidates.emplace_back(job, jq);
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const auto& a, const auto& b) { return VictimBefore(*a.first, *b.first); });
  for (const auto& [job, jq] : candidates) {
    if (jq != q) {
      const Queue& peer = queues_[jq];
      const bool borrowing = used_after(jq) > peer.nominal[k];
      if (!borrowing) continue;
    }
    choice.victims.push_back(job);
    picked_from[jq] += job->slots;
    picked += job->slots;
    if (enough()) {
      choice.enough = true;
      return choice;
    }
  }
  choice.victims.clear();
  return choice;
}

std::string QueueBook::QuotaText(int q, SlotKind kind) const {
  const int k = KindIndex(kind);
  const Queue& queue = queues_[q];
  const char* kind_name = SlotKindName(kKinds[k]);
  if (queue.nominal[k] < 0) {
    return absl::StrCat("queue ", queue.name, ": ", queue.used[k], " ", kind_name,
                        " used, no quota");
  }
  std::string text = absl::StrCat("queue ", queue.name, ": ", queue.used[k], " of ",
                                  queue.nominal[k], " ", kind_name, " used");
  if (queue.borrow_limit[k] >= 0) absl::StrAppend(&text, ", borrowing limit ", queue.borrow_limit[k]);
  if (queue.guaranteed[k] > 0) {
    absl::StrAppend(&text, ", lends at most ", queue.nominal[k] - queue.guaranteed[k]);
  }
  if (!queue.cohort.empty()) {
    const Group& group = groups_[queue.group];
    absl::StrAppend(&text, ", cohort ", queue.cohort, ": ", group.used[k], " of ",
                    group.nominal[k]);
  }
  return text;
}

}  // namespace trainctl::scheduler::internal
