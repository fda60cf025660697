#include "common/jobspec/gpu_flavor.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"

namespace trainctl {

std::string GpuFlavorProblem(std::string_view flavor) {
  if (flavor.empty()) return "must not be empty";
  if (flavor.size() > kMaxGpuFlavorLength) {
    return "must be at most 63 characters";
  }
  auto lower_or_digit = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!lower_or_digit(flavor[0])) return "must start with a lowercase letter or a digit";
  for (char c : flavor) {
    if (!lower_or_digit(c) && c != '.' && c != '_' && c != '-') {
      return "may hold only lowercase letters, digits, '.', '_' and '-' (a GPU model such as h100 "
             "or a100)";
    }
  }
  return "";
}

std::string NormalizeGpuFlavor(std::string_view gpu_name) {
  const std::string lower =
      absl::AsciiStrToLower(absl::string_view(gpu_name.data(), gpu_name.size()));
  std::vector<std::string> words;
  for (absl::string_view w : absl::StrSplit(lower, absl::ByAnyChar(" -_\t"), absl::SkipEmpty())) {
    if (w == "nvidia" || w == "tesla" || w == "geforce" || w == "quadro") continue;
    words.emplace_back(w);
  }
  if (words.empty()) return "";
  std::string word = words[0];
  if ((word == "rtx" || word == "gtx") && words.size() > 1) word += words[1];
  std::string flavor;
  for (char c : word) {
    if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.') flavor.push_back(c);
  }
  // A leading '.' would not be a valid name; neither would an over-long one.
  while (!flavor.empty() && flavor[0] == '.') flavor.erase(0, 1);
  if (flavor.size() > kMaxGpuFlavorLength) flavor.resize(kMaxGpuFlavorLength);
  return flavor;
}

}  // namespace trainctl
