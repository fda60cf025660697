#include "coordinator/scheduler/queue_admission.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/format_bytes.h"
#include "coordinator/scheduler/worker_fit.h"

namespace trainctl::scheduler::internal {
namespace {

constexpr SlotKind kKinds[kNumKinds] = {SlotKind::kGpu, SlotKind::kCpu};

const std::string& QueueName(const std::string& name) {
  static const std::string kDefault = "default";
  return name.empty() ? kDefault : name;
}

// A CPU quota field in thousandths, rounded down (-1 stays -1).
long long QuotaMilli(double cpus) { return cpus < 0 ? -1 : MilliDown(cpus); }

// Worst first: one dimension over quota, or borrowing while another must
// reclaim, is over quota; then reclaim, borrow, within nominal.
Admission Combine(Admission a, Admission b) {
  auto rank = [](Admission x) {
    switch (x) {
      case Admission::kUnlimited:
        return 0;
      case Admission::kWithinNominal:
        return 1;
      case Admission::kBorrow:
        return 2;
      case Admission::kReclaim:
        return 3;
      case Admission::kOverQuota:
        return 4;
    }
    return 4;
  };
  if ((a == Admission::kBorrow && b == Admission::kReclaim) ||
      (a == Admission::kReclaim && b == Admission::kBorrow)) {
    return Admission::kOverQuota;
  }
  return rank(a) >= rank(b) ? a : b;
}

// Preemption order: lowest priority, youngest, fewest slots, job id.
bool VictimBefore(const RunningJob& a, const RunningJob& b) {
  if (a.priority != b.priority) return a.priority < b.priority;
  if (a.start_seq != b.start_seq) return a.start_seq > b.start_seq;
  if (a.slots != b.slots) return a.slots < b.slots;
  return a.job_id < b.job_id;
}

// The value of `flavor` in a per-flavor map, else `absent`.
long long FlavorValue(const std::map<std::string, int>& values, const std::string& flavor,
                      long long absent) {
  auto it = values.find(flavor);
  return it == values.end() ? absent : it->second;
}

}  // namespace

int QueueBook::FlavorDim(const std::string& flavor) const {
  if (flavor.empty()) return -1;
  auto it = flavor_dim_.find(flavor);
  return it == flavor_dim_.end() ? -1 : it->second;
}

Demand QueueBook::PerRank(SlotKind kind, long long milli_cpus, long long memory,
                          const std::string& flavor) const {
  Demand d = Zero();
  d[KindIndex(kind)] = 1;
  d[kCpusDim] = milli_cpus;
  d[kMemoryDim] = Times(memory, 1);
  if (const int f = FlavorDim(flavor); f >= 0 && kind == SlotKind::kGpu) d[f] = 1;
  return d;
}

Demand QueueBook::Held(const RunningJob& job) const {
  const Demand per_rank =
      PerRank(job.kind, job.cpus > 0 ? std::max<long long>(1, MilliUp(job.cpus)) : 0,
              job.memory_bytes, job.gpu_flavor);
  Demand held = Zero();
  for (int d = 0; d < dims(); ++d) held[d] = Times(per_rank[d], job.slots);
  return held;
}

QueueBook::Queue QueueBook::Unlimited(std::string name) const {
  Queue queue;
  queue.name = std::move(name);
  queue.nominal = Demand(static_cast<size_t>(dims()), -1);
  queue.borrow_limit = Demand(static_cast<size_t>(dims()), -1);
  queue.guaranteed = queue.used = queue.stopping = Zero();
  return queue;
}

const char* DimField(int d) {
  return d == kCpusDim ? "resources.cpus" : d == kMemoryDim ? "resources.memory" : "world_size";
}

std::string DimAmount(int d, long long amount) {
  if (d == kCpusDim) return absl::StrCat(CpuText(amount), amount == 1000 ? " cpu" : " cpus");
  if (d == kMemoryDim) return absl::StrCat(FormatBytes(amount), " memory");
  return absl::StrCat(amount, " ", SlotKindName(kKinds[d]), " slots");
}

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
    for (const auto& [field, value] :
         {std::pair<const char*, double>{"nominal_cpus", queue.nominal_cpus},
          std::pair<const char*, double>{"borrowing_limit_cpus", queue.borrowing_limit_cpus},
          std::pair<const char*, double>{"lending_limit_cpus", queue.lending_limit_cpus},
          std::pair<const char*, double>{"nominal_memory_bytes",
                                         static_cast<double>(queue.nominal_memory_bytes)},
          std::pair<const char*, double>{"borrowing_limit_memory_bytes",
                                         static_cast<double>(queue.borrowing_limit_memory_bytes)},
          std::pair<const char*, double>{"lending_limit_memory_bytes",
                                         static_cast<double>(queue.lending_limit_memory_bytes)}}) {
      if (value != -1 && !(std::isfinite(value) && value >= 0 && value < 1e15)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, field, ": must be -1 (unlimited) or finite and >= 0, got ", value));
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
    if (!std::isfinite(job.cpus) || job.cpus < 0 || job.memory_bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "cpus and memory_bytes: must be finite and >= 0, got ", job.cpus,
                       " and ", job.memory_bytes));
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
    queues_.push_back(Unlimited("default"));
    groups_.push_back(Group{{0}, Zero(), Zero()});
    by_name_["default"] = 0;
    return;
  }
  // A dimension per flavor some queue has a nominal for (scheduler.h,
  // "Flavor quotas"); the others limit nobody by flavor.
  std::set<std::string> flavors;
  for (const QueueSpec& spec : input.queues) {
    for (const auto& [flavor, nominal] : spec.nominal_gpu_flavors) flavors.insert(flavor);
  }
  flavors_.assign(flavors.begin(), flavors.end());
  for (int f = 0; f < static_cast<int>(flavors_.size()); ++f)
    flavor_dim_[flavors_[f]] = kBaseDims + f;
  for (const QueueSpec& spec : input.queues) {
    Queue queue = Unlimited(spec.name);
    queue.cohort = spec.cohort;
    Demand borrow = queue.borrow_limit, lend = queue.borrow_limit;
    // Each base dimension's nominal, borrowing limit and lending limit.
    const long long base[3][kBaseDims] = {
        {spec.nominal_gpu, spec.nominal_cpu, QuotaMilli(spec.nominal_cpus),
         spec.nominal_memory_bytes < 0 ? -1 : spec.nominal_memory_bytes},
        {spec.borrowing_limit_gpu, spec.borrowing_limit_cpu, QuotaMilli(spec.borrowing_limit_cpus),
         std::max<long long>(-1, spec.borrowing_limit_memory_bytes)},
        {spec.lending_limit_gpu, spec.lending_limit_cpu, QuotaMilli(spec.lending_limit_cpus),
         std::max<long long>(-1, spec.lending_limit_memory_bytes)}};
    for (int k = 0; k < kBaseDims; ++k) {
      queue.nominal[k] = base[0][k];
      borrow[k] = base[1][k];
      lend[k] = base[2][k];
    }
    for (int f = 0; f < static_cast<int>(flavors_.size()); ++f) {
      const std::string& flavor = flavors_[f];
      queue.nominal[kBaseDims + f] = FlavorValue(spec.nominal_gpu_flavors, flavor, -1);
      borrow[kBaseDims + f] = FlavorValue(spec.borrowing_limit_gpu_flavors, flavor, -1);
      lend[kBaseDims + f] = FlavorValue(spec.lending_limit_gpu_flavors, flavor, -1);
    }
    for (int k = 0; k < dims(); ++k) {
      if (queue.nominal[k] < 0) continue;  // unlimited: neither lends nor borrows
      queue.borrow_limit[k] = borrow[k];
      if (lend[k] >= 0)
        queue.guaranteed[k] = queue.nominal[k] - std::min<long long>(lend[k], queue.nominal[k]);
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
      groups_.push_back(Group{{}, Zero(), Zero()});
    } else {
      auto [it, added] = cohorts.try_emplace(queue.cohort, static_cast<int>(groups_.size()));
      if (added) groups_.push_back(Group{{}, Zero(), Zero()});
      queue.group = it->second;
    }
    Group& group = groups_[queue.group];
    group.members.push_back(q);
    for (int k = 0; k < dims(); ++k) {
      if (queue.nominal[k] >= 0) group.nominal[k] += queue.nominal[k] - queue.guaranteed[k];
    }
  }
  for (const RunningJob& job : input.running) {
    const int q = Find(job.queue);
    running_.emplace_back(&job, q);
    Queue& queue = queues_[q];
    const Demand held = Held(job);
    for (int k = 0; k < dims(); ++k) {
      queue.used[k] += held[k];
      if (job.stopping) queue.stopping[k] += held[k];
    }
  }
  for (int g = 0; g < static_cast<int>(groups_.size()); ++g) {
    for (int k = 0; k < dims(); ++k) Recount(g, k);
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

long long QueueBook::Ceiling(int q, int k) const {
  if (!Finite(q, k)) return kUnbounded;
  const Queue& queue = queues_[q];
  // Its guaranteed part plus everything its group lends (its own lendable
  // part included), up to its borrowing limit.
  long long ceiling = queue.guaranteed[k] + groups_[queue.group].nominal[k];
  if (queue.borrow_limit[k] >= 0)
    ceiling = std::min(ceiling, queue.nominal[k] + queue.borrow_limit[k]);
  return ceiling;
}

Admission QueueBook::AdmitDim(int q, int k, long long amount) const {
  if (!Finite(q, k)) return Admission::kUnlimited;
  const Queue& queue = queues_[q];
  const Group& group = groups_[queue.group];
  const bool within = queue.used[k] + amount <= queue.nominal[k];
  // What the group's used grows by, against what it has idle (growth 0,
  // within the guaranteed part, fits whatever the others hold).
  const long long growth = Lent(queue, k, queue.used[k] + amount) - Lent(queue, k, queue.used[k]);
  const bool group_fits = growth <= std::max(0LL, group.nominal[k] - group.used[k]);
  if (within) return group_fits ? Admission::kWithinNominal : Admission::kReclaim;
  const bool borrow_allowed = queue.borrow_limit[k] < 0 ||
                              queue.used[k] + amount <= queue.nominal[k] + queue.borrow_limit[k];
  return group_fits && borrow_allowed ? Admission::kBorrow : Admission::kOverQuota;
}

Admission QueueBook::Admit(int q, const Demand& per_rank, long long ranks) const {
  Admission admission = Admission::kUnlimited;
  for (int k = 0; k < dims(); ++k) {
    if (per_rank[k] > 0) admission = Combine(admission, AdmitDim(q, k, Times(per_rank[k], ranks)));
  }
  return admission;
}

long long QueueBook::Headroom(int q, const Demand& per_rank, bool borrow) const {
  const Queue& queue = queues_[q];
  const Group& group = groups_[queue.group];
  long long ranks = kUnbounded;
  for (int k = 0; k < dims(); ++k) {
    if (per_rank[k] <= 0 || !Finite(q, k)) continue;
    long long headroom = std::max(0LL, queue.guaranteed[k] - queue.used[k]) +
                         std::max(0LL, group.nominal[k] - group.used[k]);
    if (!borrow) {
      headroom = std::min(headroom, queue.nominal[k] - queue.used[k]);
    } else if (queue.borrow_limit[k] >= 0) {
      headroom = std::min(headroom, queue.nominal[k] + queue.borrow_limit[k] - queue.used[k]);
    }
    ranks = std::min(ranks, std::max(0LL, headroom) / per_rank[k]);
  }
  return ranks;
}

void QueueBook::Charge(int q, SlotKind kind, const Demand& per_rank, long long ranks,
                       const std::string& owner) {
  const int slot = KindIndex(kind);
  Queue& queue = queues_[q];
  queue.placed[slot] += ranks;
  queue.owners[owner].placed[slot] += ranks;
  for (int k = 0; k < dims(); ++k) {
    if (per_rank[k] <= 0) continue;
    queue.used[k] += Times(per_rank[k], ranks);
    if (queue.nominal[k] >= 0) Recount(queue.group, k);
  }
}

void QueueBook::ChargeFlavor(int q, int d, long long slots) {
  Queue& queue = queues_[q];
  queue.used[d] += slots;
  if (queue.nominal[d] >= 0) Recount(queue.group, d);
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
    share = std::max(
        share, (o.usage[k] + static_cast<double>(o.placed[k])) / static_cast<double>(capacity_[k]));
  }
  return share / o.weight;
}

