#include "client/cli/script_job.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <streambuf>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/cli/context.h"
#include "common/status_macros.h"

namespace trainctl::cli {

namespace fs = std::filesystem;

// --- TerminalMux -------------------------------------------------------------

namespace {
// What the follow printer draws a status line with (follow.cc).
constexpr std::string_view kClearLine = "\r\033[K";
}  // namespace

TerminalMux::Sink::Sink(TerminalMux& mux, bool status) : mux_(mux), status_(status) {}

TerminalMux::Sink::~Sink() { sync(); }

int TerminalMux::Sink::overflow(int c) {
  if (c == traits_type::eof()) return 0;
  pending_.push_back(static_cast<char>(c));
  // Rank output goes out a whole line at a time; the follow printer's
  // text (a status line has no newline) whenever it flushes.
  if (c == '\n' && !status_) sync();
  return c;
}

std::streamsize TerminalMux::Sink::xsputn(const char* s, std::streamsize n) {
  for (std::streamsize i = 0; i < n; ++i) overflow(static_cast<unsigned char>(s[i]));
  return n;
}

int TerminalMux::Sink::sync() {
  if (pending_.empty()) return 0;
  absl::MutexLock lock(&mux_.mu_);
  if (status_) {
    mux_.target_ << pending_;
    // What is on the status line's screen line now: the text after the last
    // newline and after the last clear.
    std::string screen = mux_.status_ + pending_;
    if (const size_t nl = screen.rfind('\n'); nl != std::string::npos) screen.erase(0, nl + 1);
    if (const size_t cl = screen.rfind(kClearLine); cl != std::string::npos)
      screen.erase(0, cl + kClearLine.size());
    mux_.status_ = std::move(screen);
  } else if (mux_.status_.empty()) {
    mux_.target_ << pending_;
  } else {
    // Clear the status line, print the rank's lines, draw the status again
    // below them: no screen line holds both.
    mux_.target_ << kClearLine << pending_ << mux_.status_;
  }
  mux_.target_ << std::flush;
  pending_.clear();
  return 0;
}

TerminalMux::TerminalMux(std::ostream& target)
    : target_(target),
      status_sink_(*this, true),
      lines_sink_(*this, false),
      status_out_(&status_sink_),
      lines_out_(&lines_sink_) {}

TerminalMux::~TerminalMux() {
  status_out_ << std::flush;
  lines_out_ << std::flush;
}

absl::StatusOr<StdStreams> StdStreams::Parse(const std::string& flag, const std::string& text) {
  StdStreams s;
  auto stream = [&](absl::string_view v, int* out) -> absl::Status {
    if (!absl::SimpleAtoi(v, out) || *out < 0 || *out > 3) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", v, "' is not 0 (none), 1 (stdout), 2 (stderr) or 3 (both)"));
    }
    return absl::OkStatus();
  };
  if (text.empty()) return s;
  if (text.find(':') == std::string::npos) {
    TRAINCTL_RETURN_IF_ERROR(stream(text, &s.all_));
    return s;
  }
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> kv = absl::StrSplit(item, ':');
    int rank = -1, mask = 0;
    if (kv.size() != 2 || !absl::SimpleAtoi(kv[0], &rank) || rank < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", item, "' is not RANK:STREAMS (e.g. 0:3,1:2)"));
    }
    TRAINCTL_RETURN_IF_ERROR(stream(kv[1], &mask));
    s.per_rank_.emplace_back(rank, mask);
  }
  return s;
}

int StdStreams::Mask(int rank) const {
  for (const auto& [r, m] : per_rank_) {
    if (r == rank) return m;
  }
  return all_;
}

bool StdStreams::any() const {
  if (all_ != 0) return true;
  for (const auto& [r, m] : per_rank_) {
    if (m != 0) return true;
  }
  return false;
}

absl::StatusOr<RankOutput> RankOutputOf(const ScriptJobFlags& flags) {
  RankOutput out;
  out.log_dir = flags.log_dir;
  TRAINCTL_ASSIGN_OR_RETURN(out.redirects, StdStreams::Parse("--redirects", flags.redirects));
  TRAINCTL_ASSIGN_OR_RETURN(out.tee, StdStreams::Parse("--tee", flags.tee));
  if (out.log_dir.empty() && (out.redirects.any() || out.tee.any())) {
    return absl::InvalidArgumentError(absl::StrCat(out.redirects.any() ? "--redirects" : "--tee",
                                                   ": needs --log-dir (where the files go)"));
  }
  return out;
}

namespace {

// The per-rank log files of one followed job, as torchrun lays them out:
// <log dir>/<job id>/attempt_<R>/<rank>/{stdout,stderr}.log, R counting
// restarts from 0 (torchrun's attempt_0 is trainctl's attempt 1). Every
// stream --redirects or --tee selects gets its file, also when the rank
// writes nothing to it (Complete, at the end). Used by one thread at a time.
class RankLogFiles {
 public:
  RankLogFiles(const RankOutput& out, std::string job_id) : out_(out), job_id_(std::move(job_id)) {}

