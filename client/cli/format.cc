#include "client/cli/format.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/jobspec/job_spec.h"
#include "common/time_util.h"

namespace trainctl::cli {

namespace {

template <typename E>
std::string UpperName(const google::protobuf::EnumDescriptor* d, E v) {
  return absl::AsciiStrToUpper(LowerName(d, v));
}

std::string OrDash(const std::string& s) { return s.empty() ? "-" : s; }

}  // namespace

std::string EnumText(const google::protobuf::EnumDescriptor* d, int number) {
  const google::protobuf::EnumValueDescriptor* value = d->FindValueByNumber(number);
  if (value == nullptr) return absl::StrCat(number);
  return EnumValueName(value);
}

std::string ContinueLines(const std::string& text, const std::string& indent) {
  return absl::StrJoin(absl::StrSplit(text, '\n'), absl::StrCat("\n", indent));
}

void Table::Print(std::ostream& out, const std::string& indent) const {
  std::vector<size_t> widths;
  for (const auto& row : rows_) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows_) {
    std::string line = indent;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

std::string JobStateName(v1::JobState s) { return UpperName(v1::JobState_descriptor(), s); }
std::string AttemptStateName(v1::AttemptState s) {
  return UpperName(v1::AttemptState_descriptor(), s);
}
std::string RankStateName(v1::RankState s) { return UpperName(v1::RankState_descriptor(), s); }
std::string WorkerStateName(v1::WorkerState s) {
  return UpperName(v1::WorkerState_descriptor(), s);
}
std::string FailureKindName(v1::FailureKind k) {
  return LowerName(v1::FailureKind_descriptor(), k);
}

bool ParseJobState(const std::string& text, v1::JobState* out) {
  std::string upper = absl::AsciiStrToUpper(text);
  if (!absl::StartsWith(upper, "JOB_STATE_")) upper = absl::StrCat("JOB_STATE_", upper);
  v1::JobState s;
  if (!v1::JobState_Parse(upper, &s) || s == v1::JOB_STATE_UNSPECIFIED) return false;
  *out = s;
  return true;
}

std::string HumanDuration(absl::Duration d) {
  if (d < absl::ZeroDuration()) d = absl::ZeroDuration();
  int64_t ms = absl::ToInt64Milliseconds(d);
  if (ms < 1000) return absl::StrCat(ms, "ms");
  int64_t s = ms / 1000;
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, (s % 86400) / 3600);
}

absl::StatusOr<absl::Time> ParseSince(const std::string& text, absl::Time now,
                                      const std::string& flag) {
  const std::string what =
      flag + ": '" + text +
      "' is neither a duration back from now (7d, 12h, 30m, 45s, 2w) nor an RFC 3339 time "
      "(2026-05-01T00:00:00Z)";
  if (text.size() >= 2 && std::string("smhdw").find(text.back()) != std::string::npos) {
    double n = 0;
    if (!absl::SimpleAtod(text.substr(0, text.size() - 1), &n) || !std::isfinite(n) ||
        !absl::ascii_isdigit(static_cast<unsigned char>(text[0]))) {
      return absl::InvalidArgumentError(what);
    }
    const absl::Duration unit = text.back() == 's'   ? absl::Seconds(1)
                                : text.back() == 'm' ? absl::Minutes(1)
                                : text.back() == 'h' ? absl::Hours(1)
                                : text.back() == 'd' ? absl::Hours(24)
                                                     : absl::Hours(24 * 7);
    if (n > 1e6) return absl::InvalidArgumentError(flag + ": '" + text + "' reaches back too far");
    return now - n * unit;
  }
  absl::Time t;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, text, &t, &err)) return absl::InvalidArgumentError(what);
  if (t > now) return absl::InvalidArgumentError(flag + ": '" + text + "' is in the future");
  return t;
}

