// Human-readable rendering for the trainctl CLI: tables, state names,
// durations, progress, and the blocks `status` and `describe` print.
//
// Pure functions (the current time is a parameter); thread-safe.
#pragma once

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "google/protobuf/timestamp.pb.h"
#include "trainctl/v1/job.pb.h"
#include "trainctl/v1/worker_service.pb.h"

namespace trainctl::cli {

// Rows of left-aligned columns separated by two spaces (kubectl style); the
// last column is not padded.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // Writes every row, each line prefixed with `indent`.
  void Print(std::ostream& out, const std::string& indent = "") const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// "RUNNING", "SUCCEEDED", ... (the enum name without its prefix).
std::string JobStateName(v1::JobState s);
std::string AttemptStateName(v1::AttemptState s);
std::string RankStateName(v1::RankState s);
std::string WorkerStateName(v1::WorkerState s);
// "exit", "signal", "worker_lost", ...
std::string FailureKindName(v1::FailureKind k);

// Parses a state as users type it: "running", "RUNNING", "JOB_STATE_RUNNING".
bool ParseJobState(const std::string& text, v1::JobState* out);

// "850ms", "12s", "3m05s", "2h07m", "3d04h".
std::string HumanDuration(absl::Duration d);
// `trainctl usage --since`: a duration back from `now` ("7d", "12h", "30m",
// "45s", "2w"; a whole or decimal number and one unit) or an RFC 3339 time
// ("2026-05-01T00:00:00Z", "2026-05-01T09:00:00+02:00"). InvalidArgument
// naming --since (or `flag`: --until takes the same) and what it takes
// otherwise.
absl::StatusOr<absl::Time> ParseSince(const std::string& text, absl::Time now,
                                      const std::string& flag = "--since");
// "2024-05-01 12:00:03" in the local time zone; "-" when unset.
std::string FormatTimestamp(const google::protobuf::Timestamp& ts);
// "3m05s ago"; "-" when unset.
std::string Age(const google::protobuf::Timestamp& ts, absl::Time now);

// The name job.yaml gives value `number` of enum `d` (lower case), else the
// number.
std::string EnumText(const google::protobuf::EnumDescriptor* d, int number);
// The same for a generated enum value.
template <typename E>
std::string LowerName(const google::protobuf::EnumDescriptor* d, E v) {
  return EnumText(d, static_cast<int>(v));
}
// Indents every line of a multi-line text after the first by `indent`.
std::string ContinueLines(const std::string& text, const std::string& indent);

// The first line of `s`, cut to `max` characters ("..." ending a cut one).
std::string FirstLine(const std::string& s, size_t max = 60);
// "1,234.5"-style rates without the thousands separators: "1234.5".
std::string FormatRate(double per_sec);

// "[=========>          ]  45%" for done/total in [0, 1], `width` cells inside.
std::string ProgressBar(double fraction, int width = 20);
// Fraction of training done (over all epochs), or -1 when unknown.
double ProgressFraction(const v1::Progress& p);
// "epoch 2/3  step 40/100  loss 0.6931  1234.5 samples/s  ETA 12s"; parts
// without data are left out; "" when there is no progress at all. The rate
// and the ETA describe a running job: left out unless `running` (a
// cancelled, finished or waiting job has neither).
std::string ProgressText(const v1::Progress& p, bool running = true);

// "cpu:0" / "gpu:1 (NVIDIA H200)".
std::string SlotText(const v1::Slot& slot);
// "exit 1 (exit): message" / "signal 9 (signal)" / "-" for a rank that did not end badly.
std::string ExitText(const v1::RankAssignment& r);

// Writes "key:   value" lines of a spec summary (model, data, training, ...).
void PrintSpecSummary(std::ostream& out, const v1::JobSpec& spec, const std::string& indent);
// The `status` block: id, name, state and reason, the job it continues,
// attempts, progress, times; `continued_by`: the jobs that continue it.
void PrintJobStatus(std::ostream& out, const v1::Job& job, absl::Time now,
                    const std::vector<std::string>& continued_by = {});
// "loss 0.3012, accuracy 91.20%": the fields the evaluation reported ("" for
// none: a script's eval report may carry only scalars of its own).
std::string EvalResultText(const v1::EvalResult& e);
// "best eval accuracy 91.20% (epoch 3, loss 0.3012), last loss 0.2871, mean
// 1234.5 samples/s"; parts without data (not reported) are left out.
std::string MetricSummaryText(const v1::MetricSummary& s);
// The `describe` text: status block, spec summary, every attempt with its
// placement and rank states, then the events.
void PrintJobDescription(std::ostream& out, const v1::Job& job,
                         const std::vector<v1::Event>& events, absl::Time now,
                         const std::vector<std::string>& continued_by = {});

// `list --tree`: jobs (newest first) with each continuation (resume_from)
// right under the job it continues, indented one level per generation;
// (job, depth) in print order. A job whose source is not in `jobs` is a root.
std::vector<std::pair<const v1::Job*, int>> LineageOrder(const std::vector<v1::Job>& jobs);

// A multi-line message (a reason with a rank's last log lines) on one line:
// its trimmed lines joined with " | ".
std::string OneLine(const std::string& text);

// How to load a model or checkpoint file in Python, in parentheses: by its
// format, as torch.load itself tells (a zip archive holding constants.pkl
// is TorchScript: torch.jit.load; anything else: torch.load), and
// trainctl.load_state_dict for a plain state_dict either way.
std::string LoadHint(bool torchscript);
// Whether the file at `path` is a TorchScript archive (its zip directory, at
// the end of the file, names a constants.pkl); false when unreadable.
bool IsTorchScriptFile(const std::string& path);

// One compact JSON document (a single line, protobuf's JSON mapping).
std::string ToJson(const google::protobuf::Message& msg);

}  // namespace trainctl::cli