  // True when the line stays off the terminal (its stream is redirected).
  bool Write(int32_t attempt, const v1::LogLine& l) {
    const int bit = l.stream() == v1::LogLine::STREAM_STDOUT ? 1 : 2;
    const bool redirected = (out_.redirects.Mask(l.rank()) & bit) != 0;
    std::ofstream* file = File(attempt, l.rank(), bit);
    if (file == nullptr) return false;
    *file << l.text() << "\n" << std::flush;
    return redirected;
  }

  // Makes the files of every selected stream of every rank the job's
  // attempts had, those that got no line included.
  void Complete(const v1::Job& job) {
    for (const v1::Attempt& a : job.attempts()) {
      for (const v1::RankAssignment& r : a.ranks()) {
        for (int bit : {1, 2}) File(a.number(), r.rank(), bit);
      }
    }
  }

 private:
  // The open file of (attempt, rank, stream bit), made on first use; null
  // when the stream is not selected (or the file cannot be written: said once).
  std::ofstream* File(int32_t attempt, int32_t rank, int bit) {
    if (out_.log_dir.empty()) return nullptr;
    if (((out_.redirects.Mask(rank) | out_.tee.Mask(rank)) & bit) == 0) return nullptr;
    const std::string dir =
        absl::StrCat(out_.log_dir, "/", job_id_, "/attempt_", std::max(0, attempt - 1), "/", rank);
    const std::string path = absl::StrCat(dir, bit == 1 ? "/stdout.log" : "/stderr.log");
    auto it = files_.find(path);
    if (it == files_.end()) {
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      it = files_.emplace(path, std::make_unique<std::ofstream>(path, std::ios::app)).first;
      if (!*it->second && warned_.insert(path).second) {
        std::cerr << "trainctl: cannot write " << path << (ec ? ": " + ec.message() : "") << "\n";
      }
    }
    return it->second.get();
  }

  const RankOutput& out_;
  const std::string job_id_;
  std::map<std::string, std::unique_ptr<std::ofstream>> files_;
  std::set<std::string> warned_;
};

}  // namespace

int FollowJobWithRankOutput(CliContext& ctx, Client& client, const std::string& job_id,
                            const RankOutput& out) {
  // As torchrun --tee: every rank's output, live, prefixed by its rank,
  // between the follow printer's lines (never inside one, nor after the
  // status line on the same screen line).
  TerminalMux mux(ctx.out);
  std::ostream& follow_out = mux.status_out();
  std::ostream& log_out = mux.lines_out();
  CliContext follow_ctx(follow_out, ctx.err, ctx.env);
  follow_ctx.output = ctx.output;
  follow_ctx.verb = ctx.verb;
  follow_ctx.coordinator_flag = ctx.coordinator_flag;
  follow_ctx.timeout_s = ctx.timeout_s;
  LogsOptions lo;
  lo.follow = true;
  RankLogFiles files(out, job_id);
  std::thread logs([&] {
    absl::Status s = client.Logs(job_id, lo, [&](const v1::LogChunk& chunk) {
      for (const v1::LogLine& l : chunk.lines()) {
        if (files.Write(chunk.attempt(), l)) continue;  // redirected: the file only
        log_out << "[rank" << l.rank() << "]: " << l.text() << "\n";
      }
      return true;
    });
    (void)s;  // The job's outcome is what FollowJob reports.
  });
  int code = FollowJob(follow_ctx, client, job_id);
  logs.join();
  if (!out.log_dir.empty()) {
    // Streams that stayed silent get their (empty) files too, as torchrun's.
    if (absl::StatusOr<v1::Job> job = client.Get(job_id); job.ok()) files.Complete(*job);
  }
  follow_out << std::flush;
  log_out << std::flush;
  return code;
}

void AddScriptOptions(CLI::App* verb, ScriptJobFlags* flags) {
  verb->add_option("--nproc-per-node,--nproc_per_node", flags->nproc_per_node,
                   "With a program as FILE: ranks per node, as torchrun's (default 1)")
      ->check(CLI::Range(1, 65536));
  verb->add_option(
          "--nnodes", flags->nnodes,
          "With a program as FILE: nodes; world_size = nproc-per-node x nnodes, on exactly nnodes "
          "workers with nproc-per-node ranks each (scheduling.nodes; run: 1, one host)")
      ->check(CLI::Range(1, 65536));
  verb->add_option(
          "--max-restarts,--max_restarts", flags->max_restarts,
          "As torchrun's: restarts of the whole group before the job fails (restart.max_restarts; "
          "default for a program: 0, as torchrun's)")
      ->check(CLI::Range(0, 1000));
  verb->add_flag("--standalone", flags->standalone,
                 "As torchrun's: accepted (trainctl does the rendezvous)");
  // torchrun's rendezvous flags: trainctl's coordinator does the rendezvous
  // (MASTER_ADDR/MASTER_PORT, the store), so they have nothing to set.
  for (const char* name :
       {"--rdzv-backend,--rdzv_backend", "--rdzv-endpoint,--rdzv_endpoint", "--rdzv-id,--rdzv_id",
        "--rdzv-conf,--rdzv_conf", "--master-addr,--master_addr", "--master-port,--master_port",
        "--node-rank,--node_rank"}) {
    const std::string flag = std::string(name).substr(0, std::string(name).find(','));
    verb->add_option_function<std::string>(
            name, [flags, flag](const std::string&) { flags->rendezvous_flag = flag; },
            "torchrun's; refused: the coordinator does the rendezvous")
        ->group("torchrun flags that do not apply");
  }
  verb->add_option("--log-dir,--log_dir", flags->log_dir,
                   "As torchrun's: per-rank files DIR/<job "
                   "id>/attempt_<N>/<rank>/{stdout,stderr}.log (N from 0, "
                   "as torchrun's restart count) for the streams --redirects or --tee select");
  verb->add_option(
      "--redirects", flags->redirects,
      "As torchrun's: 0 none, 1 stdout, 2 stderr, 3 both (or per rank: 0:3,1:2): those streams go "
      "to the --log-dir files only");
  verb->add_option(
      "--tee", flags->tee,
      "As torchrun's: the same values: those streams go to the --log-dir files and the terminal");
  verb->add_option(
          "--python", flags->python,
          "With a .py FILE: the interpreter every rank runs it with (a name is looked up on the "
          "worker's PATH)")
      ->capture_default_str();
  verb->add_option("ARGS", flags->script_args, "With a program as FILE: its arguments");
}

