// PrintSpecSummary (format.h): a job's spec as `describe` and `--dry-run`
// show it, engine and command jobs alike.
#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "client/cli/format.h"
#include "common/jobspec/job_spec.h"
#include "common/time_util.h"

namespace trainctl::cli {

namespace {

std::string Num(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrCat(static_cast<int64_t>(v));
  return absl::StrFormat("%g", v);
}

// A dataset in one phrase: "synthetic 3000 × 5, 2 classes, seed 0".
std::string DatasetText(const v1::DatasetSpec& d) {
  switch (d.format_case()) {
    case v1::DatasetSpec::kSynthetic: {
      const v1::SyntheticData& s = d.synthetic();
      std::string out = absl::StrCat("synthetic ", s.length(), " × ", s.size());
      if (s.classes() > 0) {
        absl::StrAppend(&out, ", ", s.classes(), " classes");
      } else {
        absl::StrAppend(&out, ", regression (", s.target_dim(), " targets)");
      }
      absl::StrAppend(&out, ", seed ", s.seed());
      return out;
    }
    case v1::DatasetSpec::kIdx:
      return absl::StrCat("idx ", d.idx().images(), " + ", d.idx().labels());
    case v1::DatasetSpec::kCsv:
      return absl::StrCat("csv ", d.csv().path(), " (label ",
                          d.csv().label_column().empty() ? "last column" : d.csv().label_column(),
                          ")");
    case v1::DatasetSpec::kTensors:
      return absl::StrCat("tensors ", d.tensors().path());
    default:
      return "-";
  }
}

std::string ModelText(const v1::ModelSpec& m) {
  switch (m.kind_case()) {
    case v1::ModelSpec::kMlp: {
      std::vector<std::string> widths = {absl::StrCat(m.mlp().input_dim())};
      for (int h : m.mlp().hidden()) widths.push_back(absl::StrCat(h));
      widths.push_back(absl::StrCat(m.mlp().classes()));
      return absl::StrCat("mlp ", absl::StrJoin(widths, " → "));
    }
    case v1::ModelSpec::kCnn: {
      const v1::CnnModel& c = m.cnn();
      return absl::StrCat("cnn ", c.image_size(), "×", c.image_size(), " → ", c.classes(),
                          " classes, conv ", c.conv1_channels(), "/", c.conv2_channels(),
                          ", hidden ", c.hidden(), c.batch_norm() ? ", batch norm" : "");
    }
    case v1::ModelSpec::kTorchscript:
      return absl::StrCat("torchscript ", m.torchscript().path());
    default:
      return "-";
  }
}

// A "key:" / value row of a two-column summary table.
void AddField(Table& t, const std::string& k, const std::string& v) { t.AddRow({k + ":", v}); }

// The user's program: what runs, where, and with what on top of torchrun's environment.
void AddCommandFields(Table& t, const v1::CommandSpec& c) {
  std::vector<std::string> argv;
  for (const std::string& a : c.argv()) {
    bool plain = !a.empty() && a.find_first_of(" \t'\"$\\") == std::string::npos;
    argv.push_back(plain ? a : absl::StrCat("'", absl::StrReplaceAll(a, {{"'", "'\\''"}}), "'"));
  }
  AddField(t, "command", absl::StrJoin(argv, " "));
  AddField(t, "working dir", c.working_dir().empty() ? "the rank's scratch dir" : c.working_dir());
  std::map<std::string, std::string> env(c.env().begin(), c.env().end());
  if (!env.empty()) AddField(t, "env", absl::StrJoin(env, " ", absl::PairFormatter("=")));
  AddField(t, "local rank",
           c.local_rank() == v1::LOCAL_RANK_MODE_ENV
               ? "LOCAL_RANK (torchrun)"
               : absl::StrCat("LOCAL_RANK and ",
                              c.arg_style() == v1::LOCAL_RANK_ARG_STYLE_DASH ? "--local-rank=N"
                                                                             : "--local_rank=N",
                              " (torch.distributed.launch)"));
}

std::string LoaderText(const v1::DataSpec& d) {
  std::string loader = absl::StrCat("batch ", d.batch_size(), " per rank, ",
                                    d.shuffle() ? "shuffled" : "in order", ", seed ", d.seed());
  if (d.drop_last()) absl::StrAppend(&loader, ", drop_last");
  absl::StrAppend(&loader, ", ", d.num_workers(), " loader threads");
  return loader;
}

std::string TrainingText(const v1::TrainingSpec& tr) {
  std::string training = absl::StrCat(tr.epochs(), " epoch", tr.epochs() == 1 ? "" : "s", ", ",
                                      LowerName(v1::Loss_descriptor(), tr.loss()), " loss");
  if (tr.grad_accumulation() > 1)
    absl::StrAppend(&training, ", accumulate ", tr.grad_accumulation());
  if (tr.max_grad_norm() > 0) absl::StrAppend(&training, ", clip ", Num(tr.max_grad_norm()));
  absl::StrAppend(
      &training, ", amp ",
      tr.amp().enabled() ? LowerName(v1::AmpDtype_descriptor(), tr.amp().dtype()) : "off");
  return training;
}

std::string OptimizerText(const v1::TrainingSpec& tr) {
  std::string opt = absl::StrCat(LowerName(v1::Optimizer_descriptor(), tr.optimizer().name()),
                                 " lr ", Num(tr.optimizer().lr()));
  if (tr.optimizer().weight_decay() > 0)
    absl::StrAppend(&opt, ", weight decay ", Num(tr.optimizer().weight_decay()));
  if (tr.optimizer().momentum() > 0)
    absl::StrAppend(&opt, ", momentum ", Num(tr.optimizer().momentum()));
  absl::StrAppend(&opt, ", schedule ",
                  LowerName(v1::LrSchedule_descriptor(), tr.lr_schedule().name()));
  if (tr.lr_schedule().warmup_steps() > 0)
    absl::StrAppend(&opt, " (warm-up ", tr.lr_schedule().warmup_steps(), " steps)");
  return opt;
}

// trainctl's engine: model, data, loop, optimizer and DDP settings.
void AddEngineFields(Table& t, const v1::JobSpec& spec) {
  AddField(t, "model", ModelText(spec.model()));
  const v1::DataSpec& d = spec.data();
  AddField(t, "train data", DatasetText(d.train()));
  if (d.has_eval()) AddField(t, "eval data", DatasetText(d.eval()));
  AddField(t, "loader", LoaderText(d));
  AddField(t, "training", TrainingText(spec.training()));
  AddField(t, "optimizer", OptimizerText(spec.training()));
  AddField(t, "ddp",
           absl::StrCat("buckets ", Num(spec.ddp().bucket_cap_mb()), " MiB",
                        spec.ddp().find_unused_parameters() ? ", find unused parameters" : "",
                        spec.ddp().comm_hook() > v1::DDP_COMM_HOOK_NONE
                            ? absl::StrCat(", ", LowerName(v1::DdpCommHook_descriptor(),
                                                           spec.ddp().comm_hook()))
                            : "",
                        spec.ddp().comm_hook() == v1::DDP_COMM_HOOK_POWERSGD
                            ? absl::StrCat(" rank ", spec.ddp().powersgd().rank(), " from step ",
                                           spec.ddp().powersgd().start_iter())
                            : ""));
}

std::string CheckpointText(const v1::JobSpec& spec) {
  const v1::CheckpointSpec& c = spec.checkpoint();
  const std::string dir = c.dir().empty() ? "worker work dir" : c.dir();
  if (spec.has_command()) return absl::StrCat(dir, " (TRAINCTL_CHECKPOINT_DIR)");
  return absl::StrCat(dir, ", every ", c.every_epochs(), " epoch(s)",
                      c.every_steps() > 0 ? absl::StrCat(" and ", c.every_steps(), " step(s)") : "",
                      ", keep ", c.keep());
}

std::string RestartText(const v1::RestartSpec& r) {
  std::string restart = absl::StrCat("at most ", r.max_restarts(), " restart(s)");
  if (r.progress_timeout_s() > 0)
    absl::StrAppend(&restart, ", hung after ", r.progress_timeout_s(), "s without progress");
  if (r.progress_timeout_s() < 0) absl::StrAppend(&restart, ", no progress check");
  if (r.on_hang() == v1::HANG_POLICY_FAIL) absl::StrAppend(&restart, ", a hang fails the job");
  return restart;
}

}  // namespace

void PrintSpecSummary(std::ostream& out, const v1::JobSpec& spec, const std::string& indent) {
  Table t({"", ""});
  AddField(t, "ranks",
           absl::StrCat(spec.world_size(), ", device ",
                        LowerName(v1::Device_descriptor(), spec.device()), ", backend ",
                        LowerName(v1::Backend_descriptor(), spec.backend()), ", priority ",
                        spec.priority()));
  AddField(t, "queue",
           spec.queue().empty() ? "(the token's first queue, else default)" : spec.queue());
  if (const int nodes = spec.scheduling().nodes(); nodes > 0) {
    const int each = spec.world_size() / nodes;
    AddField(t, "nodes",
             absl::StrCat("placed on ", nodes, nodes == 1 ? " worker, " : " workers, ", each,
                          each == 1 ? " rank each" : " ranks each", " (scheduling.nodes)"));
  }
  if (const double limit = spec.scheduling().max_runtime_s(); limit > 0) {
    AddField(t, "max runtime",
             absl::StrCat(HumanDuration(absl::Seconds(limit)),
                          " (scheduling.max_runtime_s; past it: TIMEOUT)"));
  }
  if (spec.has_command()) {
    AddCommandFields(t, spec.command());
  } else {
    AddEngineFields(t, spec);
  }
  AddField(t, "checkpoint", CheckpointText(spec));
  if (spec.has_elastic() && spec.elastic().min_ranks() > 0) {
    const v1::ElasticSpec& el = spec.elastic();
    AddField(t, "elastic",
             absl::StrCat(el.min_ranks(), " to ", spec.world_size(), " ranks, replace timeout ",
                          el.replace_timeout_s(), "s, grow ",
                          LowerName(v1::ElasticGrow_descriptor(), el.grow()),
                          el.keep_global_batch() ? ", global batch kept" : ""));
  }
  AddField(t, "restart", RestartText(spec.restart()));
  // Skip the empty header row.
  std::ostringstream body;
  t.Print(body, indent);
  std::string text = body.str();
  out << text.substr(text.find('\n') + 1);
}

void PrintJobStatus(std::ostream& out, const v1::Job& job, absl::Time now,
                    const std::vector<std::string>& continued_by) {
  Table t({"", ""});
  auto row = [&](const std::string& k, const std::string& v) { t.AddRow({k + ":", v}); };
  row("Job", job.id());
  row("Name", job.spec().name());
  row("State", JobStateName(job.state()));
  if (!job.state_reason().empty())
    row("Reason", ContinueLines(job.state_reason(), std::string(12, ' ')));
  if (const std::string& from = job.spec().resume_from().job(); !from.empty()) {
    std::string text = from;
    for (const v1::CheckpointRecord& r : job.checkpoints()) {
      if (r.job_id() != from) continue;
      text = absl::StrCat(from, " (from its checkpoint at epoch ", r.epochs_done(), ", step ",
                          r.global_step(), ")");
      break;
    }
    row("Continues", text);
  }
  if (!continued_by.empty()) row("Continued by", absl::StrJoin(continued_by, ", "));
  int attempts = job.attempts_size();
  row("Attempt", absl::StrCat(attempts == 0 ? "-" : absl::StrCat(attempts), " (restarts ",
                              job.restarts(), " of ", job.spec().restart().max_restarts(), ")"));
  std::string progress = ProgressText(job.progress(), job.state() == v1::JOB_STATE_RUNNING);
  if (!progress.empty()) {
    double f = ProgressFraction(job.progress());
    row("Progress", f >= 0 ? absl::StrCat(ProgressBar(f), "  ", progress) : progress);
  }
  if (job.progress().has_last_eval()) {
    const v1::EvalResult& e = job.progress().last_eval();
    const std::string fields = EvalResultText(e);
    row("Last eval", absl::StrCat("epoch ", e.epoch() + 1, fields.empty() ? "" : ": ", fields));
  }
  row("Submitted",
      absl::StrCat(FormatTimestamp(job.submit_time()), " (", Age(job.submit_time(), now), ")"));
  if (job.has_start_time()) row("Started", FormatTimestamp(job.start_time()));
  if (job.has_end_time()) {
    std::string ended = FormatTimestamp(job.end_time());
    if (job.has_start_time()) {
      absl::StrAppend(
          &ended, " (ran ",
          HumanDuration(FromTimestamp(job.end_time()) - FromTimestamp(job.start_time())), ")");
    }
    row("Ended", ended);
  }
  if (!job.final_model().empty()) row("Final model", job.final_model());
  if (job.checkpoints_size() > 0) {
    // The newest checkpoint and where copies of it are (trainctl checkpoints JOB lists all).
    int64_t step = -1;
    for (const v1::CheckpointRecord& r : job.checkpoints()) step = std::max(step, r.global_step());
    std::vector<std::string> holders;
    std::string text;
    for (const v1::CheckpointRecord& r : job.checkpoints()) {
      if (r.global_step() != step) continue;
      holders.push_back(r.shared() ? "shared dir" : r.worker_id());
      text = absl::StrCat("epoch ", r.epochs_done(), ", step ", r.global_step(),
                          r.job_id() == job.id() ? "" : absl::StrCat(" (of job ", r.job_id(), ")"));
    }
    row("Checkpoint", absl::StrCat(text, " on ", absl::StrJoin(holders, ", ")));
  }
  std::ostringstream body;
  t.Print(body);
  std::string text = body.str();
  out << text.substr(text.find('\n') + 1);
}

}  // namespace trainctl::cli
