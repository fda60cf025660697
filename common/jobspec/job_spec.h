// job.yaml ⇄ trainctl.v1.JobSpec: parsing, validation and defaults.
//
// One library for both sides: the CLI validates a file before anything is
// sent, and the coordinator validates every JobSpec a gRPC client submits
// with the same rules. Errors name the place, the field and the reason:
//
//   job.yaml:14:9: training.optimizer.lr: must be > 0, got -1
//
// Field paths are job.yaml paths ("model.input_dim", "data.train.images"),
// also for errors about a JobSpec that came over gRPC (no position then).
//
// Pure functions; thread-safe.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

// One problem with a job spec.
struct SpecError {
  // File name as given by the caller; empty for a spec from gRPC.
  std::string file;
  // 1-based; 0 when there is no position.
  int line = 0;
  int column = 0;
  // job.yaml path of the field, e.g. "training.optimizer.lr"; empty for the
  // document as a whole.
  std::string field;
  std::string message;

  // "file:line:col: field: message" (parts without a value are left out).
  std::string ToString() const;
};

// Limits that keep hostile input harmless.
inline constexpr size_t kMaxJobYamlBytes = 1 << 20;
inline constexpr int kMaxReportedErrors = 50;

struct ParsedJobSpec {
  // The resolved spec (defaults filled) when errors is empty; otherwise as
  // much as could be read.
  v1::JobSpec spec;
  // Every problem found, in document order; empty when the spec is valid.
  std::vector<SpecError> errors;

  bool ok() const { return errors.empty(); }
};

// Parses and validates job.yaml text. `file` only labels error messages.
// `overrides` are "key.path=value" settings (the CLI's --set), applied on top
// of the file before validation; an error in one names "--set" as its file.
ParsedJobSpec ParseJobSpecYaml(std::string_view yaml, std::string_view file,
                               const std::vector<std::string>& overrides = {});

// Reads `path` and parses it. A file that cannot be read is one error.
ParsedJobSpec ParseJobSpecFile(const std::string& path,
                               const std::vector<std::string>& overrides = {});

// Validates a spec as a gRPC client sent it: zero values mean "default".
// Returns every problem (without positions).
std::vector<SpecError> ValidateJobSpec(const v1::JobSpec& spec);

// The bounds of per-rank `resources` (0 = no limit; else cpus in
// [0.01, 4096], memory >= 1Mi, pids in [8, 4194304]), shared by job.yaml
// and a queue's default_resources: one error per bad field, named
// `prefix`.cpus / .memory / .pids, without positions.
std::vector<SpecError> CheckResourceSpec(const v1::ResourceSpec& r, std::string_view prefix);

// Fills every unset (zero) field with its default. Idempotent. Call after
// ValidateJobSpec returned no errors.
void ResolveJobSpecDefaults(v1::JobSpec* spec);

// OK when errors is empty; otherwise InvalidArgument whose message holds one
// error per line.
absl::Status SpecErrorsToStatus(const std::vector<SpecError>& errors);

// Renders a spec back to job.yaml; fields at their zero value ("default")
// are left out, so parsing the text gives the same spec.
std::string JobSpecToYaml(const v1::JobSpec& spec);

// The resolved spec as flat "job.yaml path" → text pairs, for the rank
// process config (worker/protocol/rank_protocol.h): "model.name" → "mlp",
// "model.hidden" → "64,32", "data.train.format" → "synthetic",
// "training.optimizer.lr" → "0.001", bools "true"/"false", enums by their
// job.yaml names. Unset messages (e.g. no data.eval) produce no keys.
std::map<std::string, std::string> JobSpecToFlat(const v1::JobSpec& spec);

// Hash of the resolved spec's fields that shape model and optimizer state
// (model, training.optimizer.name): written into every checkpoint's
// manifest and checked before a resume loads one. "fnv64:<16 hex digits>".
std::string CheckpointSpecHash(const v1::JobSpec& spec);

// Whether a job with spec `to` may start from a checkpoint of job `from_id`
// (spec `from`): one error per field that makes the state incompatible.
std::vector<SpecError> CheckResumeCompatible(const v1::JobSpec& from, const std::string& from_id,
                                             const v1::JobSpec& to);

// A variable the worker sets for every rank of a command job (torchrun's
// contract and TRAINCTL_*): command.env may not set it. OMP_NUM_THREADS and
// PYTHONPATH are not among them (the job may choose them).
bool IsCommandContractVariable(std::string_view name);

// The user-facing lower-case name of an enum value ("adam", "cuda", ...).
std::string EnumValueName(const google::protobuf::EnumValueDescriptor* value);

}  // namespace trainctl
