// job.yaml → JobSpec: the entry points of job_spec.h. The work is in the
// files beside this one, one concern each: hostile_input (pre-checks on the
// text), set_overrides (--set), yaml_reader (YAML → proto by reflection),
// validator (ranges and cross-field rules), job_defaults (every default, in
// one place), spec_serialization (YAML, the rank's flat config, the
// checkpoint hash) and spec_fields (what those share).
#include "common/jobspec/job_spec.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/jobspec/hostile_input.h"
#include "common/jobspec/set_overrides.h"
#include "common/jobspec/spec_fields.h"
#include "common/jobspec/validator.h"
#include "common/jobspec/yaml_reader.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace trainctl {

bool IsCommandContractVariable(std::string_view name) {
  static constexpr std::string_view kSet[] = {"RANK",
                                              "LOCAL_RANK",
                                              "WORLD_SIZE",
                                              "LOCAL_WORLD_SIZE",
                                              "GROUP_RANK",
                                              "GROUP_WORLD_SIZE",
                                              "ROLE_RANK",
                                              "ROLE_WORLD_SIZE",
                                              "ROLE_NAME",
                                              "MASTER_ADDR",
                                              "MASTER_PORT",
                                              "TORCHELASTIC_RESTART_COUNT",
                                              "TORCHELASTIC_MAX_RESTARTS",
                                              "TORCHELASTIC_RUN_ID",
                                              "TORCHELASTIC_ERROR_FILE",
                                              "CUDA_VISIBLE_DEVICES"};
  for (std::string_view v : kSet) {
    if (name == v) return true;
  }
  return name.substr(0, 9) == "TRAINCTL_";
}

std::string SpecError::ToString() const {
  std::string out;
  if (!file.empty()) {
    absl::StrAppend(&out, file, ":");
    if (line > 0) absl::StrAppend(&out, line, ":", column, ":");
    absl::StrAppend(&out, " ");
  }
  if (!field.empty()) absl::StrAppend(&out, field, ": ");
  absl::StrAppend(&out, message);
  return out;
}

std::string EnumValueName(const google::protobuf::EnumValueDescriptor* value) {
  return absl::AsciiStrToLower(value->name().substr(jobspec::EnumPrefix(value->type()).size()));
}

namespace {

bool LessByPosition(const SpecError& a, const SpecError& b) {
  auto key = [](const SpecError& e) {
    // File errors in document order, then --set errors, then unpositioned.
    int group = e.line > 0 ? 0 : e.file == "--set" ? 1 : 2;
    return std::make_tuple(group, e.line, e.column);
  };
  return key(a) < key(b);
}

// Takes a document's events and keeps none: counting documents.
class IgnoreEvents final : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// The one YAML document of `yaml` as a mapping (an empty one when the text
// is empty but overrides follow), or the reason it is not one.
std::optional<jobspec::TextProblem> LoadDocument(std::string_view yaml, bool have_overrides,
                                                 YAML::Node* root) {
  try {
    // Not YAML::LoadAll: yaml-cpp 0.7's never returns on some malformed
    // text (a scalar document then a stray ',': "'',s''"), reporting an
    // empty document for each token it cannot consume (found by
    // fuzz_job_yaml). The first document, then at most two counted.
    *root = YAML::Load(std::string(yaml));
    std::istringstream again{std::string(yaml)};
    YAML::Parser parser(again);
    IgnoreEvents ignore;
    int docs = 0;
    while (docs < 2 && parser.HandleNextDocument(ignore)) ++docs;
    if (docs > 1)
      return jobspec::TextProblem{1, 1, "holds several YAML documents; a job.yaml holds one"};
  } catch (const YAML::Exception& e) {
    int line = e.mark.is_null() ? 1 : e.mark.line + 1;
    int column = e.mark.is_null() ? 1 : e.mark.column + 1;
    return jobspec::TextProblem{line, column, absl::StrCat("not valid YAML: ", e.msg)};
  } catch (const std::exception& e) {
    return jobspec::TextProblem{1, 1, absl::StrCat("not valid YAML: ", e.what())};
  }
  if (!root->IsDefined() || root->IsNull()) {
    if (!have_overrides) {
      return jobspec::TextProblem{
          1, 1, "the file is empty; a job needs at least name, model and data.train"};
    }
    *root = YAML::Node(YAML::NodeType::Map);
  }
  if (!root->IsMap()) {
    YAML::Mark m = root->Mark();
    return jobspec::TextProblem{
        m.is_null() ? 1 : m.line + 1, m.is_null() ? 1 : m.column + 1,
        absl::StrCat("must be a mapping of job fields, got ", jobspec::NodeKind(*root))};
  }
  return std::nullopt;
}

}  // namespace

ParsedJobSpec ParseJobSpecYaml(std::string_view yaml, std::string_view file,
                               const std::vector<std::string>& overrides) {
  ParsedJobSpec result;
  std::string name(file);
  YAML::Node root;
  std::optional<jobspec::TextProblem> problem = jobspec::PreCheckYamlText(yaml);
  if (!problem) problem = LoadDocument(yaml, !overrides.empty(), &root);
  if (problem) {
    result.errors.push_back(
        SpecError{name, problem->line, problem->column, "", std::move(problem->message)});
    return result;
  }

  std::vector<SpecError> errors;
  absl::flat_hash_set<std::string> override_paths =
      jobspec::ApplyOverrides(root, overrides, &errors);
  jobspec::YamlReadResult read =
      jobspec::ReadJobSpecNode(root, name, std::move(override_paths), &result.spec);
  for (SpecError& e : read.errors) errors.push_back(std::move(e));
  for (SpecError& e :
       jobspec::CheckJobSpec(result.spec, name, &read.positions, &read.error_paths)) {
    errors.push_back(std::move(e));
  }

  std::stable_sort(errors.begin(), errors.end(), LessByPosition);
  if (errors.size() > kMaxReportedErrors) {
    size_t more = errors.size() - kMaxReportedErrors;
    errors.resize(kMaxReportedErrors);
    errors.push_back(SpecError{name, 0, 0, "", absl::StrCat("... and ", more, " more errors")});
  }
  result.errors = std::move(errors);
  if (result.ok()) ResolveJobSpecDefaults(&result.spec);
  return result;
}

ParsedJobSpec ParseJobSpecFile(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ParsedJobSpec r;
    r.errors.push_back(
        SpecError{path, 0, 0, "", "cannot read the file (no such file or no permission)"});
    return r;
  }
  std::string text;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxJobYamlBytes) break;  // Reported by the parser.
  }
  return ParseJobSpecYaml(text, path, overrides);
}

std::vector<SpecError> ValidateJobSpec(const v1::JobSpec& spec) {
  return jobspec::CheckJobSpec(spec, "", nullptr, nullptr);
}

absl::Status SpecErrorsToStatus(const std::vector<SpecError>& errors) {
  if (errors.empty()) return absl::OkStatus();
  std::vector<std::string> lines;
  for (const SpecError& e : errors) lines.push_back(e.ToString());
  return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
}

}  // namespace trainctl
