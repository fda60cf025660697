// Answers the coordinator's ReadFile (trainctl fetch): one bounded piece of
// a checkpoint or final model on this host, and on request the whole file's
// CRC-32 (the checksum checkpoints are recorded with).
//
// Called by the WorkerDaemon on its loop. Stateless; thread-safe.
#pragma once

#include <functional>
#include <string>

#include "trainctl/v1/worker_service.pb.h"

namespace trainctl::worker {

// Largest piece sent, whatever the request asks.
inline constexpr int kMaxFileChunkBytes = 1 << 20;

// The answer to `req`. `allowed` gets the canonical path (symlinks and ".."
// resolved) and says whether this worker may send it; a refused, missing or
// non-regular file is answered with `error` set.
v1::FileChunk ReadArtifactChunk(const v1::ReadFile& req,
                                const std::function<bool(const std::string& canonical)>& allowed);

// True when canonical `path` lies inside canonical directory `dir`.
bool PathIsUnder(const std::string& path, const std::string& dir);

}  // namespace trainctl::worker
