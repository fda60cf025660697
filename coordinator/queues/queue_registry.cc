#include "coordinator/queues/queue_registry.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/format_bytes.h"
#include "common/jobspec/gpu_flavor.h"
#include "common/jobspec/job_spec.h"
#include "common/status_macros.h"
#include "common/time_util.h"
#include "coordinator/scheduler/quota.h"

namespace trainctl::coordinator {

absl::Status CheckQueueName(absl::string_view field, absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": required"));
  const bool chars_ok = std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
  if (!chars_ok || name.front() == '-' || name.back() == '-') {
    return absl::InvalidArgumentError(
        absl::StrCat(field,
                     ": must be lower-case letters, digits and '-', starting and ending with a "
                     "letter or digit, got '",
                     name, "'"));
  }
  if (name.size() > 63) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": at most 63 characters, got ", name.size()));
  }
  return absl::OkStatus();
}

namespace {

// Borrowing and lending limits: -1 (none) or >= 0, only for a kind with a
// finite nominal (an unlimited queue neither lends nor borrows), and a
// lending limit no larger than the nominal it lends from.
absl::Status CheckQuotaLimits(const v1::Queue& queue) {
  struct Kind {
    const char* name;
    bool has_nominal;
    int32_t nominal;
    bool has_borrow;
    int32_t borrow;
    bool has_lend;
    int32_t lend;
  };
  const Kind kinds[] = {
      {"gpu", queue.has_nominal_gpu(), queue.nominal_gpu(), queue.has_borrowing_limit_gpu(),
       queue.borrowing_limit_gpu(), queue.has_lending_limit_gpu(), queue.lending_limit_gpu()},
      {"cpu", queue.has_nominal_cpu(), queue.nominal_cpu(), queue.has_borrowing_limit_cpu(),
       queue.borrowing_limit_cpu(), queue.has_lending_limit_cpu(), queue.lending_limit_cpu()},
  };
  for (const Kind& k : kinds) {
    const bool finite = k.has_nominal && k.nominal >= 0;
    for (const auto& [field, set, value] :
         {std::tuple<const char*, bool, int32_t>{"borrowing_limit", k.has_borrow, k.borrow},
          std::tuple<const char*, bool, int32_t>{"lending_limit", k.has_lend, k.lend}}) {
      if (!set || value == -1) continue;
      if (value < -1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "queue.", field, "_", k.name, ": must be -1 (no limit) or >= 0, got ", value));
      }
      if (!finite) {
        return absl::InvalidArgumentError(absl::StrCat(
            "queue.", field, "_", k.name, ": needs a nominal_", k.name,
            " quota (a queue unlimited in ", k.name, " slots neither lends nor borrows them)"));
      }
    }
    if (k.has_lend && k.lend > k.nominal && finite) {
      return absl::InvalidArgumentError(absl::StrCat(
          "queue.lending_limit_", k.name, ": ", k.lend, " is more than the queue's nominal_",
          k.name, " of ", k.nominal, " (it lends only its own quota)"));
    }
  }
  return absl::OkStatus();
}

