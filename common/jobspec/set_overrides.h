// The CLI's `--set key.path=value`: applied to the parsed YAML document
// before it is read, so an override is checked like a value in the file.
// Internal to common/jobspec; ParseJobSpecYaml (job_spec.cc) calls it.
//
// Pure function; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/jobspec/job_spec.h"
#include "yaml-cpp/yaml.h"

namespace trainctl::jobspec {

// Applies each "a.b.c=value" on top of `root` (creating mappings on the
// way); returns the paths set. A malformed override is an error with file
// "--set".
absl::flat_hash_set<std::string> ApplyOverrides(YAML::Node& root,
                                                const std::vector<std::string>& overrides,
                                                std::vector<SpecError>* errors);

}  // namespace trainctl::jobspec
