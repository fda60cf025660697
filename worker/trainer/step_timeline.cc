#include "worker/trainer/step_timeline.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/safe_file.h"

namespace trainctl::trainer {
namespace {

using Clock = StepTimeline::Clock;

// ms from `t0` to `t`, or null for a moment that did not happen.
std::string MsSince(Clock::time_point t0, Clock::time_point t) {
  if (t == Clock::time_point{} || t0 == Clock::time_point{}) return "null";
  return absl::StrFormat("%.3f", std::chrono::duration<double, std::milli>(t - t0).count());
}

// Engine names are ours ("gloo+shm", ...); escaped anyway, so a line always
// parses.
std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

const char* StepTimeline::EventName(Event e) {
  switch (e) {
    case kStart:
      return "start";
    case kBackwardStart:
      return "backward_start";
    case kBackwardEnd:
      return "backward_end";
    case kFinalizeEnd:
      return "finalize_end";
    case kOptimizerStart:
      return "optimizer_start";
    case kOptimizerEnd:
      return "optimizer_end";
    case kEnd:
      return "end";
    case kNumEvents:
      break;
  }
  return "?";
}

StepTimeline::StepTimeline(std::string path, int rank, int world_size, std::string comm_name)
    : path_(std::move(path)),
      rank_(rank),
      world_size_(world_size),
      comm_name_(std::move(comm_name)) {}

std::string StepTimeline::PathFor(const std::string& prefix, int rank) {
  return absl::StrCat(prefix, ".rank", rank, ".jsonl");
}

void StepTimeline::SetBuckets(const std::vector<dist::BucketInfo>& buckets) { buckets_ = buckets; }

void StepTimeline::BeginStep(int64_t global_step) {
  current_ = Step{};
  current_.step = global_step;
  current_.at[kStart] = Clock::now();
}

void StepTimeline::EndStep() {
  Mark(kEnd);
  if (steps_.size() >= kMaxSteps) {
    ++dropped_;
    return;
  }
  steps_.push_back(std::move(current_));
  current_ = Step{};
}

std::string StepTimeline::FormatStep(const Step& s) const {
  const Clock::time_point t0 = s.at[kStart];
  std::string line = absl::StrCat(
      "{\"rank\":", rank_, ",\"world_size\":", world_size_, ",\"comm\":", JsonString(comm_name_),
      ",\"step\":", s.step, ",\"micro_batches\":", s.micro_batches, ",\"t0_ns\":",
      std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count(),
      absl::StrFormat(",\"data_ms\":%.3f", s.data_ms));
  for (int e = 0; e < kNumEvents; ++e) {
    absl::StrAppend(&line, ",\"", EventName(static_cast<Event>(e)), "\":", MsSince(t0, s.at[e]));
  }
  const dist::StepCommStats& c = s.comm;
  absl::StrAppend(
      &line, ",\"synced\":", c.synced ? "true" : "false",
      absl::StrFormat(",\"exposed_comm_ms\":%.3f", absl::ToDoubleMilliseconds(c.exposed_comm)),
      ",\"wait_start\":", MsSince(t0, c.wait_start), ",\"wait_end\":", MsSince(t0, c.wait_end),
      ",\"buckets\":[");
  for (size_t i = 0; i < c.timeline.size(); ++i) {
    const dist::BucketTimeline& b = c.timeline[i];
    const bool from_hook = [&] {
      for (const auto& l : c.launches)
        if (l.bucket == i) return l.from_hook;
      return false;
    }();
    absl::StrAppend(&line, i == 0 ? "" : ",", "{\"bucket\":", i);
    if (i < buckets_.size()) {
      absl::StrAppend(&line, ",\"bytes\":", buckets_[i].bytes,
                      ",\"params\":", buckets_[i].params.size());
    }
    absl::StrAppend(&line, ",\"ready\":", MsSince(t0, b.ready),
                    ",\"issued\":", MsSince(t0, b.issued),
                    ",\"from_hook\":", from_hook ? "true" : "false",
                    ",\"started\":", b.ran ? MsSince(t0, b.ran->started) : "null",
                    ",\"finished\":", b.ran ? MsSince(t0, b.ran->finished) : "null",
                    ",\"waited\":", MsSince(t0, b.waited), "}");
  }
  absl::StrAppend(&line, "]}");
  return line;
}

absl::Status StepTimeline::Write() const {
  std::string text;
  for (const Step& s : steps_) absl::StrAppend(&text, FormatStep(s), "\n");
  SafeWriteOptions o;
  o.sync = false;  // a study's file: losing it in a power cut costs nothing
  return WriteFileSafely(path_, text, o);
}

}  // namespace trainctl::trainer
