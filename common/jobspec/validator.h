// Semantic checks on a JobSpec, shared by job.yaml and gRPC submissions:
// ranges, required fields, cross-field rules and hostile-input bounds. For
// YAML it knows which fields were written (a written 0 is an error where an
// absent one means "default") and where. Internal to common/jobspec;
// ParseJobSpecYaml and ValidateJobSpec (job_spec.cc) call it.
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/jobspec/job_spec.h"
#include "common/jobspec/spec_fields.h"

namespace trainctl::jobspec {

// Every problem with `raw` (the spec as written, defaults not filled).
// `positions` and `error_paths` come from the YAML reader (nullptr for a
// spec from gRPC): errors then carry `file` and the field's position, and
// paths that already failed to read are not reported again.
std::vector<SpecError> CheckJobSpec(const v1::JobSpec& raw, const std::string& file,
                                    const absl::flat_hash_map<std::string, Position>* positions,
                                    const absl::flat_hash_set<std::string>* error_paths);

}  // namespace trainctl::jobspec
