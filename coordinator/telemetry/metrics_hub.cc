#include "coordinator/telemetry/metrics_hub.h"

#include <algorithm>

namespace trainctl::coordinator {

template <typename Map, typename T>
static void Erase(Map& map, const std::string& job_id, T* s) {
  auto it = map.find(job_id);
  if (it == map.end()) return;
  auto& v = it->second;
  v.erase(std::remove(v.begin(), v.end(), s), v.end());
  if (v.empty()) map.erase(it);
}

void MetricsHub::Unsubscribe(const std::string& job_id, JobSubscriber* s) {
  Erase(jobs_, job_id, s);
}

void MetricsHub::UnsubscribeLogs(const std::string& job_id, LogSubscriber* s) {
  Erase(logs_, job_id, s);
}

void MetricsHub::Publish(const std::string& job_id, const v1::JobUpdate& update) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  for (JobSubscriber* s : it->second) s->Offer(update);
}

void MetricsHub::PublishLogs(const v1::LogChunk& chunk) {
  auto it = logs_.find(chunk.job_id());
  if (it == logs_.end()) return;
  for (LogSubscriber* s : it->second) s->Offer(chunk);
}

void MetricsHub::JobEnded(const std::string& job_id) {
  if (auto it = jobs_.find(job_id); it != jobs_.end()) {
    std::vector<JobSubscriber*> subs = std::move(it->second);
    jobs_.erase(it);
    for (JobSubscriber* s : subs) s->JobEnded();
  }
  if (auto it = logs_.find(job_id); it != logs_.end()) {
    std::vector<LogSubscriber*> subs = std::move(it->second);
    logs_.erase(it);
    for (LogSubscriber* s : subs) s->JobEnded();
  }
}

size_t MetricsHub::watcher_count(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? 0 : it->second.size();
}

}  // namespace trainctl::coordinator
