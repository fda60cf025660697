// Code travels with the job (docs/command-jobs.md): which directory
// `trainctl submit` packs and uploads for a command job, and what it leaves
// in the spec. `trainctl run` packs nothing (its worker is this host).
//
// Pure functions; thread-safe.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "trainctl/client.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::cli {

struct CodeFlags {
  // --working-dir DIR: the directory whose code the ranks run (default: the
  // current directory for a program FILE; none for a job.yaml).
  std::string working_dir;
  // --no-upload: use the directory as a path every worker has (a shared
  // mount) instead of packing it.
  bool no_upload = false;
};

// The directory to pack for `spec` (absolute; "" when nothing is packed),
// with spec.command.working_dir set as the job needs it: with no_upload the
// directory itself (a job.yaml's relative working_dir inside it), else
// cleared for a program (the ranks start at the unpacked root; FILE stays
// relative) and kept for a job.yaml when relative (a path inside the
// package). `script`: FILE names a program (IsScriptForm). InvalidArgument
// naming --working-dir for a job that is not a command job or a DIR that is
// not a directory, and naming command.working_dir when it is absolute while
// --working-dir also says where the ranks start.
absl::StatusOr<std::string> PlanCodeUpload(bool script, const CodeFlags& flags, v1::JobSpec* spec);

// "code: 12 files, 34.5 KiB, sha256:abcd1234… (uploaded)" (or "already stored").
std::string CodeLine(const UploadedCode& uploaded);

}  // namespace trainctl::cli
