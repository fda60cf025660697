// The end of a rank on this host: a stop the coordinator asked for, a
// process exit (with the failure's kind and message: the rank's own error
// line, the OOM killer, a signal, a command's exit code and Python
// exception), a rank that could not start, and forgetting an attempt once
// every local rank's end is reported. Each end is reported once: the
// LocalRankState transition into it decides who reports.
//
// Threading: every function here runs on the daemon's EventLoop.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "worker/daemon/oom_events.h"
#include "worker/daemon/rank_table_internal.h"

namespace trainctl::worker {

namespace {

// The failure kind of a rank's own error line.
v1::FailureKind FailureKindOf(rankproto::ErrorKind kind) {
  switch (kind) {
    case rankproto::ErrorKind::kConfig:
      return v1::FAILURE_KIND_CONFIG;
    case rankproto::ErrorKind::kCollective:
      return v1::FAILURE_KIND_COLLECTIVE;
    case rankproto::ErrorKind::kRendezvous:
      return v1::FAILURE_KIND_RENDEZVOUS;
    case rankproto::ErrorKind::kDiskFull:
      return v1::FAILURE_KIND_DISK_FULL;
    case rankproto::ErrorKind::kData:
      return v1::FAILURE_KIND_DATA;
    case rankproto::ErrorKind::kOutOfMemory:
      return v1::FAILURE_KIND_OUT_OF_MEMORY;
    case rankproto::ErrorKind::kNan:
      return v1::FAILURE_KIND_NAN;
    case rankproto::ErrorKind::kResume:
      return v1::FAILURE_KIND_RESUME;
    default:
      return v1::FAILURE_KIND_EXIT;
  }
}

// How a command rank (the user's program) ended: which rank, how and, for a
// Python exception, its line.
std::string CommandExitMessage(int32_t rank, int code, int signal, const std::string& exception) {
  std::string how = signal != 0
                        ? absl::StrCat("killed by signal ", signal, " (", strsignal(signal), ")")
                        : absl::StrCat("exited with code ", code);
  if (code == 127) how += " (the program could not be executed)";
  if (code == 2)
    how += " (a usage error: argparse rejected an argument, or python could not open the script)";
  std::string message = absl::StrCat("rank ", rank, " ", how);
  if (!exception.empty()) absl::StrAppend(&message, ": ", exception);
  return message;
}

// The first non-empty line of `text`, trimmed, at most 300 bytes.
std::string FirstLine(absl::string_view text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    return std::string(line.size() > 300 ? line.substr(0, 300) : line);
  }
  return "";
}

// The TORCHELASTIC_ERROR_FILE a command rank left (docs/command-jobs.md),
// read as the rank's user would read it (AsRankUser), never through a link,
// only a regular file of at most 1 MiB: the rank owns the directory and
// could otherwise point the daemon at a file of the daemon's. "" when
// there is none (the script has no @record, or ended before writing it).
std::string ReadErrorFile(const std::string& path, const std::optional<RunAs>& run_as) {
  if (path.empty()) return "";
  AsRankUser as_rank_user(run_as);
  if (!as_rank_user.ok()) return "";
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st {};
  std::string out;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= (1 << 20)) {
    out.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < out.size()) {
      const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    out.resize(got);
  }
  ::close(fd);
  return out;
}

}  // namespace

bool CommandCannotHeal(int code, int signal, const std::deque<std::string>& last_lines) {
  return ExceptionCannotHeal(code, signal, ExceptionLine(last_lines));
}

bool ExceptionCannotHeal(int code, int signal, const std::string& exception) {
  if (signal != 0) return false;
  // Exit 2: argparse's usage error, or python's "can't open file".
  if (code == 2) return true;
  // The program cannot be imported or parsed: the same code fails again.
  for (const char* name :
       {"ModuleNotFoundError", "ImportError", "SyntaxError", "IndentationError", "TabError"}) {
    if (absl::StartsWith(exception, name)) return true;
  }
  return false;
}

