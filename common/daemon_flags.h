// One flag style for every binary: kebab-case, as the CLI spells them.
//
// The daemons define their flags with abseil, whose names are C identifiers
// (work_dir). ParseDaemonFlags accepts both spellings (--work-dir and the
// older --work_dir), and answers --help with this binary's own flags in
// kebab-case, their defaults and help text (abseil's own listing names the
// build machine's source paths and snake_case).
//
//   int main(int argc, char** argv) {
//     trainctl::ParseDaemonFlags(argc, argv, "trainctl-worker --coordinator HOST:PORT ...",
//                                "worker/daemon/main.cc");
//
// Not thread-safe: call once, first thing in main.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainctl {

// "--work-dir=a-b" → "--work_dir=a-b": dashes inside a flag's name become
// underscores; the value and anything not shaped like "--name" is unchanged.
std::string SnakeCaseFlagArg(absl::string_view arg);
// "work_dir" → "work-dir".
std::string KebabCaseFlagName(absl::string_view name);

// The help text of the flags defined in files whose path ends with
// `flags_file_suffix`, sorted by name, in kebab-case.
std::string DaemonFlagsHelp(absl::string_view usage, absl::string_view flags_file_suffix);

// Rewrites argv's flag names to abseil's spelling (up to a bare "--"), then
// parses. --help / -h / --helpshort print DaemonFlagsHelp and exit 0;
// --helpfull is abseil's (every linked flag). Errors exit 1 as abseil does.
// Returns the positional arguments, argv[0] first (abseil's ParseCommandLine).
std::vector<char*> ParseDaemonFlags(int argc, char** argv, absl::string_view usage,
                                    absl::string_view flags_file_suffix);

// --umask's value: octal digits ("0077", "027"), at most 0777.
// INVALID_ARGUMENT naming --umask otherwise.
absl::StatusOr<mode_t> ParseUmask(absl::string_view text);

}  // namespace trainctl