// The same for the CPU and memory quotas (fields 20-25): each unset, -1, or
// finite and >= 0; a limit only with a finite nominal, a lending limit no
// larger than it.
absl::Status CheckResourceQuotas(const v1::Queue& queue) {
  struct Field {
    std::string name;
    bool set;
    double value;
  };
  struct Resource {
    const char* unit;
    Field nominal, borrow, lend;
  };
  const Resource resources[] = {
      {"cpus",
       {"nominal_cpus", queue.has_nominal_cpus(), queue.nominal_cpus()},
       {"borrowing_limit_cpus", queue.has_borrowing_limit_cpus(), queue.borrowing_limit_cpus()},
       {"lending_limit_cpus", queue.has_lending_limit_cpus(), queue.lending_limit_cpus()}},
      {"memory",
       {"nominal_memory_bytes", queue.has_nominal_memory_bytes(),
        static_cast<double>(queue.nominal_memory_bytes())},
       {"borrowing_limit_memory_bytes", queue.has_borrowing_limit_memory_bytes(),
        static_cast<double>(queue.borrowing_limit_memory_bytes())},
       {"lending_limit_memory_bytes", queue.has_lending_limit_memory_bytes(),
        static_cast<double>(queue.lending_limit_memory_bytes())}},
  };
  for (const Resource& r : resources) {
    for (const Field* f : {&r.nominal, &r.borrow, &r.lend}) {
      if (!f->set || f->value == -1) continue;
      // 1e15 CPUs or bytes is far beyond any cluster and keeps the
      // scheduler's thousandths and sums exact.
      if (!std::isfinite(f->value) || f->value < 0 || f->value >= 1e15) {
        return absl::InvalidArgumentError(absl::StrCat(
            "queue.", f->name, ": must be -1 (", f == &r.nominal ? "unlimited" : "no limit",
            ") or finite, >= 0 and < 1e15, got ", f->value));
      }
    }
    const bool finite = r.nominal.set && r.nominal.value >= 0;
    for (const Field* f : {&r.borrow, &r.lend}) {
      if (f->set && f->value != -1 && !finite) {
        return absl::InvalidArgumentError(absl::StrCat(
            "queue.", f->name, ": needs a ", r.nominal.name, " quota (a queue unlimited in ",
            r.unit, " neither lends nor borrows them)"));
      }
    }
    if (finite && r.lend.set && r.lend.value > r.nominal.value) {
      return absl::InvalidArgumentError(
          absl::StrCat("queue.", r.lend.name, ": ", r.lend.value, " is more than the queue's ",
                       r.nominal.name, " of ", r.nominal.value, " (it lends only its own quota)"));
    }
  }
  return absl::OkStatus();
}

// Per-flavor GPU quotas and their limits: flavors by the one naming rule,
// counts >= 0, a limit only for a flavor with a nominal (as the slot
// kinds' limits need a finite nominal), a lending limit no larger than it.
// Sorted, so that the first bad flavor named is the same every time.
absl::Status CheckFlavorQuotas(const v1::Queue& queue) {
  using FlavorMap = google::protobuf::Map<std::string, int32_t>;
  const std::pair<const char*, const FlavorMap*> fields[] = {
      {"nominal_gpu_flavors", &queue.nominal_gpu_flavors()},
      {"borrowing_limit_gpu_flavors", &queue.borrowing_limit_gpu_flavors()},
      {"lending_limit_gpu_flavors", &queue.lending_limit_gpu_flavors()}};
  for (const auto& [field, values] : fields) {
    const absl::btree_map<std::string, int32_t> sorted(values->begin(), values->end());
    for (const auto& [flavor, value] : sorted) {
      if (std::string problem = GpuFlavorProblem(flavor); !problem.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("queue.", field, ": flavor '", flavor, "' ", problem));
      }
      if (value < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("queue.", field, "[", flavor, "]: must be >= 0 GPU slots, got ", value));
      }
      if (values == &queue.nominal_gpu_flavors()) continue;
      auto nominal = queue.nominal_gpu_flavors().find(flavor);
      if (nominal == queue.nominal_gpu_flavors().end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("queue.", field, "[", flavor, "]: needs a nominal_gpu_flavors[", flavor,
                         "] quota (a queue not limited by a flavor neither lends nor borrows it)"));
      }
      if (values == &queue.lending_limit_gpu_flavors() && value > nominal->second) {
        return absl::InvalidArgumentError(
            absl::StrCat("queue.lending_limit_gpu_flavors[", flavor, "]: ", value,
                         " is more than the queue's nominal_gpu_flavors[", flavor, "] of ",
                         nominal->second, " (it lends only its own quota)"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateQueue(const v1::Queue& queue) {
  TRAINCTL_RETURN_IF_ERROR(CheckQueueName("queue.name", queue.name()));
  const std::pair<const char*, std::optional<int32_t>> nominals[] = {
      {"queue.nominal_gpu",
       queue.has_nominal_gpu() ? std::optional<int32_t>(queue.nominal_gpu()) : std::nullopt},
      {"queue.nominal_cpu",
       queue.has_nominal_cpu() ? std::optional<int32_t>(queue.nominal_cpu()) : std::nullopt},
  };
  for (const auto& nominal : nominals) {
    if (nominal.second.has_value() && *nominal.second < -1) {
      return absl::InvalidArgumentError(
          absl::StrCat(nominal.first, ": must be -1 (unlimited) or >= 0, got ", *nominal.second));
    }
  }
  TRAINCTL_RETURN_IF_ERROR(CheckQuotaLimits(queue));
  TRAINCTL_RETURN_IF_ERROR(CheckResourceQuotas(queue));
  if (!queue.cohort().empty())
    TRAINCTL_RETURN_IF_ERROR(CheckQueueName("queue.cohort", queue.cohort()));
  if (queue.max_job_size() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "queue.max_job_size: must be 0 (no limit) or > 0, got ", queue.max_job_size()));
  }
  if (queue.max_running_jobs_per_owner() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("queue.max_running_jobs_per_owner: must be 0 (no limit) or > 0, got ",
                     queue.max_running_jobs_per_owner()));
  }
  if (queue.max_slots_per_owner() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("queue.max_slots_per_owner: must be 0 (no limit) or > 0, got ",
                     queue.max_slots_per_owner()));
  }
  // 0 is proto3's unset: weight 1.
  if (!std::isfinite(queue.weight()) || queue.weight() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("queue.weight: must be > 0 (0 or unset = 1), got ", queue.weight()));
  }
  // Sorted, so that the first bad owner named is the same every time.
  const absl::btree_map<std::string, double> owners(queue.owner_weights().begin(),
                                                    queue.owner_weights().end());
  for (const auto& [owner, weight] : owners) {
    if (!std::isfinite(weight) || weight <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("queue.owner_weights[\"", absl::CEscape(owner),
                                                     "\"]: must be > 0, got ", weight));
    }
  }
  const std::pair<const char*, double> runtimes[] = {
      {"queue.default_max_runtime_s", queue.default_max_runtime_s()},
      {"queue.max_runtime_s", queue.max_runtime_s()},
  };
  for (const auto& [field, seconds] : runtimes) {
    if (!std::isfinite(seconds) || seconds < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": must be 0 (no limit) or > 0 seconds, got ", seconds));
    }
  }
  if (queue.max_runtime_s() > 0 && queue.default_max_runtime_s() > queue.max_runtime_s()) {
    return absl::InvalidArgumentError(
        absl::StrCat("queue.default_max_runtime_s: ", queue.default_max_runtime_s(),
                     " exceeds the queue's max_runtime_s of ", queue.max_runtime_s()));
  }
  // The same bounds as a job's own resources (one rule: common/jobspec).
  std::vector<SpecError> errors =
      CheckResourceSpec(queue.default_resources(), "queue.default_resources");
  if (!errors.empty()) return absl::InvalidArgumentError(errors.front().ToString());
  TRAINCTL_RETURN_IF_ERROR(CheckFlavorQuotas(queue));
  // Defaults are limits; a flavor is where a job runs, which its submitter
  // says (a CPU job given one would be refused for what it never asked).
  if (!queue.default_resources().gpu_flavor().empty()) {
    return absl::InvalidArgumentError(
        "queue.default_resources.gpu_flavor: a queue gives default limits (cpus, memory, pids), "
        "not a GPU "
        "flavor; jobs name theirs (resources.gpu_flavor)");
  }
  return absl::OkStatus();
}

