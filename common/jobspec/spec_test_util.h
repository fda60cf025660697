// What the common/jobspec tests share: a minimal valid job and the errors
// of a job.yaml as text. Test-only.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include "common/jobspec/job_spec.h"
#include "gmock/gmock.h"

namespace trainctl::testing_spec {

// The matchers every case uses (a test file says `using namespace testing_spec`).
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A valid minimal job; cases append to it (its lines are 1-4).
inline constexpr char kBase[] =
    "name: j\n"
    "model: {name: mlp, input_dim: 5, classes: 2}\n"
    "data:\n"
    "  train: {format: synthetic, length: 100, size: 5, classes: 2}\n";

// Every error of `yaml` (named job.yaml), as SpecError::ToString gives it.
inline std::vector<std::string> Errors(const std::string& yaml,
                                       const std::vector<std::string>& overrides = {}) {
  std::vector<std::string> out;
  for (const SpecError& e : ParseJobSpecYaml(yaml, "job.yaml", overrides).errors)
    out.push_back(e.ToString());
  return out;
}

// A file of the source tree ($TRAINCTL_SOURCE_DIR, set by ctest).
inline std::string Source(const std::string& rel) {
  const char* dir = std::getenv("TRAINCTL_SOURCE_DIR");
  return std::string(dir ? dir : ".") + "/" + rel;
}

}  // namespace trainctl::testing_spec
