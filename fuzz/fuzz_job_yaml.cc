// job.yaml text -> ParseJobSpecYaml (yaml-cpp + our reader + validation).
// A spec that parses must print back to YAML that parses to the same spec.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/jobspec/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  trainctl::ParsedJobSpec p = trainctl::ParseJobSpecYaml(yaml, "job.yaml");
  for (const trainctl::SpecError& e : p.errors) (void)e.ToString();
  if (!p.ok()) return 0;
  (void)trainctl::JobSpecToFlat(p.spec);
  (void)trainctl::CheckpointSpecHash(p.spec);
  if (!trainctl::ValidateJobSpec(p.spec).empty()) std::abort();  // parsed specs are valid
  trainctl::ParsedJobSpec again =
      trainctl::ParseJobSpecYaml(trainctl::JobSpecToYaml(p.spec), "again.yaml");
  if (!again.ok() || again.spec.SerializeAsString() != p.spec.SerializeAsString()) std::abort();
  return 0;
}