bool HasResources(const v1::ResourceSpec& r) {
  return r.cpus() != 0 || r.memory() != 0 || r.pids() != 0;
}

scheduler::QueueSpec ToQueueSpec(const v1::Queue& queue) {
  scheduler::QueueSpec spec;
  spec.name = queue.name();
  spec.nominal_gpu = queue.has_nominal_gpu() ? queue.nominal_gpu() : -1;
  spec.nominal_cpu = queue.has_nominal_cpu() ? queue.nominal_cpu() : -1;
  spec.borrowing_limit_gpu = queue.has_borrowing_limit_gpu() ? queue.borrowing_limit_gpu() : -1;
  spec.borrowing_limit_cpu = queue.has_borrowing_limit_cpu() ? queue.borrowing_limit_cpu() : -1;
  spec.lending_limit_gpu = queue.has_lending_limit_gpu() ? queue.lending_limit_gpu() : -1;
  spec.lending_limit_cpu = queue.has_lending_limit_cpu() ? queue.lending_limit_cpu() : -1;
  spec.nominal_cpus = queue.has_nominal_cpus() ? queue.nominal_cpus() : -1;
  spec.nominal_memory_bytes = queue.has_nominal_memory_bytes() ? queue.nominal_memory_bytes() : -1;
  spec.borrowing_limit_cpus = queue.has_borrowing_limit_cpus() ? queue.borrowing_limit_cpus() : -1;
  spec.borrowing_limit_memory_bytes =
      queue.has_borrowing_limit_memory_bytes() ? queue.borrowing_limit_memory_bytes() : -1;
  spec.lending_limit_cpus = queue.has_lending_limit_cpus() ? queue.lending_limit_cpus() : -1;
  spec.lending_limit_memory_bytes =
      queue.has_lending_limit_memory_bytes() ? queue.lending_limit_memory_bytes() : -1;
  spec.nominal_gpu_flavors.insert(queue.nominal_gpu_flavors().begin(),
                                  queue.nominal_gpu_flavors().end());
  spec.borrowing_limit_gpu_flavors.insert(queue.borrowing_limit_gpu_flavors().begin(),
                                          queue.borrowing_limit_gpu_flavors().end());
  spec.lending_limit_gpu_flavors.insert(queue.lending_limit_gpu_flavors().begin(),
                                        queue.lending_limit_gpu_flavors().end());
  spec.cohort = queue.cohort();
  spec.max_job_size = queue.max_job_size();
  spec.max_running_jobs_per_owner = queue.max_running_jobs_per_owner();
  spec.max_slots_per_owner = queue.max_slots_per_owner();
  // Validated at create; a bad stored value weighs 1 rather than making the
  // scheduler refuse every pass.
  const auto usable = [](double w) { return std::isfinite(w) && w > 0; };
  spec.weight = usable(queue.weight()) ? queue.weight() : 1;
  const absl::btree_map<std::string, double> owners(queue.owner_weights().begin(),
                                                    queue.owner_weights().end());
  for (const auto& [owner, weight] : owners) {
    if (usable(weight)) spec.owners.push_back({owner, weight});
  }
  return spec;
}

