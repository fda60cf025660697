// The coordinator's request validation: SubmitJobRequest bytes as a gRPC
// client may send them -> parse -> ValidateJobSpec; a spec that validates is
// resolved and turned into the rank config and YAML, as the coordinator and
// the daemon do next.
#include <cstdint>
#include <cstdlib>

#include "common/jobspec/job_spec.h"
#include "trainctl/v1/job_service.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trainctl::v1::SubmitJobRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  std::vector<trainctl::SpecError> errors = trainctl::ValidateJobSpec(req.spec());
  (void)trainctl::SpecErrorsToStatus(errors);
  if (!errors.empty()) return 0;
  trainctl::v1::JobSpec spec = req.spec();
  trainctl::ResolveJobSpecDefaults(&spec);
  // Defaults never make a valid spec invalid.
  if (!trainctl::ValidateJobSpec(spec).empty()) std::abort();
  (void)trainctl::JobSpecToFlat(spec);
  (void)trainctl::JobSpecToYaml(spec);
  (void)trainctl::CheckpointSpecHash(spec);
  return 0;
}