std::optional<std::string> TorchelasticErrorMessage(const std::string& json,
                                                    std::string* callstack) {
  google::protobuf::Struct doc;
  if (json.empty() || !google::protobuf::util::JsonStringToMessage(json, &doc).ok())
    return std::nullopt;
  auto field = [](const google::protobuf::Struct& s,
                  const char* name) -> const google::protobuf::Value* {
    auto it = s.fields().find(name);
    return it == s.fields().end() ? nullptr : &it->second;
  };
  const google::protobuf::Value* message = field(doc, "message");
  if (message == nullptr) return std::nullopt;
  std::string text;
  if (message->has_string_value()) {
    text = message->string_value();  // the plain form
  } else if (message->has_struct_value()) {
    const google::protobuf::Value* inner = field(message->struct_value(), "message");
    if (inner == nullptr || !inner->has_string_value()) return std::nullopt;
    text = inner->string_value();
    const google::protobuf::Value* extra = field(message->struct_value(), "extraInfo");
    if (callstack != nullptr && extra != nullptr && extra->has_struct_value()) {
      const google::protobuf::Value* stack = field(extra->struct_value(), "py_callstack");
      if (stack != nullptr && stack->has_string_value()) *callstack = stack->string_value();
    }
  } else {
    return std::nullopt;
  }
  std::string line = FirstLine(text);
  if (line.empty()) return std::nullopt;
  return line;
}

std::string NameInterpreter(const std::string& exception, const std::string& program) {
  if (!absl::StartsWith(exception, "ModuleNotFoundError") &&
      !absl::StartsWith(exception, "ImportError")) {
    return exception;
  }
  const size_t slash = program.rfind('/');
  const std::string base = slash == std::string::npos ? program : program.substr(slash + 1);
  if (!absl::StartsWith(base, "python")) return exception;
  return absl::StrCat(exception, " (interpreter: ", program, ")");
}

std::string ExceptionLine(const std::deque<std::string>& lines) {
  // "ValueError: ...", "torch.distributed.DistBackendError: ...",
  // "KeyboardInterrupt", "SystemExit: 3": a dotted name ending in one of
  // Python's exception suffixes, at the start of the line.
  static const std::regex kException(
      R"(^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b.*)");
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (std::regex_match(*it, kException)) return it->size() > 300 ? it->substr(0, 300) : *it;
  }
  return "";
}

void RankTable::ReportStatus(const LocalAttempt& a, const LocalRank& r) {
  v1::WorkerMessage m;
  v1::RankStatus* s = AboutRank(m.mutable_rank_status(), a.job_id, a.number, r.assignment.rank());
  s->set_state(r.state.proto());
  s->set_pid(r.pid);
  if (r.state.ended()) {
    v1::ExitInfo* e = s->mutable_exit();
    e->set_exit_code(-1);
    for (const std::string& l : r.last_lines) e->add_last_log_lines(l);
  }
  out_.Send(m, /*critical=*/true);
}

void RankTable::ReportLaunchFailure(const LocalAttempt& a, LocalRank& r, const std::string& why,
                                    v1::FailureKind kind) {
  if (!r.state.Apply(RankEvent::kLaunchFailed)) return;
  v1::WorkerMessage m;
  v1::RankStatus* st = AboutRank(m.mutable_rank_status(), a.job_id, a.number, r.assignment.rank());
  st->set_state(v1::RANK_STATE_FAILED);
  st->mutable_exit()->set_kind(kind);
  st->mutable_exit()->set_exit_code(-1);
  st->mutable_exit()->set_message(why);
  out_.Send(m, true);
}

void RankTable::MarkPreempted(const LocalAttempt& a, int32_t rank) {
  // The rank then stops at once, without its checkpoint: said, not fatal.
  if (absl::Status s = workspace_.MakePreemptFile(a.job_id, a.number, rank); !s.ok()) {
    LogEvent(LogLevel::kWarn, "worker", "preempt_file_failed",
             {{"job_id", a.job_id},
              {"rank", absl::StrCat(rank)},
              {"path", workspace_.PreemptFile(a.job_id, a.number, rank)},
              {"error", std::string(s.message())}});
  }
}

