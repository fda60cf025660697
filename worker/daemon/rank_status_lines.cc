// What a rank says on its status pipe (worker/protocol/rank_protocol.h) and
// prints, turned into reports for the coordinator: readiness, rank 0's
// store address, progress heartbeats, checkpoints and the final model,
// metrics (batched per attempt, flushed every --metrics-flush), error
// lines kept for the exit report, and log lines (batched per rank, flushed
// every --log-flush, bounded between flushes).
//
// Threading: every function here runs on the daemon's EventLoop.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/time_util.h"
#include "worker/daemon/job_dir.h"
#include "worker/daemon/rank_files.h"
#include "worker/daemon/rank_table_internal.h"

namespace trainctl::worker {

namespace {

v1::RankPhase PhaseOf(const std::string& phase) {
  return phase == "train"        ? v1::RANK_PHASE_TRAIN
         : phase == "eval"       ? v1::RANK_PHASE_EVAL
         : phase == "checkpoint" ? v1::RANK_PHASE_CHECKPOINT
                                 : v1::RANK_PHASE_INIT;
}

v1::CollectiveOp OpOf(const std::string& op) {
  return op == "allreduce"   ? v1::COLLECTIVE_OP_ALL_REDUCE
         : op == "broadcast" ? v1::COLLECTIVE_OP_BROADCAST
         : op == "barrier"   ? v1::COLLECTIVE_OP_BARRIER
                             : v1::COLLECTIVE_OP_UNSPECIFIED;
}

// A `progress` line (with its collective heartbeat, when it has one).
v1::WorkerMessage ProgressMessage(const std::string& job_id, int32_t attempt, int32_t rank,
                                  pid_t pid, const rankproto::StatusMessage& msg) {
  v1::WorkerMessage m;
  v1::RankProgress* p = AboutRank(m.mutable_progress(), job_id, attempt, rank);
  p->set_epoch(msg.epoch);
  p->set_step(msg.step);
  if (const rankproto::RankHeartbeat& hb = msg.heartbeat; hb.present) {
    p->set_has_heartbeat(true);
    p->set_phase(PhaseOf(hb.phase));
    p->set_collective_seq(hb.seq);
    p->set_waiting_seq(hb.waiting_seq);
    p->set_op(OpOf(hb.op));
    p->set_op_step(hb.op_step);
    p->set_op_bucket(hb.op_bucket);
    p->set_waiting_ms(hb.waiting_ms);
    p->set_p99_step_ms(hb.p99_step_ms);
    p->set_compute_ms(hb.compute_ms);
    p->set_stack_moves(hb.stack_moves);
    p->set_torch_wait_ms(hb.torch_wait_ms);
    p->set_pid(static_cast<int32_t>(pid));
  }
  return m;
}

// A `checkpoint` line: the record the coordinator keeps for resuming.
v1::WorkerMessage CheckpointMessage(const std::string& job_id, int32_t attempt, int32_t rank,
                                    const rankproto::CheckpointNote& c) {
  v1::WorkerMessage m;
  v1::CheckpointReport* rep = AboutRank(m.mutable_checkpoint(), job_id, attempt, rank);
  v1::CheckpointRecord* rec = rep->mutable_record();
  rec->set_epochs_done(c.epochs_done);
  rec->set_global_step(c.global_step);
  rec->set_epoch_consumed(c.epoch_consumed);
  rec->set_size_bytes(c.size_bytes);
  rec->set_checksum(c.checksum);
  rec->set_path(c.path);  // absolute: the rank got an absolute checkpoint dir
  return m;
}

// A `metric` line as a point of the attempt's next MetricBatch: only the
// fields the line carried are set (a script's report names what it has).
v1::MetricPoint MetricPointOf(int32_t rank, const rankproto::RankMetric& rm, absl::Time now) {
  v1::MetricPoint p;
  p.set_kind(rm.kind == "epoch_end" ? v1::MetricPoint::KIND_EPOCH_END
             : rm.kind == "eval"    ? v1::MetricPoint::KIND_EVAL
                                    : v1::MetricPoint::KIND_TRAIN);
  p.set_rank(rank);
  p.set_epoch(rm.epoch);
  p.set_step(rm.step);
  SetTimestamp(now, p.mutable_time());
  if (rm.Reports("steps_per_epoch")) p.set_steps_per_epoch(rm.steps_per_epoch);
  if (rm.Reports("loss")) p.set_loss(rm.loss);
  if (rm.Reports("lr")) p.set_lr(rm.lr);
  if (rm.Reports("samples_per_sec")) p.set_samples_per_sec(rm.samples_per_sec);
  if (rm.Reports("data_ms")) p.set_data_ms(rm.data_ms);
  if (rm.Reports("compute_ms")) p.set_compute_ms(rm.compute_ms);
  if (rm.Reports("comm_ms")) p.set_comm_ms(rm.comm_ms);
  if (rm.Reports("loss_scale")) p.set_loss_scale(rm.loss_scale);
  if (rm.Reports("skipped_steps")) p.set_skipped_steps(rm.skipped_steps);
  if (rm.Reports("peak_memory_bytes")) p.set_peak_memory_bytes(rm.peak_memory_bytes);
  if (rm.Reports("samples_seen")) p.set_samples_seen(rm.samples_seen);
  if (rm.has_eval) {
    v1::EvalResult* e = p.mutable_eval();
    e->set_epoch(rm.epoch);
    if (rm.Reports("eval_loss")) e->set_loss(rm.eval_loss);
    if (rm.Reports("eval_accuracy")) e->set_accuracy(rm.eval_accuracy);
    if (rm.Reports("eval_samples")) e->set_samples(rm.eval_samples);
  }
  for (const auto& [name, value] : rm.scalars) (*p.mutable_scalars())[name] = value;
  return p;
}

}  // namespace

void RankTable::WriteCommandTensorBoard(LocalAttempt& a, const rankproto::RankMetric& m) {
  if (a.paths.tensorboard_dir.empty() || a.tensorboard_failed) return;
  auto give_up = [&](const absl::Status& s) {
    a.tensorboard_failed = true;
    LogEvent(LogLevel::kWarn, "worker", "tensorboard_failed",
             {{"job_id", a.job_id},
              {"dir", a.paths.tensorboard_dir},
              {"error", std::string(s.message())}});
  };
  if (a.tensorboard == nullptr) {
    absl::StatusOr<std::unique_ptr<trainer::TensorBoardWriter>> w =
        absl::PermissionDeniedError("cannot take on the ranks' identity");
    {
      // In a directory the job chose: created as its ranks would, never
      // by root where they could not (the writer creates with O_EXCL).
      AsRankUser as_rank_user(a.run_as);
      if (as_rank_user.ok()) w = trainer::TensorBoardWriter::Open(a.paths.tensorboard_dir);
    }
    if (!w.ok()) return give_up(w.status());
    a.tensorboard = *std::move(w);
  }
  std::vector<std::pair<std::string, float>> scalars = trainer::MetricScalars(m);
  if (scalars.empty()) return;
  if (absl::Status s = a.tensorboard->Write(int64_t{m.epoch} * m.steps_per_epoch + m.step, scalars);
      !s.ok()) {
    give_up(s);
  }
}

void RankTable::IgnoredReport(const std::string& key, const std::string& line,
                              const std::string& why) {
  RankLogBatch note;
  note.lines.push_back(
      RankLogLine{2, DaemonClock(options_).Now(),
                  absl::StrCat("[trainctl-worker] ignored status line",
                               why.empty() ? "" : absl::StrCat(" (", why, ")"), ": ", line)});
  note.recent.push_back(note.lines.back().text);
  OnLogBatch(key, note);
}

void RankTable::OnStatusLine(const std::string& key, const std::string& line) {
  loop_.CheckInLoop("RankTable::OnStatusLine");
  LocalAttempt* a = nullptr;
  LocalRank* r = FindRank(key, &a);
  if (r == nullptr) return;
  absl::StatusOr<rankproto::StatusMessage> msg = rankproto::ParseStatusLine(line);
  if (!msg.ok()) {
    IgnoredReport(key, line, "");
    return;
  }
  const int32_t rank = r->assignment.rank();
  switch (msg->type) {
    case rankproto::StatusMessage::Type::kRendezvous: {
      // Rank 0 listens on its store: reported here when the daemon could not
      // reserve its port (RendezvousBackend).
      if (rank != 0 || !a->produce_rendezvous) return;
      absl::StatusOr<std::optional<v1::RendezvousInfo>> info =
          a->rendezvous_backend->RankListening(msg->address);
      if (!info.ok()) {
        IgnoredReport(key, line, std::string(info.status().message()));
      } else if (info->has_value()) {
        ReportRendezvous(*a, **info);
      }
      break;
    }
    case rankproto::StatusMessage::Type::kReady:
      if (r->state.Apply(RankEvent::kReady)) ReportStatus(*a, *r);
      break;
    case rankproto::StatusMessage::Type::kProgress:
      if (msg->heartbeat.present && a->spec.has_command()) r->stack_hook = true;
      out_.Send(ProgressMessage(a->job_id, a->number, rank, r->pid, *msg), false);
      break;
    case rankproto::StatusMessage::Type::kCheckpoint: {
      // Only a file named for the job in its own checkpoint directory is
      // reported: a rank (a command job's fd 3) naming any other path, say
      // the daemon's worker.key, gets no record that a fetch could follow.
      std::optional<std::string> path =
          JobArtifactReport(msg->checkpoint.path, a->job_id, a->paths.checkpoint_dir,
                            a->paths.checkpoint_dir_named, false);
      if (!path.has_value()) {
        IgnoredReport(key, line, "not a checkpoint of this job in its checkpoint.dir");
        return;
      }
      rankproto::CheckpointNote note = msg->checkpoint;
      note.path = *path;
      // The metrics the rank reported before it (an epoch's end) go first:
      // the job's events follow the rank's timeline (issue #27 item 11).
      FlushMetrics();
      out_.Send(CheckpointMessage(a->job_id, a->number, rank, note), true);
      break;
    }
    case rankproto::StatusMessage::Type::kModel: {
      if (rank != 0) return;
      std::optional<std::string> path = JobArtifactReport(
          msg->path, a->job_id, a->paths.checkpoint_dir, a->paths.checkpoint_dir_named, true);
      if (!path.has_value()) {
        IgnoredReport(key, line, "not this job's final model in its checkpoint.dir");
        return;
      }
      v1::WorkerMessage m;
      v1::FinalModelReport* rep = AboutRank(m.mutable_final_model(), a->job_id, a->number, 0);
      rep->set_path(*path);
      FlushMetrics();
      out_.Send(m, true);
      break;
    }
    case rankproto::StatusMessage::Type::kMetric: {
      if (a->command && rank == 0) WriteCommandTensorBoard(*a, msg->metric);
      v1::MetricPoint p = MetricPointOf(rank, msg->metric, DaemonClock(options_).Now());
      if (p.kind() == v1::MetricPoint::KIND_TRAIN) r->last_train = p;
      a->pending_metrics.push_back(std::move(p));
      if (a->pending_metrics.size() > 10000) a->pending_metrics.erase(a->pending_metrics.begin());
      break;
    }
    case rankproto::StatusMessage::Type::kError:
      r->error_kind = msg->error_kind;
      r->error_message = msg->message;
      r->error_step = msg->step;
      break;
  }
}

void RankTable::OnLogBatch(const std::string& key, const RankLogBatch& batch) {
  loop_.CheckInLoop("RankTable::OnLogBatch");
  LocalAttempt* a = nullptr;
  LocalRank* r = FindRank(key, &a);
  if (r == nullptr) return;
  r->dropped += batch.dropped;
  for (const std::string& line : batch.recent) {
    r->last_lines.push_back(line);
    if (r->last_lines.size() > kLastLogLines) r->last_lines.pop_front();
  }
  for (const RankLogLine& line : batch.lines) {
    // Bounded between flushes too (the supervisor's rate makes this rare).
    if (r->pending_logs.size() >= static_cast<size_t>(std::max(options_.log_burst, 1))) {
      ++r->dropped;
      continue;
    }
    v1::LogLine l;
    l.set_rank(r->assignment.rank());
    l.set_stream(line.stream == 1 ? v1::LogLine::STREAM_STDOUT : v1::LogLine::STREAM_STDERR);
    SetTimestamp(line.time, l.mutable_time());
    l.set_text(line.text);
    l.set_seq(r->next_log_seq++);
    r->pending_logs.push_back(std::move(l));
  }
}

void RankTable::FlushMetrics() {
  loop_.CheckInLoop("RankTable::FlushMetrics");
  for (auto& [k, a] : attempts_) {
    if (a->pending_metrics.empty()) continue;
    v1::WorkerMessage m;
    v1::MetricBatch* b = m.mutable_metrics();
    b->set_job_id(a->job_id);
    b->set_attempt(a->number);
    for (auto& p : a->pending_metrics) *b->add_points() = std::move(p);
    a->pending_metrics.clear();
    // Epoch ends and a script's eval reports carry eval results: keep them
    // across a reconnect.
    bool has_eval = false;
    for (const auto& p : b->points()) {
      has_eval |=
          p.kind() == v1::MetricPoint::KIND_EPOCH_END || p.kind() == v1::MetricPoint::KIND_EVAL;
    }
    out_.Send(std::move(m), has_eval);
  }
}

void RankTable::FlushLogs() {
  loop_.CheckInLoop("RankTable::FlushLogs");
  for (auto& [k, a] : attempts_) {
    for (auto& [rank, r] : a->ranks) {
      if (r.pending_logs.empty() && r.dropped == 0) continue;
      v1::WorkerMessage m;
      v1::LogChunk* c = AboutRank(m.mutable_logs(), a->job_id, a->number, rank);
      c->set_dropped_lines(r.dropped);
      for (auto& l : r.pending_logs) *c->add_lines() = std::move(l);
      if (r.dropped > 0) {
        v1::LogLine* note = c->add_lines();
        note->set_rank(rank);
        note->set_stream(v1::LogLine::STREAM_STDERR);
        SetTimestamp(DaemonClock(options_).Now(), note->mutable_time());
        note->set_text(
            absl::StrCat("[trainctl-worker] ", r.dropped, " log lines dropped (rate limit)"));
        note->set_seq(r.next_log_seq++);
      }
      r.pending_logs.clear();
      r.dropped = 0;
      out_.Send(std::move(m), false);
    }
  }
}

}  // namespace trainctl::worker