long long QueueBook::UsedSlots(int q) const {
  long long used = 0;
  for (int k = 0; k < kNumKinds; ++k) used += queues_[q].used[k];
  return used;
}

VictimChoice QueueBook::ChooseVictims(int q, SlotKind kind, int priority, const Demand& per_rank,
                                      long long ranks, long long available,
                                      const std::string& flavor) const {
  // Whether a running job's slots would serve this job once it is gone.
  auto frees_slots = [&](const RunningJob& r) {
    return r.kind == kind && (flavor.empty() || r.gpu_flavor == flavor);
  };
  const Queue& queue = queues_[q];
  const Group& group = groups_[queue.group];
  // The finite dimensions the job uses: the conditions hold in each.
  std::vector<int> dims;
  for (int k = 0; k < this->dims(); ++k) {
    if (per_rank[k] > 0 && Finite(q, k)) dims.push_back(k);
  }
  VictimChoice choice;
  long long stopping_slots = 0;
  for (const auto& [job, jq] : running_) {
    if (!job->stopping) continue;
    // Those of its kind free slots; any that holds a dimension it needs
    // frees quota (and is waited for).
    const Demand held = Held(*job);
    const bool frees_quota =
        std::any_of(dims.begin(), dims.end(), [&](int k) { return held[k] > 0; });
    if (frees_slots(*job)) stopping_slots += job->slots;
    if (frees_slots(*job) || frees_quota) choice.stopping.push_back(job);
  }
  long long picked = 0;  // slots of kind `kind`
  absl::flat_hash_map<int, Demand> picked_from;
  // The queue's own nominal too: a job over it only by the queue's own
  // lower-priority jobs frees them, never borrows through preemption.
  // Each member's used once its stopping jobs and the picks are gone.
  auto used_after = [&](int m, int k) {
    auto it = picked_from.find(m);
    return queues_[m].used[k] - queues_[m].stopping[k] -
           (it == picked_from.end() ? 0 : it->second[k]);
  };
  auto quota_ok = [&] {
    for (int k : dims) {
      const long long need = Times(per_rank[k], ranks);
      long long group_used = 0;
      for (int m : group.members) {
        if (queues_[m].nominal[k] >= 0) group_used += Lent(queues_[m], k, used_after(m, k));
      }
      const long long growth =
          Lent(queue, k, used_after(q, k) + need) - Lent(queue, k, used_after(q, k));
      if (growth > std::max(0LL, group.nominal[k] - group_used) ||
          used_after(q, k) + need > queue.nominal[k]) {
        return false;
      }
    }
    return true;
  };
  auto enough = [&] { return available + stopping_slots + picked >= ranks && quota_ok(); };
  if (enough()) {
    choice.enough = true;
    return choice;
  }
  // Candidates: running jobs that hold some of a dimension in `dims`, (a)
  // of other queues of the cohort with a finite nominal in it, while they
  // borrow it; (b) of a lower priority in the queue itself. Every candidate
  // is in the group, so each pick frees quota as well as slots.
  std::vector<std::tuple<const RunningJob*, int, Demand>> candidates;
  for (const auto& [job, jq] : running_) {
    if (job->stopping || job->slots <= 0) continue;
    const Demand held = Held(*job);
    bool uses = false, peer_finite = false;
    for (int k : dims) {
      if (held[k] <= 0) continue;
      uses = true;
      peer_finite = peer_finite || Finite(jq, k);
    }
    const bool same_queue_lower = jq == q && job->priority < priority;
    const bool cohort_peer = jq != q && queues_[jq].group == queue.group && peer_finite;
    if (uses && (same_queue_lower || cohort_peer)) candidates.emplace_back(job, jq, held);
  }
  std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
    return VictimBefore(*std::get<0>(a), *std::get<0>(b));
  });
  // A flavored job takes victims of its flavor first: their slots serve it
  // and their quota too, so others go only when the quota still lacks.
  if (!flavor.empty()) {
    std::stable_partition(candidates.begin(), candidates.end(),
                          [&](const auto& c) { return frees_slots(*std::get<0>(c)); });
  }
  for (const auto& [job, jq, held] : candidates) {
    if (jq != q) {
      const Queue& peer = queues_[jq];
      bool borrowing = false;
      for (int k : dims) {
        borrowing = borrowing ||
                    (held[k] > 0 && peer.nominal[k] >= 0 && used_after(jq, k) > peer.nominal[k]);
      }
      if (!borrowing) continue;
    }
    // For a flavored job, a victim of another flavor frees only quota: not
    // picked once the quota is there (it would be preempted for nothing).
    if (!flavor.empty() && !frees_slots(*job) && quota_ok()) continue;
    choice.victims.push_back(job);
    Demand& from = picked_from[jq];
    if (from.empty()) from = Zero();
    for (int k = 0; k < this->dims(); ++k) from[k] += held[k];
    if (frees_slots(*job)) picked += job->slots;
    if (enough()) {
      choice.enough = true;
      return choice;
    }
  }
  choice.victims.clear();
  return choice;
}

