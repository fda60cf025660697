#include "coordinator/jobs/usage_report.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "common/time_util.h"

namespace trainctl::coordinator {

std::vector<UsageRow> SumUsage(const std::vector<const v1::Job*>& jobs, const UsageFilter& filter) {
  using Key = std::tuple<std::string, std::string, std::string>;
  std::map<Key, UsageRow> rows;
  std::map<Key, std::set<std::string>> jobs_of;
  for (const v1::Job* job : jobs) {
    const std::string queue = job->spec().queue().empty() ? "default" : job->spec().queue();
    if (!filter.queue.empty() && queue != filter.queue) continue;
    if (!filter.owner.empty() && job->owner() != filter.owner) continue;
    for (const v1::Attempt& a : job->attempts()) {
      if (a.ranks_size() == 0 || !a.has_start_time()) continue;
      const absl::Time start = std::max(FromTimestamp(a.start_time()), filter.since);
      const absl::Time end = std::min(a.has_end_time() ? FromTimestamp(a.end_time()) : filter.until, filter.until);
      if (end <= start) continue;
      const std::string kind = a.ranks(0).slot().kind() == v1::Slot::KIND_GPU ? "gpu" : "cpu";
      const Key key{queue, job->owner(), kind};
      UsageRow& row = rows[key];
      row.slot_seconds += absl::ToDoubleSeconds(end - start) * a.ranks_size();
      ++row.attempts;
      jobs_of[key].insert(job->id());
    }
  }
  std::vector<UsageRow> out;
  for (auto& [key, row] : rows) {
    row.queue = std::get<0>(key);
    row.owner = std::get<1>(key);
    row.kind = std::get<2>(key);
    row.jobs = static_cast<int>(jobs_of[key].size());
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace trainctl::coordinator
