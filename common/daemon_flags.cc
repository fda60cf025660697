#include "common/daemon_flags.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace trainctl {

std::string SnakeCaseFlagArg(absl::string_view arg) {
  if (arg.size() < 3 || arg.substr(0, 2) != "--" || arg[2] == '-') return std::string(arg);
  std::string out(arg);
  size_t end = out.find('=');
  if (end == std::string::npos) end = out.size();
  std::replace(out.begin() + 2, out.begin() + static_cast<std::ptrdiff_t>(end), '-', '_');
  return out;
}

std::string KebabCaseFlagName(absl::string_view name) {
  std::string out(name);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

std::string DaemonFlagsHelp(absl::string_view usage, absl::string_view flags_file_suffix) {
  std::vector<absl::CommandLineFlag*> mine;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), flags_file_suffix)) mine.push_back(flag);
  }
  std::sort(mine.begin(), mine.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::string out = absl::StrCat(usage, "\n\nFlags (the snake_case spelling is also accepted):\n");
  for (const absl::CommandLineFlag* f : mine) {
    std::string def = f->DefaultValue();
    if (f->IsOfType<std::string>()) def = absl::StrCat("\"", def, "\"");
    absl::StrAppend(&out, "  --", KebabCaseFlagName(f->Name()), " (default: ", def, ")\n      ",
                    f->Help(), "\n");
  }
  absl::StrAppend(&out, "\n  --help  this text;  --helpfull  every flag linked in, abseil's too\n");
  return out;
}

std::vector<char*> ParseDaemonFlags(int argc, char** argv, absl::string_view usage,
                                    absl::string_view flags_file_suffix) {
  absl::SetProgramUsageMessage(usage);
  // argv's strings must outlive parsing (abseil keeps no pointers after it,
  // but positional arguments are returned as pointers into argv).
  static std::vector<std::string>* rewritten = new std::vector<std::string>();
  rewritten->reserve(static_cast<size_t>(argc));
  bool flags = true;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") flags = false;
    if (!flags) continue;
    if (arg == "--help" || arg == "-h" || arg == "--helpshort" || arg == "-help") {
      std::cout << DaemonFlagsHelp(usage, flags_file_suffix);
      std::exit(0);
    }
    std::string snake = SnakeCaseFlagArg(arg);
    if (snake != arg) {
      rewritten->push_back(std::move(snake));
      argv[i] = rewritten->back().data();
    }
  }
  return absl::ParseCommandLine(argc, argv);
}

absl::StatusOr<mode_t> ParseUmask(absl::string_view text) {
  mode_t mask = 0;
  bool ok = !text.empty() && text.size() <= 4;
  for (char c : text) {
    ok = ok && c >= '0' && c <= '7';
    if (ok) mask = static_cast<mode_t>(mask * 8 + static_cast<mode_t>(c - '0'));
  }
  if (!ok || mask > 0777) {
    return absl::InvalidArgumentError(
        absl::StrCat("--umask: '", text, "' is not an octal file mode mask such as 0077 or 0027"));
  }
  return mask;
}

}  // namespace trainctl