bool IsScriptForm(const std::string& file, const ScriptJobFlags& flags) {
  return flags.nproc_per_node > 0 ||
         !(absl::EndsWith(file, ".yaml") || absl::EndsWith(file, ".yml"));
}

ParsedJobSpec ScriptJobSpec(const std::string& file, const ScriptJobFlags& flags,
                            const std::vector<std::string>& sets) {
  // The job's name from the program's: "train_ddp.py" -> "train-ddp".
  std::string name;
  for (char c : fs::path(file).stem().string()) {
    if (name.size() >= 40) break;
    char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    bool ok = (l >= 'a' && l <= 'z') || (l >= '0' && l <= '9');
    if (ok) {
      name += l;
    } else if (!name.empty() && name.back() != '-') {
      name += '-';
    }
  }
  while (!name.empty() && name.back() == '-') name.pop_back();
  if (name.empty()) name = "script";

  if (!flags.rendezvous_flag.empty()) {
    ParsedJobSpec refused;
    SpecError e;
    e.field = flags.rendezvous_flag;
    e.message =
        "trainctl does the rendezvous: the coordinator places the ranks and hands each its "
        "MASTER_ADDR, "
        "MASTER_PORT, RANK and WORLD_SIZE; leave it out";
    refused.errors.push_back(e);
    return refused;
  }
  v1::JobSpec spec;
  spec.set_name(name);
  spec.set_world_size(std::max(1, flags.nproc_per_node) * std::max(1, flags.nnodes));
  // torchrun's --nnodes N: N hosts with nproc-per-node ranks on each
  // (GROUP_WORLD_SIZE = N). Without it (or N = 1) the ranks go wherever
  // they fit, as any job's.
  if (flags.nnodes > 1) spec.mutable_scheduling()->set_nodes(flags.nnodes);
  v1::CommandSpec* c = spec.mutable_command();
  if (absl::EndsWith(file, ".py")) c->add_argv(flags.python);
  c->add_argv(file);
  for (const std::string& a : flags.script_args) c->add_argv(a);
  std::error_code ec;
  c->set_working_dir(fs::current_path(ec).string());
  // torchrun's default is no restart: a script restarts only when
  // --max-restarts (or --set restart.max_restarts) says so, whether `run`
  // or `submit` starts it (a job.yaml keeps the spec's default).
  spec.mutable_restart()->set_max_restarts(flags.max_restarts.value_or(0));
  // Through the job.yaml path: the same validation, and --set on top.
  return ParseJobSpecYaml(JobSpecToYaml(spec), file, sets);
}

std::vector<std::string> SeparateScriptArgs(
    int argc, const char* const argv[],
    const std::function<bool(const std::string&)>& takes_value) {
  std::vector<std::string> out(argv, argv + argc);
  size_t i = 1;
  for (; i < out.size(); ++i) {
    if (takes_value(out[i])) {
      ++i;
      continue;
    }
    if (!out[i].empty() && out[i][0] != '-') break;
  }
  if (i >= out.size() || (out[i] != "run" && out[i] != "submit")) return out;
  for (size_t j = i + 1; j < out.size(); ++j) {
    const std::string& a = out[j];
    if (a == "--") return out;
    if (takes_value(a)) {
      ++j;
      continue;
    }
    if (a.empty() || a[0] == '-') continue;
    // FILE: a program with arguments after it gets the separator.
    if (j + 1 < out.size() && out[j + 1] != "--" && !absl::EndsWith(a, ".yaml") &&
        !absl::EndsWith(a, ".yml")) {
      out.insert(out.begin() + static_cast<std::ptrdiff_t>(j) + 1, "--");
    }
    return out;
  }
  return out;
}

}  // namespace trainctl::cli