absl::Status QueueRegistry::Load() {
  CheckLoop();
  TRAINCTL_ASSIGN_OR_RETURN(std::vector<v1::Queue> stored, store_->queues().LoadQueues());
  queues_.clear();
  for (v1::Queue& q : stored) {
    std::string name = q.name();
    queues_.emplace(std::move(name), std::move(q));
  }
  return absl::OkStatus();
}

const v1::Queue* QueueRegistry::Find(absl::string_view name) const {
  CheckLoop();
  auto it = queues_.find(name);
  return it == queues_.end() ? nullptr : &it->second;
}

std::vector<v1::Queue> QueueRegistry::List() const {
  CheckLoop();
  std::vector<v1::Queue> out;
  out.reserve(queues_.size());
  for (const auto& entry : queues_) out.push_back(entry.second);
  return out;
}

std::vector<scheduler::QueueSpec> QueueRegistry::Specs() const {
  CheckLoop();
  std::vector<scheduler::QueueSpec> out;
  out.reserve(queues_.size());
  for (const auto& entry : queues_) out.push_back(ToQueueSpec(entry.second));
  return out;
}

std::string QueueRegistry::NameList() const {
  if (queues_.empty()) return "none";
  std::vector<absl::string_view> names;
  for (const auto& entry : queues_) names.push_back(entry.first);
  return absl::StrJoin(names, ", ");
}

const v1::Queue* QueueRegistry::DefaultQueue() const {
  CheckLoop();
  for (const auto& entry : queues_) {
    if (entry.second.default_queue()) return &entry.second;
  }
  return nullptr;
}

absl::StatusOr<v1::Queue> QueueRegistry::Create(v1::Queue queue, bool update) {
  CheckLoop();
  TRAINCTL_RETURN_IF_ERROR(ValidateQueue(queue));
  // All 0 and unset mean the same (none): store one form.
  if (!HasResources(queue.default_resources())) queue.clear_default_resources();
  // -1 and unset mean the same (unlimited): store one form.
  if (queue.has_nominal_gpu() && queue.nominal_gpu() == -1) queue.clear_nominal_gpu();
  if (queue.has_nominal_cpu() && queue.nominal_cpu() == -1) queue.clear_nominal_cpu();
  if (queue.has_nominal_cpus() && queue.nominal_cpus() == -1) queue.clear_nominal_cpus();
  if (queue.has_nominal_memory_bytes() && queue.nominal_memory_bytes() == -1)
    queue.clear_nominal_memory_bytes();
  auto it = queues_.find(queue.name());
  if (it != queues_.end()) {
    if (!update) {
      return absl::AlreadyExistsError(
          absl::StrCat("queue '", queue.name(), "' already exists (--update replaces it)"));
    }
    *queue.mutable_create_time() = it->second.create_time();
  } else {
    SetTimestamp(clock_->Now(), queue.mutable_create_time());
  }
  // At most one default: the previous one is un-marked first (on disk, then
  // in memory), so a failure between the two writes leaves none, not two.
  std::string unmarked;
  if (queue.default_queue()) {
    for (auto& [name, other] : queues_) {
      if (name == queue.name() || !other.default_queue()) continue;
      v1::Queue plain = other;
      plain.set_default_queue(false);
      TRAINCTL_RETURN_IF_ERROR(store_->queues().PutQueue(plain));
      other = std::move(plain);
      unmarked = name;
    }
  }
  if (absl::Status stored = store_->queues().PutQueue(queue); !stored.ok()) {
    if (unmarked.empty()) return stored;
    return absl::Status(stored.code(),
                        absl::StrCat(stored.message(), " (queue '", unmarked,
                                     "' was already un-marked: no queue is the default now)"));
  }
  queues_[queue.name()] = queue;
  return queue;
}

