#include "common/jobspec/artifact_names.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace trainctl {

std::string JobManifestName(const std::string& job_id) { return absl::StrCat(job_id, ".trainctl-job"); }

std::string FinalModelFileName(const std::string& job_id) { return absl::StrCat(job_id, ".model.pt"); }

bool IsCheckpointFileName(const std::string& job_id, std::string_view file) {
  const std::string prefix = absl::StrCat(job_id, ".ckpt-epoch-");
  absl::string_view name(file.data(), file.size());
  if (job_id.empty() || !absl::ConsumePrefix(&name, prefix) || !absl::ConsumeSuffix(&name, ".pt")) return false;
  auto digits = [](absl::string_view d) {
    return !d.empty() && d.size() <= 12 && std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  const size_t dash = name.find('-');
  if (dash == absl::string_view::npos) return digits(name);
  return digits(name.substr(0, dash)) && digits(name.substr(dash + 1));
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
