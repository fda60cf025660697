#include "coordinator/jobs/job_queries.h"

#include <algorithm>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "common/status_macros.h"
#include "common/time_util.h"
#include "coordinator/jobs/job_transitions.h"
#include "coordinator/scheduler/quota.h"

namespace trainctl::coordinator {
namespace {

constexpr int kDefaultPageSize = 100;
constexpr int kMaxPageSize = 1000;
// Bytes of jobs in one ListJobs page (gRPC's default message limit is 4 MiB).
constexpr size_t kMaxListBytes = 2u << 20;

// a + b (each >= 0), at most int64's largest: a stored row's hostile
// resources cannot wrap a queue's sum.
int64_t SaturatingAdd(int64_t a, int64_t b) {
  return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max() : a + b;
}

absl::Status ValidateListRequest(const v1::ListJobsRequest& req, int64_t* before) {
  if (req.page_size() < 0) return absl::InvalidArgumentError("page_size: must be >= 0");
  if (!req.page_token().empty() && !absl::SimpleAtoi(req.page_token(), before)) {
    return absl::InvalidArgumentError("page_token: not a token from a previous response");
  }
  for (int s : req.states()) {
    if (!v1::JobState_IsValid(s) || s == 0)
      return absl::InvalidArgumentError(absl::StrCat("states: unknown state ", s));
  }
  return absl::OkStatus();
}

void AddPlanned(const scheduler::Placement& p, const WorkerRegistry& registry,
                v1::SubmitJobResponse& resp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
  for (const scheduler::RankAssignment& r : p.ranks) {
    v1::RankAssignment* a = resp.add_planned();
    a->set_rank(r.rank);
    a->set_local_rank(r.local_rank);
    a->set_node_rank(r.node_rank);
    a->set_world_size(p.world_size);
    a->set_local_world_size(r.local_world_size);
    a->set_num_nodes(p.num_nodes);
    a->set_worker_id(r.worker_id);
    if (const v1::Worker* w = registry.Find(r.worker_id)) a->set_host(w->hostname());
    a->mutable_slot()->set_index(r.slot);
    a->mutable_slot()->set_kind(p.kind == scheduler::SlotKind::kGpu ? v1::Slot::KIND_GPU
                                                                    : v1::Slot::KIND_CPU);
  }
}

JobGauges::Running RunningGauge(const std::string& id, const JobEntry& e) {
  const v1::Job& job = e.job;
  JobGauges::Running r;
  r.id = id;
  r.samples_per_sec = job.progress().samples_per_sec();
  r.loss = job.progress().last_loss();
  if (job.attempts_size() > 0) r.world_size = job.attempts(job.attempts_size() - 1).ranks_size();
  for (const auto& [rank, p] : e.last_points) {
    r.data_ms += p.data_ms();
    r.compute_ms += p.compute_ms();
    r.comm_ms += p.comm_ms();
    if (rank == 0) r.loss_scale = p.loss_scale();
  }
  if (!e.last_points.empty()) {
    const double n = static_cast<double>(e.last_points.size());
    r.data_ms /= n;
    r.compute_ms /= n;
    r.comm_ms /= n;
  }
  return r;
}

}  // namespace

absl::StatusOr<v1::Job> JobQueries::Get(const std::string& job_id) const {
  const JobEntry* e = book_->Find(job_id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  v1::Job job = e->job;
  if (const std::string* r = book_->PendingReason(job_id)) job.set_state_reason(*r);
  return job;
}

absl::StatusOr<v1::ListJobsResponse> JobQueries::List(const v1::ListJobsRequest& req) const {
  int64_t before = INT64_MAX;
  TRAINCTL_RETURN_IF_ERROR(ValidateListRequest(req, &before));
  const int page =
      req.page_size() == 0 ? kDefaultPageSize : std::min(req.page_size(), kMaxPageSize);
  // Newest first: order by submit_seq descending.
  std::vector<const JobEntry*> all;
  for (const auto& [id, e] : book_->entries()) {
    if (e.submit_seq >= before) continue;
    if (req.states_size() > 0 &&
        std::find(req.states().begin(), req.states().end(), e.job.state()) == req.states().end()) {
      continue;
    }
    all.push_back(&e);
  }
  std::sort(all.begin(), all.end(),
            [](const JobEntry* a, const JobEntry* b) { return a->submit_seq > b->submit_seq; });
  // A page ends at `page` jobs or kMaxListBytes, whichever comes first, so
  // no response can exceed the message limit (specs are at most 1 MiB each).
  v1::ListJobsResponse resp;
  size_t bytes = 0, taken = 0;
  for (; taken < all.size() && static_cast<int>(taken) < page; ++taken) {
    v1::Job j = all[taken]->job;
    j.clear_attempts();
    j.clear_checkpoints();
    if (const std::string* r = book_->PendingReason(j.id())) j.set_state_reason(*r);
    const size_t size = j.ByteSizeLong() + 8;  // with its field tag and length
    if (taken > 0 && bytes + size > kMaxListBytes) break;
    bytes += size;
    *resp.add_jobs() = std::move(j);
  }
  if (taken < all.size()) resp.set_next_page_token(absl::StrCat(all[taken - 1]->submit_seq));
  return resp;
}

absl::StatusOr<v1::SubmitJobResponse> JobQueries::DryRun(const v1::JobSpec& spec) const {
  TRAINCTL_RETURN_IF_ERROR(SpecErrorsToStatus(ValidateJobSpec(spec)));
  v1::SubmitJobResponse resp;
  v1::Job* job = resp.mutable_job();
  *job->mutable_spec() = spec;
  ResolveJobSpecDefaults(job->mutable_spec());
  job->set_state(v1::JOB_STATE_PENDING);
  TRAINCTL_ASSIGN_OR_RETURN(scheduler::ScheduleResult result, placer_->Plan(*job));
  if (!result.placements.empty()) {
    AddPlanned(result.placements[0], *registry_, resp);
  } else if (!result.pending.empty()) {
    resp.set_pending_reason(result.pending[0].message);
  }
  return resp;
}

JobGauges JobQueries::Gauges() const {
  JobGauges g;
  g.straggler_events = health_->straggler_events();
  g.hangs_detected = health_->hangs_detected();
  g.preemptions = placer_->preemptions();
  const absl::Time now = clock_->Now();
  for (const auto& [id, e] : book_->entries()) {
    const v1::Job& job = e.job;
    ++g.jobs_by_state[job.state()];
    if (job.state() == v1::JOB_STATE_PENDING) {
      ++g.queue_length;
      g.oldest_pending_seconds = std::max(
          g.oldest_pending_seconds, absl::ToDoubleSeconds(now - FromTimestamp(job.submit_time())));
    }
    for (int i = 0; i < job.attempts_size(); ++i) {
      const bool followed = i + 1 < job.attempts_size() || job.state() == v1::JOB_STATE_RESTARTING;
      if (job.attempts(i).state() == v1::ATTEMPT_STATE_FAILED && followed) {
        ++g.restarts_by_kind[job.attempts(i).failure_kind()];
      }
    }
    if (job.state() == v1::JOB_STATE_RUNNING) g.running.push_back(RunningGauge(id, e));
  }
  return g;
}

std::map<std::string, QueueUsage> JobQueries::QueueUsages() const {
  std::map<std::string, QueueUsage> out;
  for (const auto& entry : book_->entries()) {
    const v1::Job& job = entry.second.job;
    const v1::JobState state = job.state();
    const bool pending = state == v1::JOB_STATE_PENDING || state == v1::JOB_STATE_RESTARTING;
    const bool running = state == v1::JOB_STATE_SCHEDULED || state == v1::JOB_STATE_RUNNING;
    if (!pending && !running) continue;
    QueueUsage& u = out[job.spec().queue().empty() ? std::string("default") : job.spec().queue()];
    ++(pending ? u.pending_jobs : u.running_jobs);
    const v1::Attempt* attempt = CurrentAttempt(job);
    if (attempt == nullptr) continue;
    // Per rank, as JobPlacer gives the scheduler a running job's resources.
    const v1::ResourceSpec& res = job.spec().resources();
    const int64_t milli_cpus = scheduler::RankMilliCpus(res.cpus());
    const int64_t memory = std::max<int64_t>(0, res.memory());
    for (const v1::RankAssignment& r : attempt->ranks()) {
      if (IsTerminal(r.state())) continue;
      if (r.slot().kind() == v1::Slot::KIND_GPU) {
        ++u.used_gpu;
        if (!r.slot().flavor().empty()) ++u.used_gpu_flavors[r.slot().flavor()];
      }
      if (r.slot().kind() == v1::Slot::KIND_CPU) ++u.used_cpu;
      u.used_milli_cpus = SaturatingAdd(u.used_milli_cpus, milli_cpus);
      u.used_memory_bytes = SaturatingAdd(u.used_memory_bytes, memory);
    }
  }
  return out;
}

absl::StatusOr<UsageReport> JobQueries::Usage(const UsageFilter& filter,
                                              const std::vector<v1::AttemptUsage>& stored) const {
  UsageReport report;
  report.since = filter.since;
  const absl::Time now = clock_->Now();
  report.until = filter.until == absl::InfiniteFuture() ? now : filter.until;
  auto rfc = [](absl::Time t) {
    return absl::FormatTime(absl::RFC3339_sec, t, absl::UTCTimeZone());
  };
  if (filter.since > now) {
    return absl::InvalidArgumentError(absl::StrCat(
        "since: ", rfc(filter.since), " is after the coordinator's now (", rfc(now), ")"));
  }
  if (report.until > now) {
    return absl::InvalidArgumentError(absl::StrCat(
        "until: ", rfc(report.until), " is after the coordinator's now (", rfc(now), ")"));
  }
  if (report.until <= filter.since) {
    return absl::InvalidArgumentError(absl::StrCat(
        "until: ", rfc(report.until), " is not after since (", rfc(filter.since), ")"));
  }
  std::vector<const v1::Job*> jobs;
  jobs.reserve(book_->entries().size());
  for (const auto& entry : book_->entries()) jobs.push_back(&entry.second.job);
  UsageFilter window = filter;
  window.until = report.until;
  std::vector<v1::AttemptUsage> attempts = CollectAttempts(jobs, stored, window);
  if (filter.by == v1::USAGE_GROUPING_ATTEMPT) {
    report.attempts = std::move(attempts);
  } else {
    report.rows = SumAttempts(attempts, window);
  }
  return report;
}

absl::StatusOr<UsageReport> JobQueries::Usage(const UsageFilter& filter) const {
  TRAINCTL_ASSIGN_OR_RETURN(
      std::vector<v1::AttemptUsage> stored,
      store_->usage().LoadAttemptUsage(filter.since, std::min(filter.until, clock_->Now())));
  return Usage(filter, stored);
}

absl::StatusOr<std::vector<v1::Event>> JobQueries::Events(const std::string& job_id,
                                                          int64_t after_seq, int64_t limit) const {
  return store_->jobs().ListEvents(job_id, after_seq, limit);
}

absl::StatusOr<std::vector<v1::LogLine>> JobQueries::Logs(const std::string& job_id,
                                                          int32_t attempt,
                                                          std::optional<int32_t> rank,
                                                          int64_t tail_lines) const {
  return store_->telemetry().ListLogs(job_id, attempt, rank, tail_lines);
}

absl::StatusOr<std::vector<v1::MetricPoint>> JobQueries::Metrics(const std::string& job_id,
                                                                 int64_t limit) const {
  return store_->telemetry().ListMetrics(job_id, limit);
}

absl::StatusOr<MetricPage> JobQueries::MetricsPage(const MetricPageQuery& query) const {
  return store_->telemetry().ListMetricPage(query);
}

}  // namespace trainctl::coordinator
