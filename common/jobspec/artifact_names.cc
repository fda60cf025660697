#include "common/jobspec/artifact_names.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace trainctl {

std::string JobManifestName(const std::string& job_id) {
  return absl::StrCat(job_id, ".trainctl-job");
}

std::string FinalModelFileName(const std::string& job_id) {
  return absl::StrCat(job_id, ".model.pt");
}

std::optional<CheckpointNameParts> ParseCheckpointStem(std::string_view stem_in) {
  absl::string_view stem(stem_in.data(), stem_in.size());
  CheckpointNameParts parts;
  if (const size_t dot = stem.find('.'); dot != absl::string_view::npos) {
    parts.writer = std::string(stem.substr(dot + 1));
    // A writer is a tag CheckpointWriterTag could have made (never "", "."
    // or "..", no '/').
    if (CheckpointWriterTag(parts.writer) != parts.writer) return std::nullopt;
    stem = stem.substr(0, dot);
  }
  auto number = [](absl::string_view d, int64_t* out) {
    if (d.empty() || d.size() > 12 ||
        !std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return false;
    }
    return absl::SimpleAtoi(d, out);
  };
  const size_t dash = stem.find('-');
  if (!number(stem.substr(0, dash), &parts.epochs_done)) return std::nullopt;
  if (dash != absl::string_view::npos && !number(stem.substr(dash + 1), &parts.epoch_consumed))
    return std::nullopt;
  return parts;
}

bool IsCheckpointFileName(const std::string& job_id, std::string_view file) {
  const std::string prefix = absl::StrCat(job_id, ".ckpt-epoch-");
  absl::string_view name(file.data(), file.size());
  if (job_id.empty() || !absl::ConsumePrefix(&name, prefix) || !absl::ConsumeSuffix(&name, ".pt"))
    return false;
  return ParseCheckpointStem(std::string_view(name.data(), name.size())).has_value();
}

std::string CheckpointWriterTag(const std::string& worker_id) {
  return OwnerPathComponent(worker_id);
}

bool IsFinalModelFileName(const std::string& job_id, std::string_view name) {
  return !job_id.empty() && name == FinalModelFileName(job_id);
}

std::string OwnerPathComponent(const std::string& owner) {
  std::string out;
  for (char c : owner.substr(0, 128)) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    out.push_back(ok ? c : '_');
  }
  if (out.empty()) return "_";
  if (out == "." || out == "..") return "_" + out;
  return out;
}

std::string NormalDirPath(const std::string& path) {
  std::string s = std::filesystem::path(path).lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace trainctl
