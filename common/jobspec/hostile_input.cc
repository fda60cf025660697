#include "common/jobspec/hostile_input.h"

#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"

namespace trainctl::jobspec {
namespace {

// What LineStartingWithStrayComma carries from one line to the next.
struct FlowState {
  int depth = 0;          // [] / {} nesting
  char quote = 0;         // ' or " while inside a quoted scalar
  int block_indent = -1;  // >= 0: inside a block scalar opened on a line with this indent
};

// A ',' where the line's first node would start (after "---" / "..." and
// node properties such as !tag and &anchor).
bool CommaStartsTheLine(std::string_view line, size_t i) {
  size_t k = i;
  if (k == 0 && (line.compare(0, 3, "---") == 0 || line.compare(0, 3, "...") == 0)) k = 3;
  while (k < line.size()) {  // blanks and node properties (!tag, &anchor)
    if (line[k] == ' ' || line[k] == '\t') {
      ++k;
    } else if (line[k] == '!' || line[k] == '&') {
      // A property ends at a blank or a flow indicator ("&a,x" is "&a" ",x").
      ++k;
      while (k < line.size() && line[k] != ' ' && line[k] != '\t' && line[k] != ',' &&
             line[k] != '[' && line[k] != ']' && line[k] != '{' && line[k] != '}') {
        ++k;
      }
    } else {
      break;
    }
  }
  return k < line.size() && line[k] == ',';
}

// Follows quotes and [] / {} through one line (from its first non-blank
// character `i`). True on a ',' right after a quoted scalar or a flow
// collection outside any [] or {} ("'a',b", "[a],b"): yaml-cpp loops on it
// as well.
bool CommaAfterClosedNode(std::string_view line, size_t i, FlowState* s) {
  // A node (flow collection or quoted scalar) starts only at the line's
  // first character, after "[", "{" or ",", or after ": " / "- "; a '{'
  // inside a plain scalar ("a{b") is text.
  char prev = 0;            // last non-blank character on this line
  bool blank = false;       // blanks since `prev`
  bool node_ended = false;  // a quoted scalar or [] / {} just closed at depth 0
  for (size_t k = i; k < line.size(); ++k) {
    const char c = line[k];
    if (s->quote == '"') {
      if (c == '\\')
        ++k;
      else if (c == '"')
        s->quote = 0, node_ended = s->depth == 0;
      prev = c;
      blank = false;
      continue;
    }
    if (s->quote == '\'') {
      if (c == '\'' && k + 1 < line.size() && line[k + 1] == '\'')
        ++k;
      else if (c == '\'')
        s->quote = 0, node_ended = s->depth == 0;
      prev = c;
      blank = false;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r') {
      blank = true;
      continue;
    }
    if (node_ended && c == ',') return true;
    node_ended = false;
    if (c == '#' && (k == 0 || blank)) break;
    const bool node_start = k == i || prev == '[' || prev == '{' || prev == ',' ||
                            ((prev == ':' || prev == '-' || prev == '?') && blank);
    if (node_start && (c == '"' || c == '\'')) {
      s->quote = c;
    } else if (node_start && (c == '[' || c == '{')) {
      ++s->depth;
    } else if ((c == ']' || c == '}') && s->depth > 0) {
      --s->depth;
      node_ended = s->depth == 0;
    }
    prev = c;
    blank = false;
  }
  return false;
}

// "key: |", "- >-", "|2": the next more-indented lines are scalar text.
bool OpensBlockScalar(std::string_view line) {
  std::string_view t =
      line.substr(0, line.find(" #") == std::string_view::npos ? line.size() : line.find(" #"));
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t' || t.back() == '\r'))
    t.remove_suffix(1);
  size_t j = t.size();
  while (j > 0 && (t[j - 1] == '-' || t[j - 1] == '+' || (t[j - 1] >= '0' && t[j - 1] <= '9'))) --j;
  return j > 0 && (t[j - 1] == '|' || t[j - 1] == '>') &&
         (j == 1 || t[j - 2] == ' ' || t[j - 2] == ':' || t[j - 2] == '-');
}

}  // namespace

int LineStartingWithStrayComma(std::string_view y) {
  FlowState s;
  int line_no = 0;
  size_t pos = 0;
  while (pos <= y.size()) {
    size_t end = y.find('\n', pos);
    if (end == std::string_view::npos) end = y.size();
    std::string_view line = y.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    size_t i = line.find_first_not_of(" \t\r");
    if (s.block_indent >= 0) {
      if (i == std::string_view::npos || static_cast<int>(i) > s.block_indent) continue;
      s.block_indent = -1;
    }
    if (i == std::string_view::npos) continue;
    if (s.quote == 0 && s.depth == 0 && CommaStartsTheLine(line, i)) return line_no;
    if (CommaAfterClosedNode(line, i, &s)) return line_no;
    if (s.quote == 0 && s.depth == 0 && OpensBlockScalar(line))
      s.block_indent = static_cast<int>(i);
  }
  return 0;
}

std::optional<TextProblem> PreCheckYamlText(std::string_view yaml) {
  if (yaml.size() > kMaxJobYamlBytes) {
    return TextProblem{1, 1,
                       absl::StrCat("the file is ", yaml.size(), " bytes; at most ",
                                    kMaxJobYamlBytes, " are read")};
  }
  if (yaml.find('\0') != std::string_view::npos) {
    return TextProblem{1, 1, "not a text file (it contains NUL bytes)"};
  }
  if (int line = LineStartingWithStrayComma(yaml); line > 0) {
    return TextProblem{line, 1,
                       "not valid YAML: ',' outside [] or {} at the start of a line or after a "
                       "quoted or [] / {} value"};
  }
  return std::nullopt;
}

}  // namespace trainctl::jobspec
