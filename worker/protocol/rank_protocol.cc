#include "worker/protocol/rank_protocol.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/safe_file.h"

namespace trainctl::rankproto {
namespace {

std::string Escape(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Unescape(std::string_view v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == '\\' && i + 1 < v.size()) {
      char n = v[++i];
      out += n == 'n' ? '\n' : n == 'r' ? '\r' : n;
    } else {
      out += v[i];
    }
  }
  return out;
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// `text` with line breaks as spaces, so that it fits on one status line.
std::string OneLine(std::string_view text) {
  std::string out;
  for (char c : text) out += (c == '\n' || c == '\r') ? ' ' : c;
  return out;
}

// The metric line's numeric fields after kind= and epoch=, in the order the
// line carries them: one of `real` and `integer` is set.
struct MetricField {
  const char* key;
  double RankMetric::*real;
  int64_t RankMetric::*integer;
  bool eval;  // carried only by metrics with an evaluation
};

constexpr MetricField kMetricFields[] = {
    {"step", nullptr, &RankMetric::step, false},
    {"steps_per_epoch", nullptr, &RankMetric::steps_per_epoch, false},
    {"loss", &RankMetric::loss, nullptr, false},
    {"lr", &RankMetric::lr, nullptr, false},
    {"samples_per_sec", &RankMetric::samples_per_sec, nullptr, false},
    {"data_ms", &RankMetric::data_ms, nullptr, false},
    {"compute_ms", &RankMetric::compute_ms, nullptr, false},
    {"comm_ms", &RankMetric::comm_ms, nullptr, false},
    {"loss_scale", &RankMetric::loss_scale, nullptr, false},
    {"skipped_steps", nullptr, &RankMetric::skipped_steps, false},
    {"peak_memory_bytes", nullptr, &RankMetric::peak_memory_bytes, false},
    {"samples_seen", nullptr, &RankMetric::samples_seen, false},
    {"eval_loss", &RankMetric::eval_loss, nullptr, true},
    {"eval_accuracy", &RankMetric::eval_accuracy, nullptr, true},
    {"eval_samples", nullptr, &RankMetric::eval_samples, true},
};

// Sets metric field `k` from `v`; false when `v` is not a number. Unknown
// keys are ignored: a newer rank may report more.
bool SetMetricField(RankMetric& r, const std::string& k, const std::string& v) {
  if (k == "kind") {
    r.kind = v;
    return true;
  }
  if (absl::StartsWith(k, "s.")) {
    double value = 0;
    const std::string name = k.substr(2);
    if (!IsScalarName(name) || r.scalars.size() >= kMaxScalars || !absl::SimpleAtod(v, &value) ||
        !std::isfinite(value)) {
      return false;
    }
    r.scalars.emplace_back(name, value);
    return true;
  }
  if (k == "epoch") return absl::SimpleAtoi(v, &r.epoch);
  for (const MetricField& f : kMetricFields) {
    if (k != f.key) continue;
    if (f.eval) r.has_eval = true;
    if (k != "step") {
      if (!r.reported) r.reported.emplace();
      r.reported->insert(k);
    }
    return f.real != nullptr ? absl::SimpleAtod(v, &(r.*f.real))
                             : absl::SimpleAtoi(v, &(r.*f.integer));
  }
  return true;
}

// Sets heartbeat field `k` from `v`; false when `v` is not a number.
// Unknown keys are ignored.
bool SetHeartbeatField(RankHeartbeat& hb, const std::string& k, const std::string& v) {
  if (k == "phase") hb.phase = v;
  if (k == "op") hb.op = v;
  if (k == "seq") return absl::SimpleAtoi(v, &hb.seq);
  if (k == "wait") return absl::SimpleAtoi(v, &hb.waiting_seq);
  if (k == "op_step") return absl::SimpleAtoi(v, &hb.op_step);
  if (k == "bucket") return absl::SimpleAtoi(v, &hb.op_bucket);
  if (k == "wait_ms") return absl::SimpleAtoi(v, &hb.waiting_ms);
  if (k == "p99_ms") return absl::SimpleAtod(v, &hb.p99_step_ms);
  if (k == "compute_ms") return absl::SimpleAtod(v, &hb.compute_ms);
  if (k == "moves") return absl::SimpleAtoi(v, &hb.stack_moves);
  if (k == "torch_ms") return absl::SimpleAtoi(v, &hb.torch_wait_ms);
  return true;
}

// Calls set(key, value) for each KEY=VALUE word from words[first] on; false
// when a word has no '=' or `set` rejects its value.
template <typename Set>
bool ForEachKeyValue(const std::vector<std::string>& words, size_t first, Set set) {
  for (size_t i = first; i < words.size(); ++i) {
    const size_t eq = words[i].find('=');
    if (eq == std::string::npos || !set(words[i].substr(0, eq), words[i].substr(eq + 1)))
      return false;
  }
  return true;
}

ErrorKind ErrorKindFromName(const std::string& k) {
  for (ErrorKind kind :
       {ErrorKind::kConfig, ErrorKind::kCollective, ErrorKind::kRendezvous, ErrorKind::kDiskFull,
        ErrorKind::kData, ErrorKind::kOutOfMemory, ErrorKind::kNan, ErrorKind::kResume}) {
    if (k == ErrorKindName(kind)) return kind;
  }
  return ErrorKind::kExit;
}

// "error KIND[:STEP] MESSAGE" (the message may be empty).
bool ParseErrorLine(const std::string& l, const std::vector<std::string>& words, StatusMessage& m) {
  const std::string& word = words[1];
  std::string k = word;
  if (size_t colon = word.find(':'); colon != std::string::npos) {
    k = word.substr(0, colon);
    if (!absl::SimpleAtoi(word.substr(colon + 1), &m.step) || m.step < 0) return false;
  }
  m.error_kind = ErrorKindFromName(k);
  size_t pos = l.find(word, 5) + word.size();
  m.message = pos < l.size() ? l.substr(pos + 1) : "";
  return true;
}

// "checkpoint EPOCHS STEP BYTES CHECKSUM [CONSUMED] PATH".
bool ParseCheckpointLine(const std::string& l, const std::vector<std::string>& words,
                         CheckpointNote& c) {
  if (!absl::SimpleAtoi(words[1], &c.epochs_done) || !absl::SimpleAtoi(words[2], &c.global_step) ||
      !absl::SimpleAtoi(words[3], &c.size_bytes)) {
    return false;
  }
  c.checksum = words[4] == "-" ? "" : words[4];
  // CONSUMED (digits) before the path, which is absolute; lines without it
  // (older ranks) mean an epoch boundary.
  int fixed = 5;
  if (words.size() >= 7 && !words[5].empty() && words[5][0] != '/') {
    if (!absl::SimpleAtoi(words[5], &c.epoch_consumed) || c.epoch_consumed < 0) return false;
    fixed = 6;
  }
  // The path is the rest of the line after the fixed words (it may hold spaces).
  size_t pos = 0;
  for (int w = 0; w < fixed; ++w) {
    pos = l.find_first_not_of(' ', pos);
    pos = l.find(' ', pos);
  }
  c.path = l.substr(l.find_first_not_of(' ', pos));
  return true;
}

// Parses `l` (without its newline) into `m`; false for a malformed line.
bool ParseStatusWords(const std::string& l, const std::vector<std::string>& words,
                      StatusMessage& m) {
  using Type = StatusMessage::Type;
  const std::string& verb = words[0];
  if (verb == "ready" && words.size() == 1) {
    m.type = Type::kReady;
    return true;
  }
  if (verb == "rendezvous" && words.size() == 2) {
    m.type = Type::kRendezvous;
    m.address = words[1];
    return true;
  }
  if (verb == "progress" && words.size() >= 3) {
    m.type = Type::kProgress;
    if (!absl::SimpleAtoi(words[1], &m.epoch) || !absl::SimpleAtoi(words[2], &m.step)) return false;
    m.heartbeat.present = words.size() > 3;
    return ForEachKeyValue(words, 3, [&m](const std::string& k, const std::string& v) {
      return SetHeartbeatField(m.heartbeat, k, v);
    });
  }
  if (verb == "error" && words.size() >= 2) {
    m.type = Type::kError;
    return ParseErrorLine(l, words, m);
  }
  if (verb == "model" && words.size() >= 2) {
    m.type = Type::kModel;
    // The rest of the line (a path may hold spaces).
    m.path = l.substr(l.find_first_not_of(' ', l.find("model") + 5));
    return true;
  }
  if (verb == "checkpoint" && words.size() >= 6) {
    m.type = Type::kCheckpoint;
    return ParseCheckpointLine(l, words, m.checkpoint);
  }
  if (verb == "metric") {
    m.type = Type::kMetric;
    m.metric.reported.emplace();  // what the line names, and nothing else
    return ForEachKeyValue(words, 1, [&m](const std::string& k, const std::string& v) {
      return SetMetricField(m.metric, k, v);
    });
  }
  return false;
}

}  // namespace

const char* ErrorKindName(ErrorKind k) {
  switch (k) {
    case ErrorKind::kConfig:
      return "config";
    case ErrorKind::kCollective:
      return "collective";
    case ErrorKind::kRendezvous:
      return "rendezvous";
    case ErrorKind::kDiskFull:
      return "disk_full";
    case ErrorKind::kData:
      return "data";
    case ErrorKind::kOutOfMemory:
      return "out_of_memory";
    case ErrorKind::kNan:
      return "nan";
    case ErrorKind::kResume:
      return "resume";
    default:
      return "exit";
  }
}

std::string FormatConfig(const FlatConfig& config) {
  std::string out;
  for (const auto& [k, v] : config) absl::StrAppend(&out, k, "=", Escape(v), "\n");
  return out;
}

absl::StatusOr<FlatConfig> ParseConfig(std::string_view text) {
  FlatConfig out;
  int n = 0;
  std::vector<std::string> lines = absl::StrSplit(std::string(text), '\n');
  for (const std::string& line_str : lines) {
    std::string_view line = line_str;
    ++n;
    if (line.empty() || line[0] == '#') continue;
    size_t eq = line.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank config line ", n, ": expected key=value"));
    }
    out[std::string(line.substr(0, eq))] = Unescape(line.substr(eq + 1));
  }
  return out;
}