std::string QueueBook::QuotaText(int q, int k) const {
  const Queue& queue = queues_[q];
  // Slots read "2 of 4 cuda used", a flavor's "2 of 4 cuda (h100) used";
  // CPUs and memory "2 of 4 cpus used".
  const bool slots = k < kNumKinds || k >= kBaseDims;
  const std::string unit = k >= kBaseDims  ? absl::StrCat("cuda (", DimFlavor(k), ")")
                           : k < kNumKinds ? std::string(SlotKindName(kKinds[k]))
                           : k == kCpusDim ? std::string("cpus")
                                           : std::string("memory");
  auto amount = [&](long long v) {
    return slots ? absl::StrCat(v) : k == kCpusDim ? CpuText(v) : FormatBytes(v);
  };
  if (queue.nominal[k] < 0) {
    return absl::StrCat("queue ", queue.name, ": ", amount(queue.used[k]), " ", unit,
                        " used, no quota");
  }
  std::string text = absl::StrCat("queue ", queue.name, ": ", amount(queue.used[k]), " of ",
                                  amount(queue.nominal[k]), " ", unit, " used");
  if (queue.borrow_limit[k] >= 0)
    absl::StrAppend(&text, ", borrowing limit ", amount(queue.borrow_limit[k]));
  if (queue.guaranteed[k] > 0) {
    absl::StrAppend(&text, ", lends at most ", amount(queue.nominal[k] - queue.guaranteed[k]));
  }
  if (!queue.cohort.empty()) {
    const Group& group = groups_[queue.group];
    absl::StrAppend(&text, ", cohort ", queue.cohort, ": ", amount(group.used[k]), " of ",
                    amount(group.nominal[k]));
  }
  return text;
}

std::string QueueBook::QuotaText(int q, const Demand& per_rank, long long ranks) const {
  std::vector<std::string> blocking, finite;
  int slot = 0;
  for (int k = 0; k < dims(); ++k) {
    if (per_rank[k] <= 0) continue;
    if (k < kNumKinds) slot = k;
    if (!Finite(q, k)) continue;
    finite.push_back(QuotaText(q, k));
    if (AdmitDim(q, k, Times(per_rank[k], ranks)) != Admission::kWithinNominal)
      blocking.push_back(finite.back());
  }
  if (!blocking.empty()) return absl::StrJoin(blocking, "; ");
  if (!finite.empty()) return absl::StrJoin(finite, "; ");
  return QuotaText(q, slot);
}

}  // namespace trainctl::scheduler::internal
