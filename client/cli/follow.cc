#include "client/cli/follow.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/cli/format.h"
#include "common/time_util.h"

namespace trainctl::cli {

namespace {

// Carriage return, then erase to the end of the line.
constexpr char kClearLine[] = "\r\033[K";

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED ||
         s == v1::JOB_STATE_CANCELLED || s == v1::JOB_STATE_TIMEOUT;
}

}  // namespace

FollowPrinter::FollowPrinter(std::ostream& out, Options options, std::function<absl::Time()> now)
    : out_(out), options_(options), now_(std::move(now)) {}

void FollowPrinter::OnUpdate(const v1::JobUpdate& update) {
  if (options_.json) {
    out_ << ToJson(update) << "\n" << std::flush;
    return;
  }
  if (update.skipped() > skipped_reported_) {
    PrintLine(absl::StrCat("(", update.skipped() - skipped_reported_,
                           " updates skipped: this terminal read too slowly)"));
    skipped_reported_ = update.skipped();
  }
  switch (update.update_case()) {
    case v1::JobUpdate::kEvent:
      PrintEvent(update.event());
      break;
    case v1::JobUpdate::kJob: {
      bool state_changed = !have_job_ || job_.state() != update.job().state();
      job_ = update.job();
      have_job_ = true;
      if (options_.terminal) {
        DrawStatus(/*force=*/state_changed);
        break;
      }
      // Plain: why the job waits, each time the reason changes; a progress
      // line now and then, only when it says something new.
      absl::Time now = now_();
      if (job_.state() == v1::JOB_STATE_PENDING && !job_.state_reason().empty() &&
          job_.state_reason() != last_pending_reason_) {
        PrintLine(absl::StrCat(absl::FormatTime("%H:%M:%S", now, absl::LocalTimeZone()),
                               "  pending  ", OneLine(job_.state_reason())));
        last_pending_reason_ = job_.state_reason();
      }
      std::string progress = ProgressText(job_.progress());
      if (job_.state() == v1::JOB_STATE_RUNNING && !progress.empty() &&
          progress != last_progress_text_ &&
          now - last_progress_line_ >= options_.progress_interval) {
        PrintLine(absl::StrCat(absl::FormatTime("%H:%M:%S", now, absl::LocalTimeZone()),
                               "  progress  ", progress));
        last_progress_line_ = now;
        last_progress_text_ = progress;
      }
      break;
    }
    default:
      // Metric batches: the job snapshots that follow them carry the progress.
      break;
  }
}

void FollowPrinter::PrintEvent(const v1::Event& e) {
  std::string when = absl::FormatTime("%H:%M:%S", FromTimestamp(e.time()), absl::LocalTimeZone());
  std::string who;
  // Name the rank unless the message already starts with it.
  if (e.rank() >= 0 && e.type() != "epoch_end" &&
      !absl::StartsWith(e.message(), absl::StrCat("rank ", e.rank(), " "))) {
    who = absl::StrCat("rank ", e.rank(), ": ");
  }
  PrintLine(absl::StrCat(when, "  ", e.type(), "  ", who, OneLine(e.message())));
}

void FollowPrinter::PrintLine(const std::string& line) {
  ClearStatus();
  out_ << line << "\n";
  if (options_.terminal) DrawStatus(/*force=*/true);
  out_ << std::flush;
}

std::string FollowPrinter::StatusLine() const {
  std::string line = JobStateName(job_.state());
  double f = ProgressFraction(job_.progress());
  if (f >= 0) absl::StrAppend(&line, "  ", ProgressBar(f));
  std::string progress = ProgressText(job_.progress(), job_.state() == v1::JOB_STATE_RUNNING);
  if (!progress.empty()) absl::StrAppend(&line, "  ", progress);
  if (job_.state() == v1::JOB_STATE_PENDING && !job_.state_reason().empty()) {
    absl::StrAppend(&line, "  (", job_.state_reason(), ")");
  }
  return line;
}

void FollowPrinter::DrawStatus(bool force) {
  if (!options_.terminal || !have_job_) return;
  absl::Time now = now_();
  if (!force && now - last_draw_ < options_.redraw_interval) return;
  out_ << kClearLine << StatusLine() << std::flush;
  status_drawn_ = true;
  last_draw_ = now;
}

void FollowPrinter::ClearStatus() {
  if (!status_drawn_) return;
  out_ << kClearLine;
  status_drawn_ = false;
}

void FollowPrinter::Abort() {
  ClearStatus();
  out_ << std::flush;
}

int FollowPrinter::Finish(const v1::Job& job) {
  const bool ok = job.state() == v1::JOB_STATE_SUCCEEDED;
  if (options_.json) {
    out_ << ToJson(job) << "\n" << std::flush;
    return ok ? 0 : 1;
  }
  ClearStatus();
  std::string line = absl::StrCat("job ", job.id(), " ", JobStateName(job.state()));
  if (job.has_start_time() && job.has_end_time()) {
    absl::StrAppend(&line, " after ",
                    HumanDuration(FromTimestamp(job.end_time()) - FromTimestamp(job.start_time())));
  }
  if (!job.state_reason().empty()) {
    // The coordinator's reason, whole: its first line here, the rest (the
    // rank's last log lines, the restart budget) indented below.
    std::vector<std::string> reason = absl::StrSplit(job.state_reason(), '\n');
    absl::StrAppend(&line, ": ", reason[0]);
    for (size_t i = 1; i < reason.size(); ++i) absl::StrAppend(&line, "\n  ", reason[i]);
  }
  if (!IsTerminal(job.state())) {
    absl::StrAppend(&line, "\n(the watch ended before the job did: trainctl status ", job.id(),
                    ")");
  }
  out_ << line << "\n";
  if (ok && job.progress().has_last_eval()) {
    if (std::string eval = EvalResultText(job.progress().last_eval()); !eval.empty()) {
      out_ << "final eval: " << eval << "\n";
    }
  }
  if (ok && !job.final_model().empty()) {
    // The engine exports TorchScript; a command job's program saves what it likes
    // (trainctl.save_model: torch.save), and `trainctl fetch` tells by the bytes.
    out_ << "final model: " << job.final_model() << " (" << LoadHint(!job.spec().has_command())
         << "; on worker " << job.final_model_worker() << ")\n";
  }
  out_ << std::flush;
  return ok ? 0 : 1;
}

}  // namespace trainctl::cli