absl::Status WriteConfigFile(const std::string& path, const FlatConfig& config) {
  // Owner-only: the config carries the attempt's rendezvous secret. Created
  // without following links: the rank's directory is the job's.
  absl::Status s = WriteFileSafely(path, FormatConfig(config), PrivateFile());
  if (!s.ok()) return absl::InternalError(absl::StrCat("rank config: ", s.message()));
  return absl::OkStatus();
}

absl::StatusOr<FlatConfig> ReadConfigFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("rank config ", path, ": cannot read"));
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseConfig(ss.str());
}

absl::StatusOr<FlatConfig> ReadConfigFd(int fd) {
  std::string text;
  char buf[8192];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return absl::NotFoundError(
          absl::StrCat("rank config fd ", fd, ": cannot read: ", std::strerror(errno)));
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > (size_t{64} << 20))
      return absl::InvalidArgumentError(absl::StrCat("rank config fd ", fd, ": over 64 MiB"));
  }
  return ParseConfig(text);
}

namespace {

absl::Status Missing(const std::string& key) {
  return absl::InvalidArgumentError(absl::StrCat(key, ": missing"));
}

// The value of `key` converted by `parse`; InvalidArgument "KEY: not WHAT"
// when it does not convert. A missing key is `*fallback`, or an error
// without one.
template <typename T, typename Parse>
absl::StatusOr<T> GetParsed(const FlatConfig& c, const std::string& key, const char* what,
                            Parse parse, const T* fallback) {
  auto it = c.find(key);
  if (it == c.end()) {
    if (fallback != nullptr) return *fallback;
    return Missing(key);
  }
  T v;
  if (!parse(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": not ", what, ": '", it->second, "'"));
  }
  return v;
}

