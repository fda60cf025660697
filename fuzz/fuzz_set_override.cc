// --set overrides: each input line is one "key.path=value", applied on top of
// a small valid job.yaml (as `trainctl submit job.yaml --set ...` does).
#include <cstdint>
#include <string>
#include <vector>

#include "common/jobspec/job_spec.h"

namespace {
constexpr char kBase[] = R"(name: fuzz
world_size: 2
model: {name: mlp, input_dim: 5, hidden: [8], classes: 2}
data:
  train: {format: synthetic, length: 100, size: 5, classes: 2, seed: 0}
  batch_size: 10
training:
  epochs: 1
  loss: cross_entropy
  optimizer: {name: sgd, lr: 0.1}
)";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  size_t start = 0;
  while (start <= in.size() && overrides.size() < 64) {
    size_t nl = in.find('\n', start);
    if (nl == std::string::npos) nl = in.size();
    overrides.push_back(in.substr(start, nl - start));
    start = nl + 1;
  }
  trainctl::ParsedJobSpec p = trainctl::ParseJobSpecYaml(kBase, "job.yaml", overrides);
  for (const trainctl::SpecError& e : p.errors) (void)e.ToString();
  if (p.ok()) (void)trainctl::JobSpecToYaml(p.spec);
  return 0;
}
