// absl::Time ⇄ google.protobuf.Timestamp.
#pragma once

#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"

namespace trainctl {

inline void SetTimestamp(absl::Time t, google::protobuf::Timestamp* ts) {
  int64_t ns = absl::ToUnixNanos(t);
  ts->set_seconds(ns / 1000000000);
  ts->set_nanos(static_cast<int32_t>(ns % 1000000000));
}

inline absl::Time FromTimestamp(const google::protobuf::Timestamp& ts) {
  return absl::FromUnixSeconds(ts.seconds()) + absl::Nanoseconds(ts.nanos());
}

}  // namespace trainctl
