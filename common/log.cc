#include "common/log.h"

#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainctl {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
absl::Mutex g_write_mu;

const char* LevelName(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kError:
      return "ERROR";
  }
  return "INFO";
}

std::string Value(absl::string_view v) {
  bool quote = v.empty();
  for (char c : v) {
    if (c == ' ' || c == '"' || c == '=' || c == '\n' || c == '\t' || c == '\\') quote = true;
  }
  if (!quote) return std::string(v);
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }

bool ParseLogLevel(absl::string_view text, LogLevel* out) {
  if (text == "debug")
    *out = LogLevel::kDebug;
  else if (text == "info")
    *out = LogLevel::kInfo;
  else if (text == "warn" || text == "warning")
    *out = LogLevel::kWarn;
  else if (text == "error")
    *out = LogLevel::kError;
  else
    return false;
  return true;
}

absl::Status SetLogLevelFlag(absl::string_view text) {
  LogLevel level;
  if (!ParseLogLevel(text, &level)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-level: '", text, "' is not one of debug, info, warn, error"));
  }
  SetLogLevel(level);
  return absl::OkStatus();
}

std::string FormatLogLine(absl::string_view time_text, LogLevel level, absl::string_view component,
                          absl::string_view event, const LogFields& fields) {
  std::string line = absl::StrCat(time_text, " ", LevelName(level), " ", component, " ", event);
  for (const auto& [k, v] : fields) absl::StrAppend(&line, " ", k, "=", Value(v));
  return line;
}

void LogEvent(LogLevel level, absl::string_view component, absl::string_view event,
              const LogFields& fields) {
  if (static_cast<int>(level) < g_level.load(std::memory_order_relaxed)) return;
  std::string line =
      FormatLogLine(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
                    level, component, event, fields);
  line += '\n';
  absl::MutexLock lock(&g_write_mu);
  size_t done = 0;
  while (done < line.size()) {
    ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n <= 0) break;  // stderr gone: nothing better to do with a log line
    done += static_cast<size_t>(n);
  }
}

}  // namespace trainctl