bool ParseInt(const std::string& text, int64_t* out) { return absl::SimpleAtoi(text, out); }
bool ParseDouble(const std::string& text, double* out) { return absl::SimpleAtod(text, out); }
bool ParseBool(const std::string& text, bool* out) {
  if (text != "true" && text != "false") return false;
  *out = text == "true";
  return true;
}

}  // namespace

absl::StatusOr<std::string> GetString(const FlatConfig& c, const std::string& key) {
  auto it = c.find(key);
  if (it == c.end()) return Missing(key);
  return it->second;
}

std::string GetString(const FlatConfig& c, const std::string& key, const std::string& fallback) {
  auto it = c.find(key);
  return it == c.end() ? fallback : it->second;
}

absl::StatusOr<int64_t> GetInt(const FlatConfig& c, const std::string& key) {
  return GetParsed<int64_t>(c, key, "an integer", ParseInt, nullptr);
}

absl::StatusOr<int64_t> GetInt(const FlatConfig& c, const std::string& key, int64_t fallback) {
  return GetParsed<int64_t>(c, key, "an integer", ParseInt, &fallback);
}

absl::StatusOr<double> GetDouble(const FlatConfig& c, const std::string& key) {
  return GetParsed<double>(c, key, "a number", ParseDouble, nullptr);
}

