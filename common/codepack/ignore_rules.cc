// Ignore-file rules (see ignore_rules.h).
#include "common/codepack/ignore_rules.h"

#include <fnmatch.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace trainctl::codepack {
namespace {

// Pattern components against path components; "**" matches zero or more
// whole components (one or more when it ends the pattern: "dir/**" is what
// is inside dir). Each other component is an fnmatch pattern (*, ?, [...]).
bool MatchComponents(const std::vector<std::string>& pattern, size_t pi,
                     const std::vector<std::string>& path, size_t si) {
  if (pi == pattern.size()) return si == path.size();
  if (pattern[pi] == "**") {
    const size_t min_skip = pi + 1 == pattern.size() ? 1 : 0;
    for (size_t skip = min_skip; si + skip <= path.size(); ++skip) {
      if (MatchComponents(pattern, pi + 1, path, si + skip)) return true;
    }
    return false;
  }
  if (si == path.size()) return false;
  if (fnmatch(pattern[pi].c_str(), path[si].c_str(), FNM_PATHNAME) != 0) return false;
  return MatchComponents(pattern, pi + 1, path, si + 1);
}

// Whether `rel` (relative to `file.base`, split) is matched by `rule`.
bool RuleMatches(const IgnoreRule& rule, const std::vector<std::string>& rel, bool is_dir) {
  if (rule.dir_only && !is_dir) return false;
  if (rule.anchored) return MatchComponents(rule.components, 0, rel, 0);
  // No '/': the pattern matches a name at any depth below the file.
  return fnmatch(rule.components[0].c_str(), rel.back().c_str(), FNM_PATHNAME) == 0;
}

}  // namespace

std::vector<IgnoreRule> ParseIgnore(absl::string_view text) {
  std::vector<IgnoreRule> rules;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    // Trailing spaces are ignored unless escaped (git's rule).
    while (!line.empty() && line.back() == ' ' &&
           !(line.size() >= 2 && line[line.size() - 2] == '\\')) {
      line.remove_suffix(1);
    }
    if (line.empty() || line[0] == '#') continue;
    IgnoreRule rule;
    if (line[0] == '!') {
      rule.negated = true;
      line.remove_prefix(1);
    } else if (absl::StartsWith(line, "\\!") || absl::StartsWith(line, "\\#")) {
      line.remove_prefix(1);
    }
    if (!line.empty() && line.back() == '/') {
      rule.dir_only = true;
      while (!line.empty() && line.back() == '/') line.remove_suffix(1);
    }
    rule.anchored = absl::StrContains(line, '/');
    while (!line.empty() && line.front() == '/') line.remove_prefix(1);
    if (line.empty()) continue;
    rule.components = absl::StrSplit(line, '/', absl::SkipEmpty());
    rules.push_back(std::move(rule));
  }
  return rules;
}

// Whether `rel_path` (relative to the root) is ignored by the ignore files
// in force: every file of an ancestor directory, the deepest last, the last
// matching rule deciding (git's precedence).
bool Ignored(const std::vector<IgnoreFile>& files, const std::string& rel_path, bool is_dir) {
  bool ignored = false;
  for (const IgnoreFile& file : files) {
    absl::string_view below = rel_path;
    if (!file.base.empty()) {
      if (!absl::StartsWith(below, file.base) || below.size() <= file.base.size() ||
          below[file.base.size()] != '/') {
        continue;
      }
      below.remove_prefix(file.base.size() + 1);
    }
    std::vector<std::string> rel = absl::StrSplit(below, '/');
    for (const IgnoreRule& rule : file.rules) {
      if (RuleMatches(rule, rel, is_dir)) ignored = !rule.negated;
    }
  }
  return ignored;
}

// Skipped whatever the ignore files say.
bool AlwaysSkipped(const std::string& name, bool is_dir) {
  if (name == ".git") return true;  // a directory, or a worktree's ".git" file
  if (is_dir && name == "__pycache__") return true;
  return !is_dir && absl::EndsWith(name, ".pyc");
}

}  // namespace trainctl::codepack