void RankTable::OnStopRanks(const v1::StopRanks& s) {
  const std::string akey = AttemptKey(s.job_id(), s.attempt());
  auto it = attempts_.find(akey);
  absl::Duration grace = absl::Milliseconds(std::max(0, s.grace_period_ms()));
  if (it == attempts_.end()) {
    // Not ours (any more): a rank still running under that key is stopped.
    for (int32_t rank : s.ranks()) launcher_.Stop(absl::StrCat(akey, "/", rank), grace);
    return;
  }
  LocalAttempt& a = *it->second;
  for (auto& [rank, r] : a.ranks) {
    bool listed = s.ranks_size() == 0 ||
                  std::find(s.ranks().begin(), s.ranks().end(), rank) != s.ranks().end();
    if (!listed || r.state.ended()) continue;
    const bool live = r.state.live();
    r.state.Apply(RankEvent::kStop);
    if (live && s.checkpoint_first()) MarkPreempted(a, rank);
    if (live && s.stack_dump_ms() > 0 && r.stack_hook) {
      // A hung script: its ranks' Python stacks to their logs first.
      launcher_.DumpStacksThenStop(r.key, absl::Milliseconds(std::min(s.stack_dump_ms(), 10000)),
                                   grace);
    } else if (live) {
      launcher_.Stop(r.key, grace);  // Its exit reports it STOPPED.
    } else {
      ReportStatus(a, r);  // Never started: STOPPED now.
    }
  }
  MaybeForget(akey);
}

void RankTable::OnExit(const std::string& key, int code, int signal) {
  loop_.CheckInLoop("RankTable::OnExit");
  LocalAttempt* a = nullptr;
  LocalRank* r = FindRank(key, &a);
  if (r == nullptr || r->state.ended()) return;
  r->state.Apply(code == 0 ? RankEvent::kExitZero : RankEvent::kExitNonZero);
  FlushMetrics();
  FlushLogs();
  v1::WorkerMessage m;
  v1::RankStatus* s =
      AboutRank(m.mutable_rank_status(), a->job_id, a->number, r->assignment.rank());
  s->set_pid(r->pid);
  s->set_state(r->state.proto());
  v1::ExitInfo* e = s->mutable_exit();
  e->set_exit_code(code);
  e->set_signal(signal);
  for (const std::string& l : r->last_lines) e->add_last_log_lines(l);
  if (r->state.phase() == RankPhase::kStopped) {
    e->set_message("stopped on request");
  } else if (r->state.phase() == RankPhase::kFailed) {
    DescribeFailure(*a, *r, code, signal, *e);
  }
  // Accounting (trainctl usage): what its cgroup counted, read before the
  // cgroup goes.
  if (r->cgroup.has_value()) {
    s->set_cpu_seconds(r->cgroup->CpuSeconds());
    s->set_peak_memory_bytes(r->cgroup->PeakMemoryBytes());
  }
  // Read what it had to say; anything of it still there goes now.
  RemoveRankCgroup(*a, *r);
  LogEvent(s->state() == v1::RANK_STATE_FAILED ? LogLevel::kWarn : LogLevel::kInfo, "worker",
           "rank_exited",
           {{"job_id", a->job_id},
            {"attempt", absl::StrCat(a->number)},
            {"rank", absl::StrCat(r->assignment.rank())},
            {"pid", absl::StrCat(r->pid)},
            {"state", v1::RankState_Name(s->state())},
            {"exit_code", absl::StrCat(code)},
            {"signal", absl::StrCat(signal)},
            {"reason", e->message().substr(0, 300)}});
  out_.Send(m, true);
  MaybeForget(key.substr(0, key.rfind('/')));
}