absl::StatusOr<double> GetDouble(const FlatConfig& c, const std::string& key, double fallback) {
  return GetParsed<double>(c, key, "a number", ParseDouble, &fallback);
}

absl::StatusOr<bool> GetBool(const FlatConfig& c, const std::string& key) {
  return GetParsed<bool>(c, key, "true/false", ParseBool, nullptr);
}

absl::StatusOr<bool> GetBool(const FlatConfig& c, const std::string& key, bool fallback) {
  return GetParsed<bool>(c, key, "true/false", ParseBool, &fallback);
}

std::string FormatRendezvous(const std::string& address) {
  return absl::StrCat("rendezvous ", address, "\n");
}
std::string FormatReady() { return "ready\n"; }
std::string FormatProgress(int32_t epoch, int64_t global_step) {
  return absl::StrCat("progress ", epoch, " ", global_step, "\n");
}
std::string FormatProgress(int32_t epoch, int64_t global_step, const RankHeartbeat& hb) {
  auto word = [](const std::string& v) {
    return v.empty() || v.find_first_of(" \n=") != std::string::npos ? "-" : v;
  };
  return absl::StrCat("progress ", epoch, " ", global_step, " phase=", word(hb.phase),
                      " seq=", hb.seq, " wait=", hb.waiting_seq, " op=", word(hb.op),
                      " op_step=", hb.op_step, " bucket=", hb.op_bucket, " wait_ms=", hb.waiting_ms,
                      " p99_ms=", Num(hb.p99_step_ms), " compute_ms=", Num(hb.compute_ms), "\n");
}

std::string FormatMetric(const RankMetric& m) {
  std::string out = absl::StrCat("metric kind=", m.kind, " epoch=", m.epoch);
  for (const MetricField& f : kMetricFields) {
    if (!m.Reports(f.key)) continue;
    absl::StrAppend(&out, " ", f.key, "=",
                    f.real != nullptr ? Num(m.*f.real) : absl::StrCat(m.*f.integer));
  }
  for (const auto& [name, value] : m.scalars) absl::StrAppend(&out, " s.", name, "=", Num(value));
  return out + "\n";
}

bool RankMetric::Reports(std::string_view key) const {
  if (key == "step") return true;
  if (key.substr(0, 5) == "eval_" && !has_eval) return false;
  return !reported.has_value() || reported->count(key) > 0;
}

bool IsScalarName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '/' &&
        c != '-') {
      return false;
    }
  }
  return true;
}

std::string FormatError(ErrorKind kind, std::string_view message, int64_t step) {
  std::string k = ErrorKindName(kind);
  if (step > 0) absl::StrAppend(&k, ":", step);
  return absl::StrCat("error ", k, " ", OneLine(message), "\n");
}

std::string FormatCheckpoint(const CheckpointNote& c) {
  return absl::StrCat("checkpoint ", c.epochs_done, " ", c.global_step, " ", c.size_bytes, " ",
                      c.checksum.empty() ? "-" : c.checksum, " ", c.epoch_consumed, " ",
                      OneLine(c.path), "\n");
}

std::string FormatModel(const std::string& path) {
  return absl::StrCat("model ", OneLine(path), "\n");
}

absl::StatusOr<StatusMessage> ParseStatusLine(std::string_view line) {
  std::string l(line);
  if (!l.empty() && l.back() == '\n') l.pop_back();
  StatusMessage m;
  std::vector<std::string> words = absl::StrSplit(l, ' ', absl::SkipEmpty());
  if (words.empty() || !ParseStatusWords(l, words, m)) {
    return absl::InvalidArgumentError(absl::StrCat("bad status line: '", l.substr(0, 80), "'"));
  }
  return m;
}

bool WriteLine(int fd, const std::string& line) {
  size_t done = 0;
  while (done < line.size()) {
    ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace trainctl::rankproto
