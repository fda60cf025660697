#include "client/cli/code_upload.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/format_bytes.h"

namespace trainctl::cli {

namespace fs = std::filesystem;

absl::StatusOr<std::string> PlanCodeUpload(bool script, const CodeFlags& flags, v1::JobSpec* spec) {
  if (!flags.working_dir.empty() && !spec->has_command()) {
    return absl::InvalidArgumentError(
        "--working-dir: the job is not a command job (it has no command:), and only a command "
        "job's code is "
        "packed; leave --working-dir out (docs/command-jobs.md)");
  }
  if (flags.working_dir.empty() && !script) return std::string();  // a job.yaml as it is
  std::error_code ec;
  fs::path dir =
      flags.working_dir.empty() ? fs::current_path(ec) : fs::absolute(flags.working_dir, ec);
  if (ec)
    return absl::InvalidArgumentError(
        absl::StrCat("--working-dir ", flags.working_dir, ": ", ec.message()));
  dir = dir.lexically_normal();
  std::string dir_text = dir.string();
  while (dir_text.size() > 1 && dir_text.back() == '/') dir_text.pop_back();
  if (!flags.working_dir.empty() && !fs::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--working-dir ", flags.working_dir, ": not a directory"));
  }
  v1::CommandSpec* command = spec->mutable_command();
  // A program's working_dir is ScriptJobSpec's current directory: replaced.
  const std::string own = script ? "" : command->working_dir();
  if (!own.empty() && absl::StartsWith(own, "/")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "command.working_dir: ", own, " is absolute, and --working-dir ", flags.working_dir,
        " also says where the ranks start; make working_dir relative to that directory, or drop "
        "one of them"));
  }
  if (flags.no_upload) {
    command->set_working_dir(own.empty() ? dir_text : (dir / own).lexically_normal().string());
    return std::string();
  }
  if (script) command->clear_working_dir();
  return dir_text;
}

std::string CodeLine(const UploadedCode& uploaded) {
  const v1::CodePackage& c = uploaded.code;
  std::string digest = c.digest();
  // "sha256:" and the first 8 hex digits: enough to tell packages apart.
  if (digest.size() > 15) digest = absl::StrCat(digest.substr(0, 15), "\u2026");
  return absl::StrCat("code: ", c.files(), c.files() == 1 ? " file, " : " files, ",
                      FormatBytes(c.size_bytes()), ", ", digest,
                      uploaded.already_stored ? " (already stored)" : " (uploaded)");
}

}  // namespace trainctl::cli
