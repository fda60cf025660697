// .gitignore / .trainctlignore rules as the code packer applies them (git's
// syntax and precedence: the deepest file last, the last matching rule
// deciding; "!" re-includes, a trailing "/" means directories only, a '/'
// before the end anchors the pattern to its file's directory, "**" matches
// whole components). Internal to common/codepack.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace trainctl::codepack {

// One line of a .gitignore/.trainctlignore.
struct IgnoreRule {
  std::vector<std::string> components;  // the pattern split at '/'
  bool negated = false;                 // "!pattern": re-include
  bool dir_only = false;                // "pattern/": directories only
  bool anchored = false;                // a '/' before the end: relative to the file's directory
};

// The rules of the ignore files of one directory; `base` is that directory
// relative to the packed root ("" for the root).
struct IgnoreFile {
  std::string base;
  std::vector<IgnoreRule> rules;
};

// The rules of one ignore file's text (blank lines and # comments skipped).
std::vector<IgnoreRule> ParseIgnore(absl::string_view text);

// Whether `rel_path` (relative to the root, '/'-separated) is ignored by
// `files`, the ignore files of its ancestor directories, outermost first.
bool Ignored(const std::vector<IgnoreFile>& files, const std::string& rel_path, bool is_dir);

// Skipped whatever the ignore files say: .git, __pycache__/, *.pyc.
bool AlwaysSkipped(const std::string& name, bool is_dir);

}  // namespace trainctl::codepack
