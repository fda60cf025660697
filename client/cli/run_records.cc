// Kept runs on disk (see run_records.h).
#include "client/cli/run_records.h"

#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/auth/secret.h"

namespace trainctl::cli {
namespace {

namespace fs = std::filesystem;

// How many runs the runs directory keeps; a new run removes the oldest past it.
constexpr size_t kKeptRuns = 50;

}  // namespace

// Where local runs keep their state: $TRAINCTL_RUNS_DIR, else
// $XDG_STATE_HOME/trainctl/runs, else ~/.local/state/trainctl/runs.
std::string RunsDir(const CliEnvironment& env) {
  if (std::optional<std::string> d = env.getenv("TRAINCTL_RUNS_DIR"); d && !d->empty()) return *d;
  if (std::optional<std::string> x = env.getenv("XDG_STATE_HOME"); x && !x->empty())
    return *x + "/trainctl/runs";
  std::optional<std::string> home = env.getenv("HOME");
  std::string h = home && !home->empty() ? *home : "";
  if (h.empty()) {
    std::vector<char> buf(16384);
    struct passwd pw {};
    struct passwd* found = nullptr;
    if (getpwuid_r(geteuid(), &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr)
      h = found->pw_dir;
  }
  return h + "/.local/state/trainctl/runs";
}

// A run's record (run.txt: key=value lines): job, name, started, cwd,
// command; state once it is over.

// A record file of key=value lines (run.txt, live.txt); empty when absent.
RunRecord ReadRecordFile(const std::string& path) {
  RunRecord r;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) r[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return r;
}

RunRecord ReadRunRecord(const std::string& dir) { return ReadRecordFile(dir + "/" + kRunRecord); }

// Writes a record file, private to the user (0600, atomically).
absl::Status WriteRecordFile(const std::string& path, const RunRecord& r) {
  std::string text;
  for (const auto& [k, v] : r) {
    std::string one_line = v;
    for (char& c : one_line) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    absl::StrAppend(&text, k, "=", one_line, "\n");
  }
  return auth::WritePrivateFile(path, text);
}

absl::Status WriteRunRecord(const std::string& dir, const RunRecord& r) {
  return WriteRecordFile(dir + "/" + kRunRecord, r);
}

// The run's live record when the process that wrote it is still there
// (signal 0 reaches only this user's processes); nullopt otherwise.
std::optional<RunRecord> LiveRecordOf(const std::string& dir) {
  RunRecord r = ReadRecordFile(dir + "/" + kLiveRecord);
  if (r["address"].empty() || r["token"].empty()) return std::nullopt;
  int pid = 0;
  if (!absl::SimpleAtoi(r["pid"], &pid) || pid <= 0 || ::kill(pid, 0) != 0) return std::nullopt;
  return r;
}

// Every kept run (a directory with a run.txt), oldest first (names start
// with their UTC start time).
std::vector<std::string> KeptRuns(const std::string& runs) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(runs, ec)) {
    if (e.is_directory(ec) && fs::exists(e.path() / kRunRecord, ec))
      out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A new run's directory: <runs>/<UTC yyyymmdd-hhmmss>-<job name>, private
// to the user; the oldest runs past kKeptRuns are removed first.
absl::StatusOr<std::string> NewRunDir(const CliEnvironment& env, const std::string& name) {
  const std::string runs = RunsDir(env);
  std::error_code ec;
  fs::create_directories(runs, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("runs directory ", runs, ": cannot create it: ", ec.message()));
  }
  std::vector<std::string> kept = KeptRuns(runs);
  for (size_t i = 0; i + kKeptRuns <= kept.size(); ++i)
    fs::remove_all(fs::path(runs) / kept[i], ec);
  const std::string base =
      absl::StrCat(absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::UTCTimeZone()), "-", name);
  for (int n = 1; n < 1000; ++n) {
    const std::string dir = absl::StrCat(runs, "/", base, n == 1 ? "" : absl::StrCat("-", n));
    if (::mkdir(dir.c_str(), 0700) == 0) return dir;
    if (errno != EEXIST) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create ", dir, ": ", std::strerror(errno)));
    }
  }
  return absl::ResourceExhaustedError(absl::StrCat("too many runs named ", base, " in ", runs));
}

// --run RUN: a directory (holding state.db), or under the runs directory a
// run's name, a unique start or end of one, or "latest".
absl::StatusOr<std::string> FindRun(const CliEnvironment& env, const std::string& run) {
  std::error_code ec;
  if (run.find('/') != std::string::npos || run == "." || run == "..") {
    if (fs::exists(fs::path(run) / "state.db", ec)) return run;
    return absl::NotFoundError(
        absl::StrCat("--run ", run, ": no state.db there (not a trainctl run's directory)"));
  }
  const std::string runs = RunsDir(env);
  std::vector<std::string> kept = KeptRuns(runs);
  if (run == "latest") {
    if (kept.empty()) return absl::NotFoundError(absl::StrCat("--run latest: no runs in ", runs));
    return runs + "/" + kept.back();
  }
  std::vector<std::string> match;
  for (const std::string& k : kept) {
    if (k == run) return runs + "/" + k;
    if (absl::StartsWith(k, run) || absl::EndsWith(k, "-" + run)) match.push_back(k);
  }
  if (match.size() == 1) return runs + "/" + match[0];
  if (match.empty()) {
    return absl::NotFoundError(
        absl::StrCat("--run ", run, ": no such run in ", runs, " (trainctl runs lists them)"));
  }
  return absl::InvalidArgumentError(absl::StrCat("--run ", run, ": matches ", match.size(),
                                                 " runs (", absl::StrJoin(match, ", "),
                                                 "); name one"));
}

}  // namespace trainctl::cli