absl::Status QueueRegistry::Delete(const std::string& name, int pending_jobs, int running_jobs) {
  CheckLoop();
  if (!queues_.contains(name)) {
    return absl::NotFoundError(
        absl::StrCat("no queue named '", name, "' (defined: ", NameList(), ")"));
  }
  if (pending_jobs > 0 || running_jobs > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("queue '", name, "' has ", pending_jobs, " pending and ", running_jobs,
                     " running job(s): cancel them or wait for them to end"));
  }
  TRAINCTL_RETURN_IF_ERROR(store_->queues().DeleteQueue(name));
  queues_.erase(name);
  return absl::OkStatus();
}

absl::Status ResolveQueue(v1::JobSpec& spec, v1::Role role,
                          absl::Span<const std::string> token_queues, const QueueRegistry& queues) {
  if (spec.queue().empty()) {
    if (!token_queues.empty()) {
      spec.set_queue(token_queues.front());
    } else if (const v1::Queue* marked = queues.DefaultQueue(); marked != nullptr) {
      spec.set_queue(marked->name());
    } else if (!queues.empty() && queues.Find(kDefaultQueue) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("queue: this job names no queue and no queue is the default (defined: ",
                       queues.NameList(),
                       "); name one (queue: NAME in the job file, or --queue NAME) or mark one the "
                       "default (trainctl queue "
                       "create NAME --default, or --update --default for an existing one)"));
    } else {
      spec.set_queue(kDefaultQueue);
    }
  }
  TRAINCTL_RETURN_IF_ERROR(CheckQueueName("queue", spec.queue()));
  if (role != v1::ROLE_ADMIN && !token_queues.empty() &&
      std::find(token_queues.begin(), token_queues.end(), spec.queue()) == token_queues.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat("queue: this token may not submit to queue '", spec.queue(),
                     "' (its queues: ", absl::StrJoin(token_queues, ", "), ")"));
  }
  if (queues.empty()) return absl::OkStatus();
  const v1::Queue* q = queues.Find(spec.queue());
  if (q == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("queue: no queue named '", spec.queue(),
                                                   "' (defined: ", queues.NameList(), ")"));
  }
  if (!spec.has_priority()) spec.set_priority(q->default_priority());
  // A job that asks for no resources gets the queue's (validated when the
  // queue was made, and again with the job by ValidateJobSpec).
  // The job's gpu_flavor is not a limit and stays (defaults have none).
  if (!HasResources(spec.resources()) && HasResources(q->default_resources())) {
    std::string flavor = spec.resources().gpu_flavor();
    *spec.mutable_resources() = q->default_resources();
    spec.mutable_resources()->set_gpu_flavor(std::move(flavor));
  }
  // world_size 0 is the default, 1 (ResolveJobSpecDefaults runs later).
  const int32_t least_size = spec.elastic().min_ranks() > 0
                                 ? spec.elastic().min_ranks()
                                 : std::max<int32_t>(1, spec.world_size());
  if (q->max_job_size() > 0 && least_size > q->max_job_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.elastic().min_ranks() > 0 ? "elastic.min_ranks" : "world_size", ": ", least_size,
        " ranks exceed queue '", q->name(), "''s max_job_size of ", q->max_job_size()));
  }
  // Runtime (Slurm's DefaultTime / MaxTime): a job that gives none gets the
  // default, else the maximum; one asking more than the maximum is refused.
  v1::SchedulingSpec* sched = spec.mutable_scheduling();
  if (sched->max_runtime_s() == 0) {  // a negative one is refused by ValidateJobSpec
    sched->set_max_runtime_s(q->default_max_runtime_s() > 0 ? q->default_max_runtime_s()
                                                            : q->max_runtime_s());
  } else if (q->max_runtime_s() > 0 && sched->max_runtime_s() > q->max_runtime_s()) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduling.max_runtime_s: ", sched->max_runtime_s(), " s exceeds queue '",
                     q->name(), "''s max_runtime_s of ", q->max_runtime_s(), " s"));
  }
  if (!spec.scheduling().wait_for_capacity()) {
    TRAINCTL_RETURN_IF_ERROR(RefuseNeverRunnable(spec, least_size, *q, queues));
  }
  return absl::OkStatus();
}