std::string FormatTimestamp(const google::protobuf::Timestamp& ts) {
  if (ts.seconds() == 0 && ts.nanos() == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", FromTimestamp(ts), absl::LocalTimeZone());
}

std::string Age(const google::protobuf::Timestamp& ts, absl::Time now) {
  if (ts.seconds() == 0 && ts.nanos() == 0) return "-";
  absl::Duration d = now - FromTimestamp(ts);
  if (d < absl::Seconds(1)) return "just now";
  return absl::StrCat(HumanDuration(d), " ago");
}

std::string FormatRate(double per_sec) {
  if (per_sec >= 100) return absl::StrFormat("%.0f", per_sec);
  return absl::StrFormat("%.1f", per_sec);
}

std::string ProgressBar(double fraction, int width) {
  fraction = std::clamp(fraction, 0.0, 1.0);
  int full = static_cast<int>(std::floor(fraction * width));
  std::string bar(static_cast<size_t>(full), '=');
  if (full < width) {
    bar += '>';
    bar += std::string(static_cast<size_t>(width - full - 1), ' ');
  }
  return absl::StrFormat("[%s] %3d%%", bar, static_cast<int>(std::floor(fraction * 100)));
}

double ProgressFraction(const v1::Progress& p) {
  if (p.epochs() <= 0 || p.steps_per_epoch() <= 0) return -1;
  double done = static_cast<double>(p.epoch()) * p.steps_per_epoch() + p.step();
  return std::clamp(done / (static_cast<double>(p.epochs()) * p.steps_per_epoch()), 0.0, 1.0);
}

std::string ProgressText(const v1::Progress& p, bool running) {
  // Epochs are known from the spec before anything trained: say nothing then.
  if (p.steps_per_epoch() <= 0 && p.step() <= 0 && !p.has_last_loss() && p.samples_per_sec() <= 0)
    return "";
  std::vector<std::string> parts;
  if (p.epochs() > 0)
    parts.push_back(absl::StrCat("epoch ", std::min(p.epoch() + 1, p.epochs()), "/", p.epochs()));
  if (p.steps_per_epoch() > 0) {
    parts.push_back(absl::StrCat("step ", p.step(), "/", p.steps_per_epoch()));
  } else if (p.step() > 0) {
    parts.push_back(absl::StrCat("step ", p.step()));
  }
  if (p.has_last_loss()) parts.push_back(absl::StrFormat("loss %.4f", p.last_loss()));
  if (running && p.samples_per_sec() > 0) {
    parts.push_back(absl::StrCat(FormatRate(p.samples_per_sec()), " samples/s"));
  }
  if (running && p.eta_seconds() > 0) {
    parts.push_back(absl::StrCat("ETA ", HumanDuration(absl::Seconds(p.eta_seconds()))));
  }
  if (parts.empty()) return "";
  return absl::StrJoin(parts, "  ");
}

std::string SlotText(const v1::Slot& slot) {
  std::string kind = slot.kind() == v1::Slot::KIND_GPU ? "gpu" : "cpu";
  std::string out = absl::StrCat(kind, ":", slot.index());
  if (!slot.name().empty()) absl::StrAppend(&out, " (", slot.name(), ")");
  return out;
}

std::string ExitText(const v1::RankAssignment& r) {
  if (!r.has_exit()) return "-";
  const v1::ExitInfo& e = r.exit();
  std::string out;
  if (e.signal() != 0) {
    out = absl::StrCat("signal ", e.signal());
  } else if (r.state() == v1::RANK_STATE_SUCCEEDED && e.exit_code() == 0 && e.message().empty()) {
    return "-";
  } else {
    out = absl::StrCat("exit ", e.exit_code());
  }
  if (e.kind() != v1::FAILURE_KIND_UNSPECIFIED)
    absl::StrAppend(&out, " (", FailureKindName(e.kind()), ")");
  if (!e.message().empty()) absl::StrAppend(&out, ": ", e.message());
  return out;
}

std::string EvalResultText(const v1::EvalResult& e) {
  std::vector<std::string> parts;
  if (e.has_loss()) parts.push_back(absl::StrFormat("loss %.4f", e.loss()));
  if (e.has_accuracy()) parts.push_back(absl::StrFormat("accuracy %.2f%%", e.accuracy() * 100));
  return absl::StrJoin(parts, ", ");
}

std::string MetricSummaryText(const v1::MetricSummary& s) {
  std::vector<std::string> parts;
  if (const v1::EvalResult& e = s.best_eval(); s.has_best_eval() && e.has_accuracy()) {
    parts.push_back(absl::StrFormat("best eval accuracy %.2f%% (epoch %d%s)", e.accuracy() * 100,
                                    e.epoch() + 1,
                                    e.has_loss() ? absl::StrFormat(", loss %.4f", e.loss()) : ""));
  } else if (s.has_best_eval() && e.has_loss()) {
    parts.push_back(absl::StrFormat("best eval loss %.4f (epoch %d)", e.loss(), e.epoch() + 1));
  }
  if (s.train_points() > 0) {
    if (s.has_last_loss()) parts.push_back(absl::StrFormat("last loss %.4f", s.last_loss()));
    if (s.has_mean_samples_per_sec()) {
      parts.push_back(absl::StrCat("mean ", FormatRate(s.mean_samples_per_sec()), " samples/s"));
    }
  }
  return absl::StrJoin(parts, ", ");
}

std::vector<std::pair<const v1::Job*, int>> LineageOrder(const std::vector<v1::Job>& jobs) {
  absl::flat_hash_map<std::string, const v1::Job*> by_id;
  for (const v1::Job& j : jobs) by_id[j.id()] = &j;
  absl::flat_hash_map<std::string, std::vector<const v1::Job*>> children;
  std::vector<const v1::Job*> roots;
  for (const v1::Job& j : jobs) {
    const std::string& from = j.spec().resume_from().job();
    if (!from.empty() && from != j.id() && by_id.contains(from)) {
      children[from].push_back(&j);
    } else {
      roots.push_back(&j);
    }
  }
  std::vector<std::pair<const v1::Job*, int>> out;
  absl::flat_hash_set<const v1::Job*> seen;
  std::function<void(const v1::Job*, int)> walk = [&](const v1::Job* j, int depth) {
    if (!seen.insert(j).second) return;
    out.emplace_back(j, depth);
    auto it = children.find(j->id());
    if (it == children.end()) return;
    // Oldest continuation first: generations read top to bottom.
    for (auto c = it->second.rbegin(); c != it->second.rend(); ++c) walk(*c, depth + 1);
  };
  for (const v1::Job* r : roots) walk(r, 0);
  return out;
}

void PrintJobDescription(std::ostream& out, const v1::Job& job,
                         const std::vector<v1::Event>& events, absl::Time now,
                         const std::vector<std::string>& continued_by) {
  PrintJobStatus(out, job, now, continued_by);
  if (std::string summary = MetricSummaryText(job.metric_summary()); !summary.empty()) {
    out << "Summary:     " << summary << "\n";
  }
  out << "\nSpec:\n";
  PrintSpecSummary(out, job.spec(), "  ");
  for (const v1::Attempt& a : job.attempts()) {
    out << "\nAttempt " << a.number() << ": " << AttemptStateName(a.state());
    if (a.ranks_size() != job.spec().world_size())
      out << ", " << a.ranks_size() << " of " << job.spec().world_size() << " ranks";
    if (a.grow_to() > 0) out << ", stopped to grow to " << a.grow_to() << " ranks";
    if (a.has_start_time()) {
      out << ", " << FormatTimestamp(a.start_time());
      if (a.has_end_time()) out << " → " << FormatTimestamp(a.end_time());
    }
    out << "\n";
    if (!a.reason().empty()) out << "  Reason: " << ContinueLines(a.reason(), "          ") << "\n";
    if (!a.resumed_from().empty()) out << "  Resumed from: " << a.resumed_from() << "\n";
    Table t({"RANK", "NODE", "LOCAL", "HOST", "WORKER", "SLOT", "STATE", "STEP", "EXIT"});
    for (const v1::RankAssignment& r : a.ranks()) {
      t.AddRow({absl::StrCat(r.rank()), absl::StrCat(r.node_rank()), absl::StrCat(r.local_rank()),
                OrDash(r.host()), OrDash(r.worker_id()), SlotText(r.slot()),
                RankStateName(r.state()), absl::StrCat(r.last_step()), ExitText(r)});
    }
    t.Print(out, "  ");
    for (const v1::RankAssignment& r : a.ranks()) {
      if (r.exit().last_log_lines_size() == 0) continue;
      out << "  Last log lines of rank " << r.rank() << ":\n";
      for (const std::string& l : r.exit().last_log_lines()) out << "    " << l << "\n";
    }
  }
  out << "\nEvents:\n";
  if (events.empty()) {
    out << "  (none)\n";
    return;
  }
  Table t({"TIME", "ATTEMPT", "RANK", "TYPE", "MESSAGE"});
  for (const v1::Event& e : events) {
    t.AddRow({FormatTimestamp(e.time()), e.attempt() > 0 ? absl::StrCat(e.attempt()) : "-",
              e.rank() >= 0 ? absl::StrCat(e.rank()) : "-", e.type(), OneLine(e.message())});
  }
  t.Print(out, "  ");
}

std::string OneLine(const std::string& text) {
  std::vector<std::string> parts;
  for (absl::string_view part : absl::StrSplit(text, '\n')) {
    part = absl::StripAsciiWhitespace(part);
    if (!part.empty()) parts.emplace_back(part);
  }
  return absl::StrJoin(parts, " | ");
}

std::string LoadHint(bool torchscript) {
  return torchscript
             ? "TorchScript: torch.jit.load it in Python, or trainctl.load_state_dict(path) for a "
               "state_dict"
             : "torch.load it in Python, or trainctl.load_state_dict(path) for a state_dict";
}

bool IsTorchScriptFile(const std::string& path) {
  // The zip central directory (every member's name) is at the end; 1 MiB
  // holds the names of archives with thousands of tensors.
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return false;
  const std::streamoff size = in.tellg();
  const std::streamoff tail = std::min<std::streamoff>(size, 1 << 20);
  std::string bytes(static_cast<size_t>(tail), '\0');
  in.seekg(size - tail);
  if (!in.read(bytes.data(), tail)) return false;
  return absl::StrContains(bytes, "constants.pkl") && bytes.find("PK\x01\x02") != std::string::npos;
}

std::string ToJson(const google::protobuf::Message& msg) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = false;
  (void)google::protobuf::util::MessageToJsonString(msg, &json, options);
  return json;
}

std::string FirstLine(const std::string& s, size_t max) {
  std::string line = s.substr(0, s.find('\n'));
  if (line.size() > max) line = line.substr(0, max - 3) + "...";
  return line;
}

}  // namespace trainctl::cli
