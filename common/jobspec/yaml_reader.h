// job.yaml → trainctl.v1.JobSpec by protobuf reflection: a YAML key is a
// proto field name, an enum value its lower-case name without the prefix.
// Reads every field it can, collects every problem with its position and
// records where each value was written (for the validator's messages).
// Internal to common/jobspec; ParseJobSpecYaml (job_spec.cc) calls it.
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/jobspec/job_spec.h"
#include "common/jobspec/spec_fields.h"
#include "yaml-cpp/yaml.h"

namespace trainctl::jobspec {

struct YamlReadResult {
  // Type and shape errors (unknown keys, wrong types, limits), in document order.
  std::vector<SpecError> errors;
  // job.yaml path → where its value was written, for every value read.
  absl::flat_hash_map<std::string, Position> positions;
  // Paths that failed to read: the validator says nothing more about them.
  absl::flat_hash_set<std::string> error_paths;
};

// Reads `root` (a mapping) into `spec`. `file` labels the errors; values at
// `override_paths` (and under them) came from --set and are labelled so.
YamlReadResult ReadJobSpecNode(const YAML::Node& root, const std::string& file,
                               absl::flat_hash_set<std::string> override_paths, v1::JobSpec* spec);

// "a mapping", "a list", "nothing" or "a scalar", for error messages.
const char* NodeKind(const YAML::Node& n);

}  // namespace trainctl::jobspec
