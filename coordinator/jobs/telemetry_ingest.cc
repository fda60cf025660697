#include "coordinator/jobs/telemetry_ingest.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/time_util.h"

namespace trainctl::coordinator {
namespace {

// The straggler threshold of a job's spec (0: off).
double StragglerThreshold(const v1::JobSpec& spec) {
  const v1::StragglerSpec& st = spec.stragglers();
  if (st.policy() == v1::STRAGGLER_POLICY_OFF) return 0;
  return st.threshold();
}

// A rank's progress: its last step changed (hang detection counts from here).
// A new step of `r` (an attempt of `e`): its progress time, wall for people
// and monotonic for the progress timeout.
void MarkStep(JobEntry& e, int32_t attempt, v1::RankAssignment& r, int64_t step, absl::Time now,
              absl::Time mono) {
  if (step == r.last_step()) return;
  r.set_last_step(step);
  SetTimestamp(now, r.mutable_last_progress_time());
  if (attempt == e.job.attempts_size()) e.progress_mono[r.rank()] = mono;
}

// A train window into the job's summary: only what it reported (a script's
// window may carry a loss and no rate, or nothing but its step).
void FoldTrainPoint(v1::MetricSummary& sum, const v1::MetricPoint& p, int world_size) {
  sum.set_train_points(sum.train_points() + 1);
  if (p.has_samples_per_sec()) {
    // Running mean of one rank's rate, times the ranks: all ranks together.
    // A summary from before rate_points (a mean without it) counted its
    // rates in train_points.
    const int64_t before = sum.has_rate_points()            ? sum.rate_points()
                           : sum.has_mean_samples_per_sec() ? sum.train_points() - 1
                                                            : 0;
    const double world = std::max(1, world_size);
    double rank_mean = sum.mean_samples_per_sec() / world;
    sum.set_rate_points(before + 1);
    rank_mean += (p.samples_per_sec() - rank_mean) / static_cast<double>(sum.rate_points());
    sum.set_mean_samples_per_sec(rank_mean * world);
  }
  if (p.rank() == 0 && p.has_loss()) sum.set_last_loss(p.loss());
}

// Whether evaluation `e` beats `best`: a higher accuracy (any accuracy
// beats none); with no accuracy on either, a lower loss.
bool BetterEval(const v1::EvalResult& e, const v1::EvalResult& best) {
  if (e.has_accuracy() || best.has_accuracy()) {
    return e.has_accuracy() && (!best.has_accuracy() || e.accuracy() > best.accuracy());
  }
  return e.has_loss() && (!best.has_loss() || e.loss() < best.loss());
}

// Rank 0's evaluation (an epoch end's, or a script's eval report) as the
// job's newest, and as its best when it beats the best so far.
void FoldEval(v1::Job& job, const v1::EvalResult& eval) {
  *job.mutable_progress()->mutable_last_eval() = eval;
  v1::MetricSummary* sum = job.mutable_metric_summary();
  if (!sum->has_best_eval() || BetterEval(eval, sum->best_eval())) *sum->mutable_best_eval() = eval;
}

// "eval loss 0.1234, accuracy 90.00%": the fields it has; accuracy in
// percent, as every other line the CLI prints (issue #44 item 10).
std::string EvalText(const v1::EvalResult& e) {
  std::vector<std::string> parts;
  if (e.has_loss()) parts.push_back(absl::StrFormat("eval loss %.4f", e.loss()));
  if (e.has_accuracy()) parts.push_back(absl::StrFormat("accuracy %.2f%%", e.accuracy() * 100));
  return absl::StrJoin(parts, ", ");
}

JobEvent EpochEndEvent(const v1::MetricPoint& p, int32_t epochs, int32_t attempt) {
  std::string msg = absl::StrFormat("epoch %d/%d done", p.epoch() + 1, epochs);
  if (p.has_loss()) absl::StrAppendFormat(&msg, ": loss %.4f", p.loss());
  if (p.has_eval()) {
    if (std::string eval = EvalText(p.eval()); !eval.empty())
      absl::StrAppend(&msg, p.has_loss() ? ", " : ": ", eval);
  }
  return {"epoch_end", msg, attempt, 0};
}

}  // namespace

int64_t GlobalStep(const v1::MetricPoint& p) {
  return static_cast<int64_t>(p.epoch()) * std::max<int64_t>(p.steps_per_epoch(), 1) + p.step();
}

v1::Progress ProgressFromPoints(const v1::Job& job,
                                const absl::flat_hash_map<int32_t, v1::MetricPoint>& last_points,
                                v1::Progress prog) {
  int64_t slowest = INT64_MAX;
  double samples_per_sec = 0, min_rate = 0;
  int64_t seen = 0;
  const v1::MetricPoint* slow_point = nullptr;
  for (const auto& [rank, p] : last_points) {
    if (int64_t g = GlobalStep(p); g < slowest) {
      slowest = g;
      slow_point = &p;
    }
    if (p.has_samples_per_sec()) {
      samples_per_sec += p.samples_per_sec();
      min_rate = min_rate == 0 ? p.samples_per_sec() : std::min(min_rate, p.samples_per_sec());
    }
    seen += p.samples_seen();
  }
  if (slow_point == nullptr) return prog;
  prog.set_epoch(slow_point->epoch());
  prog.set_step(slow_point->step());
  prog.set_steps_per_epoch(slow_point->steps_per_epoch());
  prog.set_samples_seen(seen);
  if (samples_per_sec > 0) prog.set_samples_per_sec(samples_per_sec);
  if (auto it = last_points.find(0); it != last_points.end() && it->second.has_loss()) {
    prog.set_last_loss(it->second.loss());
  }
  int64_t total =
      static_cast<int64_t>(job.spec().training().epochs()) * slow_point->steps_per_epoch();
  int32_t batch_size = job.spec().data().batch_size() * job.spec().training().grad_accumulation();
  if (min_rate > 0 && batch_size > 0 && total > 0) {
    double steps_per_sec = min_rate / batch_size;
    prog.set_eta_seconds(std::max<double>(0, static_cast<double>(total - slowest) / steps_per_sec));
  }
  return prog;
}

absl::Status TelemetryIngest::OnProgress(const std::string& worker_id, const v1::RankProgress& p) {
  v1::Attempt* a = nullptr;
  TRAINCTL_ASSIGN_OR_RETURN(
      JobEntry * e, book_->ForWorker(worker_id, p.job_id(), p.attempt(), p.rank(), false, &a));
  const absl::Time mono = clock_->Mono();
  MarkStep(*e, p.attempt(), *a->mutable_ranks(p.rank()), p.step(), clock_->Now(), mono);
  if (e->job.spec().has_command()) {
    // A script's reports and its start-up hook's heartbeats (script_watch.h).
    if (e->script_watch.attempt() != p.attempt()) e->script_watch.Reset(p.attempt());
    e->script_watch.OnProgress(p, mono);
  } else if (p.has_heartbeat()) {
    if (e->watch.attempt() != p.attempt()) {
      e->watch = RankWatch(rank_watch_);
      e->watch.Reset(p.attempt());
    }
    // Silence and stalls are timed on the monotonic clock.
    e->watch.OnHeartbeat(p, mono, StragglerThreshold(e->job.spec()));
  }
  return absl::OkStatus();
}

std::vector<JobEvent> TelemetryIngest::ApplyPoints(JobEntry& e, v1::Attempt& a,
                                                   const v1::MetricBatch& batch) {
  const absl::Time now = clock_->Now(), mono = clock_->Mono();
  std::vector<JobEvent> events;
  v1::MetricSummary* sum = e.job.mutable_metric_summary();
  for (const v1::MetricPoint& p : batch.points()) {
    MarkStep(e, a.number(), *a.mutable_ranks(p.rank()), GlobalStep(p), now, mono);
    if (p.kind() == v1::MetricPoint::KIND_TRAIN) {
      e.last_points[p.rank()] = p;
      FoldTrainPoint(*sum, p, a.ranks_size());
    }
    if (p.rank() != 0) continue;
    if (p.kind() == v1::MetricPoint::KIND_EVAL && p.has_eval()) FoldEval(e.job, p.eval());
    if (p.kind() != v1::MetricPoint::KIND_EPOCH_END) continue;
    if (p.has_eval()) FoldEval(e.job, p.eval());
    events.push_back(EpochEndEvent(p, e.job.spec().training().epochs(), batch.attempt()));
  }
  return events;
}

bool TelemetryIngest::MakesEvents(const v1::MetricBatch& batch) {
  for (const v1::MetricPoint& p : batch.points()) {
    if (p.rank() == 0 && p.kind() == v1::MetricPoint::KIND_EPOCH_END) return true;
  }
  return false;
}

absl::StatusOr<JobEntry*> TelemetryIngest::MetricsTarget(const std::string& worker_id,
                                                         const v1::MetricBatch& batch,
                                                         v1::Attempt** a) {
  if (batch.points_size() > 10000)
    return absl::InvalidArgumentError("metrics.points: at most 10000 per batch");
  TRAINCTL_ASSIGN_OR_RETURN(
      JobEntry * e, book_->ForWorker(worker_id, batch.job_id(), batch.attempt(), -1, false, a));
  for (const v1::MetricPoint& p : batch.points()) {
    if (p.rank() < 0 || p.rank() >= (*a)->ranks_size() ||
        (*a)->ranks(p.rank()).worker_id() != worker_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics.points.rank: ", p.rank(), " is not on this worker"));
    }
  }
  return e;
}

absl::Status TelemetryIngest::OnMetrics(const std::string& worker_id,
                                        const v1::MetricBatch& batch) {
  v1::Attempt* a = nullptr;
  TRAINCTL_ASSIGN_OR_RETURN(JobEntry * e, MetricsTarget(worker_id, batch, &a));
  TRAINCTL_RETURN_IF_ERROR(store_->telemetry().AppendMetrics(batch));
  return FoldMetrics(*e, *a, batch);
}

absl::Status TelemetryIngest::CheckMetrics(const std::string& worker_id,
                                           const v1::MetricBatch& batch) {
  v1::Attempt* a = nullptr;
  return MetricsTarget(worker_id, batch, &a).status();
}

absl::Status TelemetryIngest::MetricsStored(const std::string& worker_id,
                                            const v1::MetricBatch& batch) {
  v1::Attempt* a = nullptr;
  TRAINCTL_ASSIGN_OR_RETURN(JobEntry * e, MetricsTarget(worker_id, batch, &a));
  return FoldMetrics(*e, *a, batch);
}

absl::Status TelemetryIngest::FoldMetrics(JobEntry& entry, v1::Attempt& a,
                                          const v1::MetricBatch& batch) {
  JobEntry* e = &entry;
  std::vector<JobEvent> events = ApplyPoints(*e, a, batch);
  v1::Progress prog = ProgressFromPoints(e->job, e->last_points, e->job.progress());
  v1::JobUpdate u;
  *u.mutable_metrics() = batch;
  book_->AfterCommit([this, id = e->job.id(), u = std::move(u)]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { hub_->Publish(id, u); });
  if (!events.empty()) {
    v1::Job next = e->job;
    *next.mutable_progress() = std::move(prog);
    return book_->Commit(*e, std::move(next), std::move(events));
  }
  // Progress alone is soft state: kept in memory, persisted with the next
  // transition, published to watchers now.
  *e->job.mutable_progress() = std::move(prog);
  book_->PublishSnapshot(*e);
  return absl::OkStatus();
}

absl::StatusOr<JobEntry*> TelemetryIngest::LogsTarget(const std::string& worker_id,
                                                      const v1::LogChunk& chunk, v1::Attempt** a) {
  if (chunk.lines_size() > 10000)
    return absl::InvalidArgumentError("logs.lines: at most 10000 per chunk");
  return book_->ForWorker(worker_id, chunk.job_id(), chunk.attempt(), chunk.rank(), true, a);
}

absl::Status TelemetryIngest::OnLogs(const std::string& worker_id, const v1::LogChunk& chunk) {
  v1::Attempt* a = nullptr;
  TRAINCTL_ASSIGN_OR_RETURN(JobEntry * e, LogsTarget(worker_id, chunk, &a));
  TRAINCTL_RETURN_IF_ERROR(store_->telemetry().AppendLogs(chunk));
  FoldLogs(*e, *a, chunk);
  return absl::OkStatus();
}

absl::Status TelemetryIngest::CheckLogs(const std::string& worker_id, const v1::LogChunk& chunk) {
  v1::Attempt* a = nullptr;
  return LogsTarget(worker_id, chunk, &a).status();
}

absl::Status TelemetryIngest::LogsStored(const std::string& worker_id, const v1::LogChunk& chunk) {
  v1::Attempt* a = nullptr;
  TRAINCTL_ASSIGN_OR_RETURN(JobEntry * e, LogsTarget(worker_id, chunk, &a));
  FoldLogs(*e, *a, chunk);
  return absl::OkStatus();
}

void TelemetryIngest::FoldLogs(JobEntry& e, const v1::Attempt& a, const v1::LogChunk& chunk) {
  book_->AfterCommit([this, chunk]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { hub_->PublishLogs(chunk); });
  // A hung script's ranks dump their stacks to stderr as they are stopped.
  if (e.job.spec().has_command() && a.state() == v1::ATTEMPT_STATE_FAILED &&
      a.failure_kind() == v1::FAILURE_KIND_HANG) {
    for (const v1::LogLine& l : chunk.lines()) {
      if (l.stream() == v1::LogLine::STREAM_STDERR) {
        stack_dumps_.OnLine(chunk.job_id(), chunk.attempt(), chunk.rank(), l.text());
      }
    }
  }
}

}  // namespace trainctl::coordinator
