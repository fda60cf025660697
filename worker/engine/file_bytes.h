// Whole-file reads for the dataset and model loaders in this folder
// (idx_dataset, csv_dataset, tensor_file_dataset). Internal to the engine.
//
// Threading: stateless free functions, safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainctl::engine {

// The file's bytes. NotFound when it does not exist, InvalidArgument when it
// is not a regular file, Internal on a read error; `what` names the file's
// role in messages (e.g. "IDX images file").
absl::StatusOr<std::vector<char>> ReadFileBytes(const std::string& path, absl::string_view what);

// True when `bytes` starts with the gzip magic (1f 8b).
bool IsGzip(const std::vector<char>& bytes);

// Inflates a whole gzip stream (several members allowed). InvalidArgument
// naming `path` when the data is corrupt or truncated, or when it inflates
// to more than `max_bytes` (a decompression bomb); with `prefix_only`, the
// first `max_bytes` (or fewer) are returned instead and the rest is not
// inflated (to read a header that bounds the whole).
absl::StatusOr<std::vector<char>> Gunzip(const std::vector<char>& compressed,
                                         const std::string& path, size_t max_bytes = SIZE_MAX,
                                         bool prefix_only = false);

}  // namespace trainctl::engine
