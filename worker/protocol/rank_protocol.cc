#include "worker/protocol/rank_protocol.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <unistd.h>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

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

}  // namespace

const char* ErrorKindName(ErrorKind k) {
  switch (k) {
    case ErrorKind::kConfig: return "config";
    case ErrorKind::kCollective: return "collective";
    case ErrorKind::kRendezvous: return "rendezvous";
    case ErrorKind::kDiskFull: return "disk_full";
    case ErrorKind::kData: return "data";
    case ErrorKind::kOutOfMemory: return "out_of_memory";
    case ErrorKind::kNan: return "nan";
    default: return "exit";
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
      return absl::InvalidArgumentError(absl::StrCat("rank config line ", n, ": expected key=value"));
    }
    out[std::string(line.substr(0, eq))] = Unescape(line.substr(eq + 1));
  }
  return out;
}

absl::Status WriteConfigFile(const std::string& path, const FlatConfig& config) {
  // Owner-only: the config carries the attempt's rendezvous secret.
  const std::string tmp = path + ".tmp";
  const std::string text = FormatConfig(config);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  bool ok = ::fchmod(fd, 0600) == 0;  // an older file keeps its mode through O_TRUNC
  size_t off = 0;
  while (ok && off < text.size()) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) off += static_cast<size_t>(n);
  }
  ok = ::close(fd) == 0 && ok;
  if (!ok) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<FlatConfig> ReadConfigFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("rank config ", path, ": cannot read"));
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseConfig(ss.str());
}

absl::StatusOr<std::string> GetString(const FlatConfig& c, const std::string& key) {
  auto it = c.find(key);
  if (it == c.end()) return absl::InvalidArgumentError(absl::StrCat(key, ": missing"));
  return it->second;
}

std::string GetString(const FlatConfig& c, const std::string& key, const std::string& fallback) {
  auto it = c.find(key);
  return it == c.end() ? fallback : it->second;
}

absl::StatusOr<int64_t> GetInt(const FlatConfig& c, const std::string& key) {
  auto it = c.find(key);
  if (it == c.end()) return absl::InvalidArgumentError(absl::StrCat(key, ": missing"));
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": not an integer: '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<int64_t> GetInt(const FlatConfig& c, const std::string& key, int64_t fallback) {
  if (c.find(key) == c.end()) return fallback;
  return GetInt(c, key);
}

