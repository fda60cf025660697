// Service logs of trainctl-coordinator and trainctl-worker: one line per
// event on stderr,
//
//   2026-11-30T23:27:49.123Z INFO coordinator job_state job_id=mlp-7f3a from=RUNNING to=SUCCEEDED
//
// time (UTC, ms), level, component, event, then key=value pairs (a value
// with spaces, quotes or '=' is double-quoted with \" and \\ escaped, and
// newlines become \n), so that a line is greppable and machine-splittable.
// Events, not chatter: nothing is logged per heartbeat or per metric.
//
//   LogEvent(LogLevel::kInfo, "worker", "registered", {{"worker_id", id}, {"coordinator", addr}});
//
// Thread-safe: each line is one write(2) under a mutex; the level is an
// atomic set once at start (--log-level).
#pragma once

#include <string>
#include <utility>
#include <vector>
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trainctl {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

using LogFields = std::vector<std::pair<std::string, std::string>>;

// Lines below `level` are dropped (default kInfo).
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// "debug", "info", "warn" (or "warning"), "error"; false for anything else.
bool ParseLogLevel(absl::string_view text, LogLevel* out);
// --log-level for a daemon's main: parses `text` and sets the level, or says
// what is wrong (InvalidArgument, naming the flag) and leaves it.
absl::Status SetLogLevelFlag(absl::string_view text);

// Writes one line (when `level` is enabled).
void LogEvent(LogLevel level, absl::string_view component, absl::string_view event,
              const LogFields& fields = {});

// The line LogEvent would write at `time_text`, without the newline (tests).
std::string FormatLogLine(absl::string_view time_text, LogLevel level, absl::string_view component,
                          absl::string_view event, const LogFields& fields);

}  // namespace trainctl
