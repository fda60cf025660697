#include "coordinator/telemetry/stack_dumps.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace trainctl::coordinator {
namespace {

std::string Key(const std::string& job_id, int32_t attempt, int32_t rank) {
  return absl::StrCat(job_id, "/", attempt, "/", rank);
}

// faulthandler's header of one thread's stack.
bool IsThreadHeader(absl::string_view line) {
  return absl::StartsWith(line, "Thread 0x") || absl::StartsWith(line, "Current thread 0x");
}

// A line inside a thread's stack: a frame, faulthandler's notes, the blank
// line between threads.
bool IsDumpBody(absl::string_view line) {
  return line.empty() || absl::StartsWith(line, "  File \"") || absl::StartsWith(line, "  <") ||
         absl::StartsWith(line, "  ...");
}

}  // namespace

void StackDumps::OnLine(const std::string& job_id, int32_t attempt, int32_t rank,
                        absl::string_view line) {
  const bool header = IsThreadHeader(line);
  auto it = dumps_.find(Key(job_id, attempt, rank));
  if (it == dumps_.end()) {
    if (!header) return;
    it = dumps_.try_emplace(Key(job_id, attempt, rank)).first;
  }
  Dump& d = it->second;
  d.in_dump = header || (d.in_dump && IsDumpBody(line));
  if (!d.in_dump || d.lines.size() >= kMaxLines || d.bytes + line.size() > kMaxBytes) return;
  d.lines.emplace_back(line);
  d.bytes += line.size();
}

std::vector<std::string> StackDumps::Take(const std::string& job_id, int32_t attempt,
                                          int32_t rank) {
  auto it = dumps_.find(Key(job_id, attempt, rank));
  if (it == dumps_.end()) return {};
  std::vector<std::string> lines = std::move(it->second.lines);
  dumps_.erase(it);
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

}  // namespace trainctl::coordinator
