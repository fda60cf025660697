// What every verb of the trainctl CLI shares: the streams, the global flags,
// the coordinator connection and the error-to-exit-code rules. Internal to
// the CLI library (verbs.cc, cli.cc).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cli/cli.h"
#include "google/protobuf/message.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "trainctl/client.h"

namespace trainctl::cli {

struct CliContext {
  CliContext(std::ostream& out, std::ostream& err, const CliEnvironment& env)
      : out(out), err(err), env(env) {}

  std::ostream& out;
  std::ostream& err;
  const CliEnvironment& env;

  // Global flags.
  std::string coordinator_flag;
  // --token, or after parsing the contents of --token-file (one of them).
  std::string token_flag;
  std::string token_file_flag;
  std::string ca_flag;
  // "table", "json", or "csv" (metrics and usage only).
  std::string output = "table";
  double timeout_s = 10;
  // A job reference that matches several jobs means the newest of them.
  bool latest = false;
  // The verb being run ("submit"), for error messages.
  std::string verb;
  // --run RUN: verbs ask a local run (ConnectToRun) instead of a
  // coordinator; run_job is that run's job (the default JOB), run_server the
  // embedded coordinator serving a finished run (alive as long as the
  // context; null for a live run, which serves itself).
  std::string run_flag;
  std::string run_job;
  std::shared_ptr<void> run_server;
  // --run reached a live run, whose token only reads (Fail says so).
  bool run_live = false;

  bool json() const { return output == "json"; }

  // Resolves the address and connects, bounded by `timeout` (default: the
  // --timeout flag).
  absl::StatusOr<std::unique_ptr<Client>> Connect(
      std::optional<absl::Duration> timeout = std::nullopt);

  // Prints "trainctl VERB: message" to err; returns the exit code for the
  // status (kExitUsage for InvalidArgument, else kExitFailed).
  int Fail(const absl::Status& status);
  // Prints one JSON document on its own line.
  void PrintJson(const google::protobuf::Message& msg);
};

// The job `ref` names, the same rule for every verb that takes a JOB: its
// id; else the jobs with that name; else the jobs whose id starts with it.
// Several matches: the newest with ctx.latest, else InvalidArgument listing
// them newest first. NotFound when nothing matches.
absl::StatusOr<v1::Job> ResolveJob(const CliContext& ctx, Client& client, const std::string& ref);
// The help text of every JOB argument.
inline constexpr char kJobRefHelp[] =
    "Job id, a job name, or the start of an id (several matches: an error listing them, or "
    "--latest)";
// ... of a JOB that --run may stand for.
inline constexpr char kJobRefOrRunHelp[] =
    "Job id, a job name, or the start of an id (several matches: an error listing them, or "
    "--latest); "
    "with --run, default: that run's job";

// --run: a client of a live local run's own coordinator (its live.txt,
// run.cc), else of an embedded coordinator (no worker) on the run's state,
// kept in ctx.run_server.
absl::StatusOr<std::unique_ptr<Client>> ConnectToRun(CliContext& ctx);

// A verb's subcommand with its one-line description and, in --help, its
// examples under `heading`.
CLI::App* AddVerb(CLI::App& app, const std::string& name, const std::string& description,
                  const std::string& examples, const std::string& heading = "Example:");

// --output json for a listing: `items` in their List RPC's response message
// (`field`: e.g. &v1::ListWorkersResponse::mutable_workers). Returns kExitOk.
template <typename Response, typename Item>
int PrintJsonList(CliContext& ctx, const std::vector<Item>& items,
                  google::protobuf::RepeatedPtrField<Item>* (Response::*field)()) {
  Response resp;
  for (const Item& item : items) *(resp.*field)()->Add() = item;
  ctx.PrintJson(resp);
  return kExitOk;
}

// The shape of a verb that asks the coordinator: connect (ctx.Connect),
// one call on the client, then print its answer. A failed connect or call
// is ctx.Fail's (its message and exit code); else the exit code is
// print's. `call`: Client& -> absl::StatusOr<T> or absl::Status; `print`:
// (Client&, T&) -> int or (T&) -> int, for a Status (Client&) -> int or
// () -> int.
template <typename Call, typename Print>
int ConnectCallPrint(CliContext& ctx, Call&& call, Print&& print) {
  absl::StatusOr<std::unique_ptr<Client>> client = ctx.Connect();
  if (!client.ok()) return ctx.Fail(client.status());
  auto result = call(**client);
  if constexpr (std::is_same_v<decltype(result), absl::Status>) {
    if (!result.ok()) return ctx.Fail(result);
    if constexpr (std::is_invocable_v<Print, Client&>) {
      return print(**client);
    } else {
      return print();
    }
  } else {
    if (!result.ok()) return ctx.Fail(result.status());
    if constexpr (std::is_invocable_v<Print, Client&, decltype(*result)>) {
      return print(**client, *result);
    } else {
      return print(*result);
    }
  }
}

// A verb's body, bound to its parsed flags; returns the exit code.
using VerbRunner = std::function<int()>;
// Declares a verb (its subcommand, flags, help and example) on `app` and
// returns the runner that executes it once the command line is parsed.
using VerbFactory = VerbRunner (*)(CLI::App& app, CliContext& ctx);

VerbRunner AddSubmitVerb(CLI::App& app, CliContext& ctx);
VerbRunner AddStatusVerb(CLI::App& app, CliContext& ctx);
VerbRunner AddDescribeVerb(CLI::App& app, CliContext& ctx);
VerbRunner AddListVerb(CLI::App& app, CliContext& ctx);
VerbRunner AddLogsVerb(CLI::App& app, CliContext& ctx);
VerbRunner AddCancelVerb(CLI::App& app, CliContext& ctx);
VerbRunner AddWorkersVerb(CLI::App& app, CliContext& ctx);
// Local mode (run.cc): embedded coordinator and workers.
VerbRunner AddRunVerb(CLI::App& app, CliContext& ctx);
VerbRunner AddRunsVerb(CLI::App& app, CliContext& ctx);
VerbRunner AddResumeVerb(CLI::App& app, CliContext& ctx);
VerbRunner AddCheckpointsVerb(CLI::App& app, CliContext& ctx);
VerbRunner AddFetchVerb(CLI::App& app, CliContext& ctx);
// metrics.cc: a job's stored metric points.
VerbRunner AddMetricsVerb(CLI::App& app, CliContext& ctx);
// Tokens and login (auth_verbs.cc).
VerbRunner AddTokenVerb(CLI::App& app, CliContext& ctx);
VerbRunner AddLoginVerb(CLI::App& app, CliContext& ctx);
VerbRunner AddWorkerVerb(CLI::App& app, CliContext& ctx);
VerbRunner AddDashboardVerb(CLI::App& app, CliContext& ctx);
// Queues (queues.cc).
VerbRunner AddQueueVerb(CLI::App& app, CliContext& ctx);
VerbRunner AddUsageVerb(CLI::App& app, CliContext& ctx);

// Follows a job until it ends (follow mode output); 0 only when it SUCCEEDED.
int FollowJob(CliContext& ctx, Client& client, const std::string& job_id);

}  // namespace trainctl::cli