absl::Status RefuseNeverRunnable(const v1::JobSpec& spec, int32_t least_size, const v1::Queue& q,
                                 const QueueRegistry& queues) {
  const std::string wait =
      "; or submit with --wait-for-capacity (scheduling.wait_for_capacity: true) to wait for the "
      "queue to change";
  // A pending job counts at its world_size against the owner's slots
  // (owner_limits.h): a larger one would wait for ever.
  const int32_t world_size = std::max<int32_t>(1, spec.world_size());
  if (q.max_slots_per_owner() > 0 && world_size > q.max_slots_per_owner()) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size: ", world_size, " slots exceed queue '", q.name(),
                     "''s max_slots_per_owner of ", q.max_slots_per_owner(),
                     ": one owner may never hold them; lower world_size", wait));
  }
  const std::vector<scheduler::QueueSpec> specs = queues.Specs();
  // Its flavor's quota in the queue, with what its cohort could lend.
  const std::string& flavor = spec.resources().gpu_flavor();
  if (const std::optional<long long> most = scheduler::QueueFlavorCeiling(specs, q.name(), flavor);
      most.has_value() && least_size > *most) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resources.gpu_flavor: ", least_size, " ", flavor, " GPUs exceed the most queue '",
        q.name(), "' can ever hold of ", flavor, " (", *most,
        ": its nominal_gpu_flavors quota plus what its cohort could lend, within the borrowing "
        "and lending limits); lower world_size",
        wait));
  }
  // CPUs and memory (per rank x least size), whatever the slot kind.
  if (const std::optional<scheduler::ResourceShort> r = scheduler::QueueResourceShort(
          specs, q.name(), least_size, spec.resources().cpus(), spec.resources().memory());
      r.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(r->field, ": the job asks ", r->asks, " (", least_size, " ranks of ",
                     r->field == "resources.cpus" ? absl::StrCat(spec.resources().cpus(), " cpus")
                                                  : FormatBytes(spec.resources().memory()),
                     "); queue '", q.name(), "' with its cohort can hold at most ", r->most,
                     " (its nominal quota plus what its cohort could lend, within the borrowing "
                     "and lending limits); lower it, "
                     "raise the queue's quota or limits",
                     wait));
  }
  // An auto job runs on GPU slots on a cluster with GPUs, else on CPU
  // slots: it is refused only when neither kind could ever hold it.
  std::vector<scheduler::SlotKind> kinds;
  if (spec.device() != v1::DEVICE_CPU) kinds.push_back(scheduler::SlotKind::kGpu);
  if (spec.device() != v1::DEVICE_CUDA) kinds.push_back(scheduler::SlotKind::kCpu);
  std::vector<std::string> shorts;
  for (scheduler::SlotKind kind : kinds) {
    const std::optional<long long> ceiling = scheduler::QueueCeiling(specs, q.name(), kind);
    if (!ceiling.has_value() || least_size <= *ceiling) return absl::OkStatus();
    shorts.push_back(absl::StrCat(*ceiling, " ", scheduler::SlotKindName(kind), " slots"));
  }
  if (shorts.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      spec.elastic().min_ranks() > 0 ? "elastic.min_ranks" : "world_size", ": ", least_size,
      " ranks are more than queue '", q.name(), "' can ever run (", absl::StrJoin(shorts, ", or "),
      ": its nominal quota plus what its cohort could lend, within the borrowing and lending "
      "limits); lower it, "
      "raise the queue's quota or limits",
      wait));
}

}  // namespace trainctl::coordinator
