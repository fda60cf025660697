// torchrun's command line for `trainctl run` and `trainctl submit`:
//
//   trainctl run --nproc-per-node 2 train.py --epochs 3
//
// FILE is then a program (not a job.yaml) and everything after it is its
// own arguments; the verb builds a command job (docs/command-jobs.md) that
// runs `python3 train.py --epochs 3` as every rank, in the current directory.
//
// Pure functions; thread-safe.
#pragma once

#include <functional>
#include <optional>
#include <ostream>
#include <streambuf>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/jobspec/job_spec.h"

namespace CLI {
class App;
}

namespace trainctl {
class Client;
}

namespace trainctl::cli {

struct CliContext;

// torchrun's --redirects / --tee value: 0 (none), 1 (stdout), 2 (stderr),
// 3 (both), for every rank, or per rank as "0:1,1:2" (ranks not named: 0).
// Mask(rank) is the streams selected (bit 1 stdout, bit 2 stderr).
class StdStreams {
 public:
  // InvalidArgument naming `flag` and the reason.
  static absl::StatusOr<StdStreams> Parse(const std::string& flag, const std::string& text);
  int Mask(int rank) const;
  bool any() const;

 private:
  int all_ = 0;
  std::vector<std::pair<int, int>> per_rank_;
};

// Where the ranks' output goes besides the terminal (torchrun's --log-dir,
// --redirects, --tee): with a log dir, the streams `redirects` or `tee`
// select for a rank are written to <log_dir>/<job id>/attempt_<N>/<rank>/
// {stdout,stderr}.log (N: restarts before the attempt, from 0, as
// torchrun's; each selected stream has its file, empty when the rank wrote
// nothing to it); what `redirects` selects is kept off the terminal.
struct RankOutput {
  std::string log_dir;
  StdStreams redirects, tee;
};

// FollowJob, with every rank's log lines printed live as torchrun --tee
// does ("[rank1]: epoch 0 ..."), for command jobs in table output, and
// written to per-rank files as `out` says.
int FollowJobWithRankOutput(CliContext& ctx, Client& client, const std::string& job_id,
                            const RankOutput& out = {});

// Two writers on one terminal: the follow printer (status_out: its lines and
// its status line, which has no newline and is redrawn with "\r\033[K") and
// the ranks' output (lines_out, whole lines), from two threads. A rank line
// never lands on the status line's screen line: when a status line is
// showing, it is cleared first and drawn again below the rank's line.
// Without a terminal the follow printer draws no status line, and nothing
// here adds a control character. Thread-safe (one mutex).
class TerminalMux {
 public:
  explicit TerminalMux(std::ostream& target);
  ~TerminalMux();
  std::ostream& status_out() { return status_out_; }
  std::ostream& lines_out() { return lines_out_; }

 private:
  class Sink : public std::streambuf {
   public:
    Sink(TerminalMux& mux, bool status);
    ~Sink() override;

   protected:
    int overflow(int c) override;
    std::streamsize xsputn(const char* s, std::streamsize n) override;
    int sync() override;

   private:
    TerminalMux& mux_;
    const bool status_;
    std::string pending_;
  };

  std::ostream& target_;
  absl::Mutex mu_;
  // The status line on screen now ("" when none).
  std::string status_ ABSL_GUARDED_BY(mu_);
  Sink status_sink_, lines_sink_;
  std::ostream status_out_, lines_out_;
};

struct ScriptJobFlags {
  // Ranks per node (torchrun's --nproc-per-node); 0 = not given.
  int nproc_per_node = 0;
  // Nodes (torchrun's --nnodes): world_size = nproc_per_node * nnodes; > 1
  // sets scheduling.nodes (exactly nnodes workers, nproc_per_node on each).
  int nnodes = 1;
  // Interpreter for a .py FILE.
  std::string python = "python3";
  // Arguments after FILE, for the program.
  std::vector<std::string> script_args;
  // torchrun's --max-restarts: restart.max_restarts (unset: torchrun's 0,
  // for `run` and `submit` alike).
  std::optional<int> max_restarts;
  // torchrun's --standalone: accepted (a local run is standalone already).
  bool standalone = false;
  // A torchrun rendezvous flag that was given (trainctl does the
  // rendezvous): refused by ScriptJobSpec, naming it.
  std::string rendezvous_flag;
  // torchrun's --log-dir, --redirects, --tee (RankOutput; "" = not given).
  std::string log_dir;
  std::string redirects;
  std::string tee;
};

// The RankOutput the flags ask for; InvalidArgument naming the flag (a
// --redirects or --tee without --log-dir, or a malformed value).
absl::StatusOr<RankOutput> RankOutputOf(const ScriptJobFlags& flags);

// Adds --nproc-per-node (also --nproc_per_node), --nnodes, --max-restarts,
// --standalone, torchrun's rendezvous flags (to refuse them), --python and
// the trailing ARGS to a verb that takes FILE.
void AddScriptOptions(CLI::App* verb, ScriptJobFlags* flags);

// FILE names a program rather than a job.yaml: it does not end in .yaml or
// .yml, or --nproc-per-node was given.
bool IsScriptForm(const std::string& file, const ScriptJobFlags& flags);

// The command job for FILE (a .py file runs under flags.python), in the
// current directory, with `sets` applied like on a job.yaml.
ParsedJobSpec ScriptJobSpec(const std::string& file, const ScriptJobFlags& flags,
                            const std::vector<std::string>& sets);

// argv with "--" inserted after the FILE of `run` or `submit` when it names
// a program and arguments follow, so that the program's own options
// (`--epochs 3`) are not taken for trainctl's. `takes_value(arg)`: arg is one
// of trainctl's options (global, run or submit) that takes a separate value
// (RunCli derives it from the CLI11 declarations; see
// ScriptVerbOptionTakesValue in cli.h).
std::vector<std::string> SeparateScriptArgs(
    int argc, const char* const argv[], const std::function<bool(const std::string&)>& takes_value);

}  // namespace trainctl::cli
