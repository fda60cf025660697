#include "coordinator/jobs/usage_report.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "common/time_util.h"
#include "coordinator/jobs/job_transitions.h"

namespace trainctl::coordinator {

namespace {

std::string QueueOf(const v1::Job& job) {
  return job.spec().queue().empty() ? "default" : job.spec().queue();
}

std::string StateWord(const v1::Attempt& a, bool settled) {
  if (!a.preempted_for().empty()) return "preempted";
  if (!a.has_end_time()) return "running";
  std::string name = v1::AttemptState_Name(a.state());
  constexpr absl::string_view kPrefix = "ATTEMPT_STATE_";
  if (absl::StartsWith(name, kPrefix)) name = name.substr(kPrefix.size());
  if (!settled) return "stopping";
  return a.state() == v1::ATTEMPT_STATE_UNSPECIFIED ? "ended" : absl::AsciiStrToLower(name);
}

}  // namespace

bool AttemptSettled(const v1::Attempt& a) {
  if (!a.has_end_time()) return false;
  return std::all_of(a.ranks().begin(), a.ranks().end(),
                     [](const v1::RankAssignment& r) { return IsTerminal(r.state()); });
}

v1::AttemptUsage AttemptUsageOf(const v1::Job& job, const v1::Attempt& a, absl::Time end,
                                bool settled, const std::vector<RankFigures>& figures) {
  v1::AttemptUsage u;
  u.set_job_id(job.id());
  u.set_attempt(a.number());
  u.set_owner(job.owner());
  u.set_queue(QueueOf(job));
  const bool gpu = a.ranks_size() > 0 && a.ranks(0).slot().kind() == v1::Slot::KIND_GPU;
  u.set_kind(gpu ? "gpu" : "cpu");
  u.set_slots(a.ranks_size());
  u.set_cpus_per_rank(job.spec().resources().cpus());
  u.set_memory_limit_bytes(job.spec().resources().memory());
  *u.mutable_start_time() = a.start_time();
  const absl::Time start = FromTimestamp(a.start_time());
  if (settled) SetTimestamp(end, u.mutable_end_time());
  const double wall = std::max(0.0, absl::ToDoubleSeconds(end - start));
  u.set_wall_seconds(wall);
  u.set_slot_seconds(wall * a.ranks_size());
  u.set_gpu_seconds(gpu ? wall * a.ranks_size() : 0);
  if (settled) {
    double cpu = 0;
    int64_t peak = 0;
    int measured = 0;
    for (const RankFigures& f : figures) {
      if (f.cpu_seconds <= 0 && f.peak_memory_bytes <= 0) continue;
      ++measured;
      cpu += f.cpu_seconds;
      peak = std::max(peak, f.peak_memory_bytes);
    }
    u.set_cpu_seconds(cpu);
    u.set_peak_memory_bytes(peak);
    u.set_ranks_measured(measured);
  }
  u.set_state(StateWord(a, settled));
  return u;
}

std::vector<v1::AttemptUsage> CollectAttempts(const std::vector<const v1::Job*>& jobs,
                                              const std::vector<v1::AttemptUsage>& stored,
                                              const UsageFilter& filter) {
  auto wanted = [&](const v1::AttemptUsage& u) {
    if (!filter.queue.empty() && u.queue() != filter.queue) return false;
    if (!filter.owner.empty() && u.owner() != filter.owner) return false;
    const absl::Time start = FromTimestamp(u.start_time());
    const absl::Time end = u.has_end_time() ? FromTimestamp(u.end_time()) : filter.until;
    return end > filter.since && start < filter.until && end > start;
  };
  std::vector<v1::AttemptUsage> out;
  std::set<std::pair<std::string, int32_t>> have;
  for (const v1::AttemptUsage& u : stored) {
    have.insert({u.job_id(), u.attempt()});
    if (wanted(u)) out.push_back(u);
  }
  for (const v1::Job* job : jobs) {
    for (const v1::Attempt& a : job->attempts()) {
      if (a.ranks_size() == 0 || !a.has_start_time()) continue;
      if (have.count({job->id(), a.number()}) > 0) continue;
      const bool settled = AttemptSettled(a);
      v1::AttemptUsage u = AttemptUsageOf(
          *job, a, settled ? FromTimestamp(a.end_time()) : filter.until, settled, {});
      if (wanted(u)) out.push_back(std::move(u));
    }
  }
  std::sort(out.begin(), out.end(), [](const v1::AttemptUsage& x, const v1::AttemptUsage& y) {
    return std::make_tuple(FromTimestamp(x.start_time()), x.job_id(), x.attempt()) <
           std::make_tuple(FromTimestamp(y.start_time()), y.job_id(), y.attempt());
  });
  return out;
}

std::vector<UsageRow> SumAttempts(const std::vector<v1::AttemptUsage>& attempts,
                                  const UsageFilter& filter) {
  // (queue, owner, kind) or, by job, (job id, kind, "").
  using Key = std::tuple<std::string, std::string, std::string>;
  std::map<Key, UsageRow> rows;
  std::map<Key, std::set<std::string>> jobs_of;
  for (const v1::AttemptUsage& u : attempts) {
    const absl::Time start = std::max(FromTimestamp(u.start_time()), filter.since);
    const absl::Time end =
        std::min(u.has_end_time() ? FromTimestamp(u.end_time()) : filter.until, filter.until);
    if (end <= start) continue;
    Key key;
    switch (filter.by) {
      case v1::USAGE_GROUPING_QUEUE:
        key = {u.queue(), "", u.kind()};
        break;
      case v1::USAGE_GROUPING_OWNER:
        key = {"", u.owner(), u.kind()};
        break;
      case v1::USAGE_GROUPING_JOB:
        key = {u.job_id(), u.kind(), ""};
        break;
      default:
        key = {u.queue(), u.owner(), u.kind()};
        break;
    }
    UsageRow& row = rows[key];
    if (filter.by == v1::USAGE_GROUPING_JOB) {
      row.job_id = u.job_id();
      row.queue = u.queue();
      row.owner = u.owner();
      row.kind = u.kind();
    } else {
      row.queue = std::get<0>(key);
      row.owner = std::get<1>(key);
      row.kind = std::get<2>(key);
    }
    const double wall = absl::ToDoubleSeconds(end - start);
    row.wall_seconds += wall;
    row.slot_seconds += wall * u.slots();
    if (u.kind() == "gpu") row.gpu_seconds += wall * u.slots();
    row.cpu_seconds += u.cpu_seconds();
    row.peak_memory_bytes = std::max(row.peak_memory_bytes, u.peak_memory_bytes());
    ++row.attempts;
    jobs_of[key].insert(u.job_id());
  }
  std::vector<UsageRow> out;
  for (auto& [key, row] : rows) {
    row.jobs = static_cast<int>(jobs_of[key].size());
    out.push_back(std::move(row));
  }
  return out;
}

std::vector<UsageRow> SumUsage(const std::vector<const v1::Job*>& jobs, const UsageFilter& filter) {
  return SumAttempts(CollectAttempts(jobs, {}, filter), filter);
}

}  // namespace trainctl::coordinator
