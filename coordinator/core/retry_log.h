// One log line for a change the coordinator could not make now and tries
// again later ("retried at the next tick"): a WARN `change_deferred` with the
// error and what happens next. A store write failure is not logged here: the
// store logs those itself, once per run of failures (StateStore write
// health), where a tick that retries every 200 ms would write five lines a
// second.
//
// Thread-safe (LogEvent is).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/log.h"
#include "coordinator/store/state_store.h"

namespace trainctl::coordinator {

inline void LogDeferred(const absl::Status& s, absl::string_view then, LogFields fields = {}) {
  if (s.ok() || StateStore::IsWriteFailure(s)) return;
  fields.emplace_back("error", std::string(s.message()));
  fields.emplace_back("then", std::string(then));
  LogEvent(LogLevel::kWarn, "coordinator", "change_deferred", fields);
}

}  // namespace trainctl::coordinator