void RankTable::DescribeFailure(const LocalAttempt& a, const LocalRank& r, int code, int signal,
                                v1::ExitInfo& e) const {
  e.set_message(r.error_message);
  if (r.error_kind.has_value()) {
    e.set_kind(FailureKindOf(*r.error_kind));
    if (*r.error_kind == rankproto::ErrorKind::kNan) e.set_step(r.error_step);
  } else if (std::optional<std::string> over = OverMemoryLimit(r, code, signal)) {
    // Its own cgroup's OOM killer: the job's resources.memory.
    e.set_kind(v1::FAILURE_KIND_OUT_OF_MEMORY);
    e.set_message(*over);
    e.set_peak_memory_bytes(r.cgroup->PeakMemoryBytes());
  } else if (std::optional<std::string> over = OverProcessLimit(r, code, signal)) {
    // Its own cgroup's pids limit refused a fork: resources.pids.
    e.set_kind(v1::FAILURE_KIND_PROCESS_LIMIT);
    e.set_message(*over);
  } else if (std::optional<std::string> oom = OomKilled(r, signal)) {
    // A SIGKILL this daemon did not send, while the cgroup's OOM-kill
    // count rose: the kernel's OOM killer.
    e.set_kind(v1::FAILURE_KIND_OUT_OF_MEMORY);
    e.set_message(*oom);
    if (r.last_train.has_value()) e.set_peak_memory_bytes(r.last_train->peak_memory_bytes());
  } else if (signal != 0) {
    e.set_kind(v1::FAILURE_KIND_SIGNAL);
    if (e.message().empty()) {
      e.set_message(signal == SIGKILL
                        ? "killed (SIGKILL: out of memory, or killed from outside)"
                        : absl::StrCat("killed by signal ", signal, " (", strsignal(signal), ")"));
    }
  } else {
    e.set_kind(code == 127 ? v1::FAILURE_KIND_LAUNCH : v1::FAILURE_KIND_EXIT);
    if (e.message().empty()) e.set_message(absl::StrCat("exited with code ", code));
  }
  if (a.command && !r.error_kind.has_value() && e.kind() != v1::FAILURE_KIND_OUT_OF_MEMORY &&
      e.kind() != v1::FAILURE_KIND_PROCESS_LIMIT) {
    // What the script's @record wrote (torchrun's error file) says it
    // best; else the last line of its output that reads like an exception.
    std::string callstack;
    std::optional<std::string> recorded =
        TorchelasticErrorMessage(ReadErrorFile(r.error_file, a.run_as), &callstack);
    if (recorded.has_value() && !callstack.empty()) {
      LogEvent(LogLevel::kInfo, "worker", "rank_error_file",
               {{"job_id", a.job_id},
                {"attempt", absl::StrCat(a.number)},
                {"rank", absl::StrCat(r.assignment.rank())},
                {"message", *recorded},
                {"py_callstack", callstack.substr(0, 8192)}});
    }
    const std::string exception =
        NameInterpreter(recorded.has_value() ? *recorded : ExceptionLine(r.last_lines), r.program);
    e.set_message(CommandExitMessage(r.assignment.rank(), code, signal, exception));
    if (signal == 0 && code != 127) e.set_kind(v1::FAILURE_KIND_USER_CODE);
    // Errors a restart meets again fail the job at once (CONFIG is not
    // restarted), as torchrun users expect of a typo.
    if (ExceptionCannotHeal(code, signal, exception)) e.set_kind(v1::FAILURE_KIND_CONFIG);
  }
}

std::optional<std::string> RankTable::OverMemoryLimit(const LocalRank& r, int code,
                                                      int signal) const {
  if (!r.cgroup.has_value() || r.cgroup->memory_limit() <= 0 || r.state.stop_requested())
    return std::nullopt;
  if (code == 0 && signal == 0) return std::nullopt;
  // In a cgroup of its own any OOM kill is this rank's (its main process,
  // or a DataLoader worker it then died of). Where the kernel does not
  // count kills, a SIGKILL after the limit was hit.
  const std::optional<int64_t> kills = r.cgroup->OomKills();
  const bool oom = kills.has_value() ? *kills > 0 : signal == SIGKILL && r.cgroup->MemoryLimitHit();
  if (!oom) return std::nullopt;
  const int64_t peak = r.cgroup->PeakMemoryBytes();
  std::vector<std::string> details;
  if (kills.has_value())
    details.push_back(absl::StrCat(*kills, " kill", *kills == 1 ? "" : "s", " in its cgroup"));
  if (peak > 0) details.push_back(absl::StrCat("peak ", FormatBytes(peak)));
  return absl::StrCat("rank ", r.assignment.rank(), " exceeded its memory limit of ",
                      FormatBytes(r.cgroup->memory_limit()),
                      " (resources.memory) and was killed by the OOM killer",
                      details.empty() ? "" : absl::StrCat(" (", absl::StrJoin(details, ", "), ")"),
                      "; raise resources.memory or use less memory");
}

