// The names of a job's files in its checkpoint directory, and of the
// directory's manifests: one definition that the coordinator (which records
// only reports with these names), the worker daemon (which serves only
// files with these names) and the rank (which writes them) share.
//
// A checkpoint directory may hold several jobs of one owner, so every file a
// job writes there starts with its job id and no job overwrites another's
// (docs/checkpoints.md "Whose directory").
//
// Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace trainctl {

// The directory's claim: which owner's jobs may write there (written once,
// by the first job's worker daemon).
inline constexpr char kDirManifestName[] = ".trainctl-dir";

// "<job>.trainctl-job": the job's manifest in a directory it writes, written
// by the worker daemon before its ranks start. A worker serves a file of a
// job only from a directory holding this manifest.
std::string JobManifestName(const std::string& job_id);

// "<job>.model.pt": the final model (TorchScript) the checkpoint writer exports.
std::string FinalModelFileName(const std::string& job_id);

// "<job>.ckpt-epoch-NNNNNN.pt" or "<job>.ckpt-epoch-NNNNNN-CCCCCCCCCC.pt"
// (digits only, at most 12 each), each optionally with ".<writer>" before
// ".pt" (a per-host copy: the writing worker's id, so that hosts sharing
// one directory never write one path), as worker/trainer/checkpoint.cc
// writes them.
bool IsCheckpointFileName(const std::string& job_id, std::string_view name);

// The parts of a checkpoint file name after "<job>.ckpt-epoch-" (or
// "ckpt-epoch-") and before ".pt": "NNNNNN[-CCCCCCCCCC][.<writer>]".
struct CheckpointNameParts {
  int64_t epochs_done = 0;
  int64_t epoch_consumed = 0;
  std::string writer;  // "" for a shared or single copy
};
std::optional<CheckpointNameParts> ParseCheckpointStem(std::string_view stem);

// A worker id as a checkpoint name's writer part: [A-Za-z0-9._-], others
// '_', at most 128 bytes.
std::string CheckpointWriterTag(const std::string& worker_id);
bool IsFinalModelFileName(const std::string& job_id, std::string_view name);

// `owner` as one safe path component ([A-Za-z0-9._-], others '_'; never
// "", "." or ".."): the default checkpoint dir under a --checkpoint-root is
// <root>/<OwnerPathComponent(owner)>/<job id>.
std::string OwnerPathComponent(const std::string& owner);

// `path` without "." / ".." components, repeated or trailing '/' (lexically:
// no symlink is resolved).
std::string NormalDirPath(const std::string& path);

}  // namespace trainctl
