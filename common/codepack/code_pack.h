// A job's code as one archive (docs/command-jobs.md, "Code travels with the
// job"): PackDirectory makes a deterministic POSIX ustar tar of a directory
// (sorted names, mtime 0, uid/gid 0, modes 0644/0755 by the owner's execute
// bit, no owner names), honouring .gitignore and .trainctlignore; UnpackArchive
// writes one back under a directory, refusing anything that is not a plain
// file or directory inside it.
//
// Threading: none; every call is independent.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/file_env.h"

namespace trainctl::codepack {

struct PackOptions {
  // The archive may not be larger than this (bytes); over it, the refusal
  // names the limit and the biggest files.
  int64_t max_bytes = int64_t{64} << 20;
};

struct PackedCode {
  // "sha256:" + 64 lowercase hex of the archive's bytes.
  std::string digest;
  int64_t size_bytes = 0;
  int32_t files = 0;
};

// Packs `dir` into the archive file `archive_path` (written whole or not at
// all). Skipped: `.git/`, whatever `.gitignore` files (in `dir` and below,
// each for its own subtree) and `.trainctlignore` (same syntax) exclude,
// `__pycache__/` and `*.pyc`. A symlink is packed as the file it names when
// that lies inside `dir`, refused naming it when it points outside;
// sockets, devices and FIFOs are refused naming them. InvalidArgument for a
// `dir` that is not a directory; ResourceExhausted over max_bytes.
absl::StatusOr<PackedCode> PackDirectory(const std::string& dir, const std::string& archive_path,
                                         const PackOptions& options = {});

struct UnpackOptions {
  // Refuse an archive that would write more than this many bytes of files.
  int64_t max_bytes = int64_t{1} << 30;
  // The file system's calls that make and write the unpacked files
  // (common/file_env.h); null: the real ones.
  FileEnv* env = nullptr;
};

// Unpacks `archive_path` (a ustar tar as PackDirectory makes) into
// `dest_dir`, which must exist and be empty. Only regular files and
// directories; a name that is absolute, has a `..` component, or is a
// link, device or anything else is refused naming the entry (DataLoss),
// and nothing is written outside `dest_dir`. Files get 0644 or 0755 as
// their mode's owner execute bit says, directories 0755. Over
// options.max_bytes: ResourceExhausted naming the entry; a truncated
// archive (no end-of-archive marker) or a header whose checksum is wrong:
// DataLoss. On any error dest_dir may hold part of the archive: the caller
// removes it.
absl::Status UnpackArchive(const std::string& archive_path, const std::string& dest_dir,
                           const UnpackOptions& options = {});

// The same, reading the archive from `fd` (open for reading, at its start;
// not closed): a caller that opened it under another identity than the one
// that writes `dest_dir` (the worker opens its cache as itself and unpacks
// as the job's ranks' user).
absl::Status UnpackArchiveFd(int fd, const std::string& dest_dir,
                             const UnpackOptions& options = {});

// "sha256:<hex>" of a file's bytes.
absl::StatusOr<std::string> FileDigest(const std::string& path);

}  // namespace trainctl::codepack