std::optional<std::string> RankTable::OverProcessLimit(const LocalRank& r, int code,
                                                       int signal) const {
  if (!r.cgroup.has_value() || r.cgroup->pids_limit() <= 0 || r.state.stop_requested())
    return std::nullopt;
  if (code == 0 && signal == 0) return std::nullopt;
  // A refused fork fails the program (EAGAIN), and it exits for it: in a
  // cgroup of its own, any refusal is this rank's.
  const std::optional<int64_t> refused = r.cgroup->PidsLimitHits();
  if (!refused.has_value() || *refused <= 0) return std::nullopt;
  return absl::StrCat(
      "rank ", r.assignment.rank(), " hit its process limit of ", r.cgroup->pids_limit(),
      " (resources.pids): ", *refused, " fork", *refused == 1 ? " was" : "s were",
      " refused in its cgroup, and it ",
      signal != 0 ? absl::StrCat("was killed by signal ", signal)
                  : absl::StrCat("exited with code ", code),
      "; raise resources.pids or start fewer processes and threads (DataLoader num_workers, "
      "OMP_NUM_THREADS)");
}

void RankTable::RemoveRankCgroup(const LocalAttempt& a, LocalRank& r) {
  if (!r.cgroup.has_value()) return;
  if (absl::Status s = r.cgroup->Remove(); !s.ok()) {
    LogEvent(LogLevel::kWarn, "worker", "cgroup_remove_failed",
             {{"job_id", a.job_id},
              {"rank", absl::StrCat(r.assignment.rank())},
              {"error", std::string(s.message())}});
  }
  r.cgroup.reset();
}

std::optional<std::string> RankTable::OomKilled(const LocalRank& r, int signal) const {
  if (signal != SIGKILL || r.state.stop_requested() || !r.oom_kills_at_launch.has_value())
    return std::nullopt;
  std::optional<int64_t> now = ReadOomKillCount();
  if (!now.has_value() || *now <= *r.oom_kills_at_launch) return std::nullopt;
  std::string at;
  if (r.last_train.has_value() && r.last_train->peak_memory_bytes() > 0) {
    at = absl::StrFormat(" at %.1f GiB",
                         static_cast<double>(r.last_train->peak_memory_bytes()) / (1 << 30));
  }
  return absl::StrCat("rank ", r.assignment.rank(), " was killed by the OOM killer", at,
                      " (its memory cgroup's oom_kill count rose from ", *r.oom_kills_at_launch,
                      " to ", *now, "); lower data.batch_size");
}

std::vector<v1::RunningRank> RankTable::RunningRanks() {
  loop_.CheckInLoop("RankTable::RunningRanks");
  std::vector<v1::RunningRank> out;
  for (auto& [k, a] : attempts_) {
    for (auto& [rank, r] : a->ranks) {
      if (!r.state.live()) continue;
      AboutRank(&out.emplace_back(), a->job_id, a->number, rank)->set_pid(r.pid);
    }
  }
  return out;
}

RankTable::LocalRank* RankTable::FindRank(const std::string& key, LocalAttempt** attempt) {
  size_t slash = key.rfind('/');
  auto it = attempts_.find(key.substr(0, slash));
  if (it == attempts_.end()) return nullptr;
  int rank = std::stoi(key.substr(slash + 1));
  auto r = it->second->ranks.find(rank);
  if (r == it->second->ranks.end()) return nullptr;
  *attempt = it->second.get();
  return &r->second;
}

void RankTable::MaybeForget(const std::string& akey) {
  auto it = attempts_.find(akey);
  if (it == attempts_.end()) return;
  for (auto& [rank, r] : it->second->ranks) {
    if (!r.state.ended()) return;
  }
  FlushMetrics();
  FlushLogs();
  for (auto& [rank, r] : it->second->ranks) RemoveRankCgroup(*it->second, r);
  attempts_.erase(it);
}

}  // namespace trainctl::worker