absl::StatusOr<double> GetDouble(const FlatConfig& c, const std::string& key) {
  auto it = c.find(key);
  if (it == c.end()) return absl::InvalidArgumentError(absl::StrCat(key, ": missing"));
  double v;
  if (!absl::SimpleAtod(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": not a number: '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<double> GetDouble(const FlatConfig& c, const std::string& key, double fallback) {
  if (c.find(key) == c.end()) return fallback;
  return GetDouble(c, key);
}

absl::StatusOr<bool> GetBool(const FlatConfig& c, const std::string& key) {
  auto it = c.find(key);
  if (it == c.end()) return absl::InvalidArgumentError(absl::StrCat(key, ": missing"));
  if (it->second == "true") return true;
  if (it->second == "false") return false;
  return absl::InvalidArgumentError(absl::StrCat(key, ": not true/false: '", it->second, "'"));
}

absl::StatusOr<bool> GetBool(const FlatConfig& c, const std::string& key, bool fallback) {
  if (c.find(key) == c.end()) return fallback;
  return GetBool(c, key);
}

std::string FormatRendezvous(const std::string& address) {
  return absl::StrCat("rendezvous ", address, "\n");
}
std::string FormatReady() { return "ready\n"; }
std::string FormatProgress(int32_t epoch, int64_t global_step) {
  return absl::StrCat("progress ", epoch, " ", global_step, "\n");
}
std::string FormatProgress(int32_t epoch, int64_t global_step, const RankHeartbeat& hb) {
  auto word = [](const std::string& v) { return v.empty() || v.find_first_of(" \n=") != std::string::npos ? "-" : v; };
  return absl::StrCat("progress ", epoch, " ", global_step, " phase=", word(hb.phase), " seq=", hb.seq,
                      " wait=", hb.waiting_seq, " op=", word(hb.op), " op_step=", hb.op_step,
                      " bucket=", hb.op_bucket, " wait_ms=", hb.waiting_ms, " p99_ms=", Num(hb.p99_step_ms),
                      " compute_ms=", Num(hb.compute_ms), "\n");
}

std::string FormatMetric(const RankMetric& m) {
  std::string out = absl::StrCat("metric kind=", m.kind, " epoch=", m.epoch, " step=", m.step,
                                 " steps_per_epoch=", m.steps_per_epoch, " loss=", Num(m.loss),
                                 " lr=", Num(m.lr), " samples_per_sec=", Num(m.samples_per_sec),
                                 " data_ms=", Num(m.data_ms), " compute_ms=", Num(m.compute_ms),
                                 " comm_ms=", Num(m.comm_ms), " loss_scale=", Num(m.loss_scale),
                                 " skipped_steps=", m.skipped_steps,
                                 " peak_memory_bytes=", m.peak_memory_bytes,
                                 " samples_seen=", m.samples_seen);
  if (m.has_eval) {
    absl::StrAppend(&out, " eval_loss=", Num(m.eval_loss), " eval_accuracy=", Num(m.eval_accuracy),
                    " eval_samples=", m.eval_samples);
  }
  return out + "\n";
}

std::string FormatError(ErrorKind kind, std::string_view message, int64_t step) {
  std::string flat;
  for (char c : message) flat += (c == '\n' || c == '\r') ? ' ' : c;
  std::string k = ErrorKindName(kind);
  if (step > 0) absl::StrAppend(&k, ":", step);
  return absl::StrCat("error ", k, " ", flat, "\n");
}

std::string FormatCheckpoint(const CheckpointNote& c) {
  std::string path;
  for (char ch : c.path) path += (ch == '\n' || ch == '\r') ? ' ' : ch;
  return absl::StrCat("checkpoint ", c.epochs_done, " ", c.global_step, " ", c.size_bytes, " ",
                      c.checksum.empty() ? "-" : c.checksum, " ", c.epoch_consumed, " ", path, "\n");
}

std::string FormatModel(const std::string& path) {
  std::string flat;
  for (char ch : path) flat += (ch == '\n' || ch == '\r') ? ' ' : ch;
  return absl::StrCat("model ", flat, "\n");
}

absl::StatusOr<StatusMessage> ParseStatusLine(std::string_view line) {
  std::string l(line);
  if (!l.empty() && l.back() == '\n') l.pop_back();
  StatusMessage m;
  auto bad = [&] { return absl::InvalidArgumentError(absl::StrCat("bad status line: '", l.substr(0, 80), "'")); };
  std::vector<std::string> words = absl::StrSplit(l, ' ', absl::SkipEmpty());
  if (words.empty()) return bad();
  const std::string& verb = words[0];
  if (verb == "ready" && words.size() == 1) {
    m.type = StatusMessage::Type::kReady;
    return m;
  }
  if (verb == "rendezvous" && words.size() == 2) {
    m.type = StatusMessage::Type::kRendezvous;
    m.address = words[1];
    return m;
  }
  if (verb == "progress" && words.size() >= 3) {
    m.type = StatusMessage::Type::kProgress;
    if (!absl::SimpleAtoi(words[1], &m.epoch) || !absl::SimpleAtoi(words[2], &m.step)) return bad();
    RankHeartbeat& hb = m.heartbeat;
    hb.present = words.size() > 3;
    for (size_t i = 3; i < words.size(); ++i) {
      const size_t eq = words[i].find('=');
      if (eq == std::string::npos) return bad();
      const std::string k = words[i].substr(0, eq), v = words[i].substr(eq + 1);
      bool ok = true;
      if (k == "phase") hb.phase = v;
      else if (k == "seq") ok = absl::SimpleAtoi(v, &hb.seq);
      else if (k == "wait") ok = absl::SimpleAtoi(v, &hb.waiting_seq);
      else if (k == "op") hb.op = v;
      else if (k == "op_step") ok = absl::SimpleAtoi(v, &hb.op_step);
      else if (k == "bucket") ok = absl::SimpleAtoi(v, &hb.op_bucket);
      else if (k == "wait_ms") ok = absl::SimpleAtoi(v, &hb.waiting_ms);
      else if (k == "p99_ms") ok = absl::SimpleAtod(v, &hb.p99_step_ms);
      else if (k == "compute_ms") ok = absl::SimpleAtod(v, &hb.compute_ms);
      if (!ok) return bad();
    }
    return m;
  }
  if (verb == "error" && words.size() >= 2) {
    m.type = StatusMessage::Type::kError;
    const std::string& word = words[1];
    // KIND or KIND:STEP.
    std::string k = word;
    if (size_t colon = word.find(':'); colon != std::string::npos) {
      k = word.substr(0, colon);
      if (!absl::SimpleAtoi(word.substr(colon + 1), &m.step) || m.step < 0) return bad();
    }
    m.error_kind = k == "config" ? ErrorKind::kConfig
                   : k == "collective"    ? ErrorKind::kCollective
                   : k == "rendezvous"    ? ErrorKind::kRendezvous
                   : k == "disk_full"     ? ErrorKind::kDiskFull
                   : k == "data"          ? ErrorKind::kData
                   : k == "out_of_memory" ? ErrorKind::kOutOfMemory
                   : k == "nan"           ? ErrorKind::kNan
                                          : ErrorKind::kExit;
    size_t pos = l.find(word, 5) + word.size();
    m.message = pos < l.size() ? l.substr(pos + 1) : "";
    return m;
  }
  if (verb == "model" && words.size() >= 2) {
    m.type = StatusMessage::Type::kModel;
    // The rest of the line (a path may hold spaces).
    m.path = l.substr(l.find_first_not_of(' ', l.find("model") + 5));
    return m;
  }
  if (verb == "checkpoint" && words.size() >= 6) {
    m.type = StatusMessage::Type::kCheckpoint;
    CheckpointNote& c = m.checkpoint;
    if (!absl::SimpleAtoi(words[1], &c.epochs_done) || !absl::SimpleAtoi(words[2], &c.global_step) ||
        !absl::SimpleAtoi(words[3], &c.size_bytes)) {
      return bad();
    }
    c.checksum = words[4] == "-" ? "" : words[4];
    // CONSUMED (digits) before the path, which is absolute; lines without it
    // (older ranks) mean an epoch boundary.
    int fixed = 5;
    if (words.size() >= 7 && !words[5].empty() && words[5][0] != '/') {
      if (!absl::SimpleAtoi(words[5], &c.epoch_consumed) || c.epoch_consumed < 0) return bad();
      fixed = 6;
    }
    // The path is the rest of the line after the fixed words (it may hold spaces).
    size_t pos = 0;
    for (int w = 0; w < fixed; ++w) {
      pos = l.find_first_not_of(' ', pos);
      pos = l.find(' ', pos);
    }
    c.path = l.substr(l.find_first_not_of(' ', pos));
    return m;
  }
  if (verb == "metric") {
    m.type = StatusMessage::Type::kMetric;
    RankMetric& r = m.metric;
    for (size_t i = 1; i < words.size(); ++i) {
      size_t eq = words[i].find('=');
      if (eq == std::string::npos) return bad();
      std::string k = words[i].substr(0, eq), v = words[i].substr(eq + 1);
      bool ok = true;
      if (k == "kind") r.kind = v;
      else if (k == "epoch") ok = absl::SimpleAtoi(v, &r.epoch);
      else if (k == "step") ok = absl::SimpleAtoi(v, &r.step);
      else if (k == "steps_per_epoch") ok = absl::SimpleAtoi(v, &r.steps_per_epoch);
      else if (k == "loss") ok = absl::SimpleAtod(v, &r.loss);
      else if (k == "lr") ok = absl::SimpleAtod(v, &r.lr);
      else if (k == "samples_per_sec") ok = absl::SimpleAtod(v, &r.samples_per_sec);
      else if (k == "data_ms") ok = absl::SimpleAtod(v, &r.data_ms);
      else if (k == "compute_ms") ok = absl::SimpleAtod(v, &r.compute_ms);
      else if (k == "comm_ms") ok = absl::SimpleAtod(v, &r.comm_ms);
      else if (k == "loss_scale") ok = absl::SimpleAtod(v, &r.loss_scale);
      else if (k == "skipped_steps") ok = absl::SimpleAtoi(v, &r.skipped_steps);
      else if (k == "peak_memory_bytes") ok = absl::SimpleAtoi(v, &r.peak_memory_bytes);
      else if (k == "samples_seen") ok = absl::SimpleAtoi(v, &r.samples_seen);
      else if (k == "eval_loss") { ok = absl::SimpleAtod(v, &r.eval_loss); r.has_eval = true; }
      else if (k == "eval_accuracy") { ok = absl::SimpleAtod(v, &r.eval_accuracy); r.has_eval = true; }
      else if (k == "eval_samples") { ok = absl::SimpleAtoi(v, &r.eval_samples); r.has_eval = true; }
      // Unknown keys are ignored: a newer rank may report more.
      if (!ok) return bad();
    }
    return m;
  }
  return bad();
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
