// Pre-checks on job.yaml text before yaml-cpp reads it: input that would
// make the parser loop, or that is not a job file at all, is refused here
// with a position. Called by ParseJobSpecYaml (job_spec.cc) only.
//
// Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace trainctl::jobspec {

struct TextProblem {
  int line = 1;  // 1-based
  int column = 1;
  std::string message;
};

// Too large, binary (NUL bytes) or a stray ',' (LineStartingWithStrayComma);
// nullopt when yaml-cpp may read the text.
std::optional<TextProblem> PreCheckYamlText(std::string_view yaml);

// yaml-cpp 0.7 loops forever, growing its memory, on a ',' (a flow entry)
// that starts a line outside any [] or {}: ",a", "--- !t ,a", or a document
// whose last map line is followed by ", x: 1}" at a lower indentation; found
// by fuzz/fuzz_job_yaml. A plain scalar cannot start with ',', so such a line
// is never part of a job (at most the continuation of a multi-line plain
// scalar, which a job.yaml has no use for): it is refused before yaml-cpp
// reads the text. Returns the 1-based line, or 0. Tracks what changes the
// meaning of a line start: flow depth, quotes spanning lines, comments and
// block scalars (| and >), whose content lines are skipped.
int LineStartingWithStrayComma(std::string_view yaml);

}  // namespace trainctl::jobspec
