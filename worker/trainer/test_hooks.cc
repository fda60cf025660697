#include "worker/trainer/test_hooks.h"

#include <chrono>
#include <cstdlib>
#include <map>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainctl::trainer {
namespace {

constexpr char kPhaseSleepEnv[] = "TRAINCTL_TEST_PHASE_SLEEP";

std::map<std::string, int64_t, std::less<>> ParsePhaseSleeps() {
  std::map<std::string, int64_t, std::less<>> out;
  const char* env = std::getenv(kPhaseSleepEnv);
  if (env == nullptr) return out;
  for (absl::string_view entry : absl::StrSplit(env, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(entry, absl::MaxSplits(':', 1));
    int64_t ms = 0;
    if (kv.first.empty() || !absl::SimpleAtoi(kv.second, &ms) || ms < 0 || ms > 600000) continue;
    out[std::string(kv.first)] = ms;
  }
  return out;
}

}  // namespace

int64_t TestPhaseSleepMs(absl::string_view phase) {
  static const auto* sleeps = new std::map<std::string, int64_t, std::less<>>(ParsePhaseSleeps());
  auto it = sleeps->find(phase);
  return it == sleeps->end() ? 0 : it->second;
}

void TestPhaseSleep(absl::string_view phase, const std::function<void(const std::string&)>& log) {
  const int64_t ms = TestPhaseSleepMs(phase);
  if (ms <= 0) return;
  if (log) log(absl::StrCat("test hook: sleeping ", ms, " ms in ", phase));
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace trainctl::trainer
