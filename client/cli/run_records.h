// `trainctl run`'s kept runs on disk: the runs directory, one directory per
// run (<UTC yyyymmdd-hhmmss>-<job name>, 0700) holding its state.db, its
// run.txt record and, while the run goes on, live.txt.
//
// live.txt: while a run goes on, its embedded coordinator holds the
// database locked; live.txt in the run's directory says how to ask the run
// itself instead: `address` (loopback), a viewer `token` (reads only:
// status, describe, logs, metrics, checkpoints, fetch) and the `pid` of the
// `trainctl run` that serves it. The file is 0600 in the run's 0700
// directory: only this Unix user can read the token. It goes when the run
// ends; one left by a killed run is told apart by its pid being gone, or
// its address not answering (run.cc), and --run then reads the database.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cli/cli.h"

namespace trainctl::cli {

inline constexpr char kRunRecord[] = "run.txt";
inline constexpr char kLiveRecord[] = "live.txt";

// A record file's key=value lines. run.txt: job, name, started, cwd,
// command; state once it is over. live.txt: address, token, pid.
using RunRecord = std::map<std::string, std::string>;

// Where local runs keep their state: $TRAINCTL_RUNS_DIR, else
// $XDG_STATE_HOME/trainctl/runs, else ~/.local/state/trainctl/runs.
std::string RunsDir(const CliEnvironment& env);

// A record file (run.txt, live.txt); empty when absent.
RunRecord ReadRecordFile(const std::string& path);
RunRecord ReadRunRecord(const std::string& dir);
// Writes a record file, private to the user (0600, atomically); a newline
// in a value becomes a space.
absl::Status WriteRecordFile(const std::string& path, const RunRecord& r);
absl::Status WriteRunRecord(const std::string& dir, const RunRecord& r);

// The run's live record when the process that wrote it is still there
// (signal 0 reaches only this user's processes); nullopt otherwise.
std::optional<RunRecord> LiveRecordOf(const std::string& dir);

// Every kept run (a directory with a run.txt) under `runs`, oldest first
// (names start with their UTC start time).
std::vector<std::string> KeptRuns(const std::string& runs);

// A new run's directory under RunsDir, private to the user; the oldest
// runs past the kept number (50) are removed first.
absl::StatusOr<std::string> NewRunDir(const CliEnvironment& env, const std::string& name);

// --run RUN: a directory (holding state.db), or under the runs directory a
// run's name, a unique start or end of one, or "latest".
absl::StatusOr<std::string> FindRun(const CliEnvironment& env, const std::string& run);

}  // namespace trainctl::cli
