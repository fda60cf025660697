#include "client/cli/cli.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/context.h"
#include "client/cli/script_job.h"
#include "client/cli/format.h"

namespace trainctl::cli {

namespace {

constexpr char kDefaultCoordinator[] = "localhost:7070";

// Every verb, in the order `trainctl --help` lists them. A new verb is one
// function (see context.h) and one line here.
constexpr VerbFactory kVerbs[] = {
    AddSubmitVerb, AddStatusVerb, AddDescribeVerb, AddListVerb,  AddLogsVerb,
    AddCancelVerb, AddResumeVerb, AddCheckpointsVerb, AddWorkersVerb, AddRunVerb, AddMetricsVerb,
};

constexpr char kMainFooter[] =
    "Coordinator: --coordinator, else $TRAINCTL_COORDINATOR, else `coordinator: host:port` in\n"
    "~/.config/trainctl/config.yaml, else localhost:7070.\n"
    "Exit codes: 0 ok; 1 RPC error, or a followed job that did not succeed; 2 usage or\n"
    "validation error.\n\n"
    "Examples:\n"
    "  trainctl submit examples/mlp-synthetic.yaml --follow\n"
    "  trainctl --coordinator coord:7070 list --state running -o json\n";

}  // namespace

CliEnvironment CliEnvironment::FromProcess() {
  CliEnvironment env;
  env.getenv = [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
  env.out_is_terminal = isatty(STDOUT_FILENO) == 1;
  return env;
}

std::optional<ResolvedAddress> ResolveCoordinator(const std::string& flag, const CliEnvironment& env,
                                                  std::string* error) {
  if (!flag.empty()) return ResolvedAddress{flag, "--coordinator"};
  auto get = [&](const std::string& name) -> std::string {
    if (!env.getenv) return "";
    return env.getenv(name).value_or("");
  };
  std::string from_env = get("TRAINCTL_COORDINATOR");
  if (!from_env.empty()) return ResolvedAddress{from_env, "TRAINCTL_COORDINATOR"};

  std::string config_dir = get("XDG_CONFIG_HOME");
  if (config_dir.empty() && !get("HOME").empty()) config_dir = get("HOME") + "/.config";
  if (!config_dir.empty()) {
    std::string path = config_dir + "/trainctl/config.yaml";
    std::ifstream in(path);
    if (in) {
      try {
        YAML::Node doc = YAML::Load(in);
        if (doc.IsMap() && doc["coordinator"]) {
          YAML::Node c = doc["coordinator"];
          if (!c.IsScalar() || c.as<std::string>().empty()) {
            *error = absl::StrCat(path, ":", c.Mark().line + 1, ":", c.Mark().column + 1,
                                  ": coordinator: expected host:port");
            return std::nullopt;
          }
          return ResolvedAddress{c.as<std::string>(), path};
        }
        if (!doc.IsNull() && !doc.IsMap()) {
          *error = absl::StrCat(path, ": expected a mapping such as `coordinator: host:port`");
          return std::nullopt;
        }
      } catch (const YAML::Exception& e) {
        *error = absl::StrCat(path, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg);
        return std::nullopt;
      }
    }
  }
  return ResolvedAddress{kDefaultCoordinator, "default"};
}

absl::StatusOr<std::unique_ptr<Client>> CliContext::Connect(std::optional<absl::Duration> timeout) {
  std::string error;
  std::optional<ResolvedAddress> addr = ResolveCoordinator(coordinator_flag, env, &error);
  if (!addr.has_value()) return absl::InvalidArgumentError(error);
  ClientOptions options;
  options.address = addr->address;
  options.timeout = absl::Seconds(timeout_s);
  if (timeout.has_value()) options.timeout = *timeout;
  return Client::Connect(options);
}

int CliContext::Fail(const absl::Status& status) {
  err << "trainctl " << verb << ": " << status.message() << "\n" << std::flush;
  return status.code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitFailed;
}

void CliContext::PrintJson(const google::protobuf::Message& msg) { out << ToJson(msg) << "\n"; }

int RunCli(int argc, const char* const argv[], std::ostream& out, std::ostream& err,
           const CliEnvironment& env) {
  CLI::App app("trainctl: submit, follow and manage distributed training jobs", "trainctl");
  app.footer(kMainFooter);
  app.set_version_flag("--version", "trainctl 0.1.0");
  app.require_subcommand(1, 1);
  // Global flags are accepted after the verb too: `trainctl status JOB -o json`.
  app.fallthrough();

  CliContext ctx(out, err, env);
  app.add_option("--coordinator", ctx.coordinator_flag, "Coordinator HOST:PORT")
      ->type_name("HOST:PORT");
  app.add_option("-o,--output", ctx.output,
                 "Output format: table (for people) or json (for scripts); csv for `metrics`")
      ->check(CLI::IsMember({"table", "json", "csv"}))
      ->capture_default_str();
  app.add_option("--timeout", ctx.timeout_s, "Seconds to wait for the coordinator per call")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  std::map<std::string, VerbRunner> runners;
  for (VerbFactory add : kVerbs) {
    size_t before = app.get_subcommands({}).size();
    VerbRunner runner = add(app, ctx);
    std::vector<CLI::App*> all = app.get_subcommands({});
    if (all.size() > before) runners[all.back()->get_name()] = std::move(runner);
  }

  // CLI11 reports an unknown verb as "a subcommand is required"; name it.
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--coordinator" || arg == "-o" || arg == "--output" || arg == "--timeout") {
      ++i;
      continue;
    }
    if (arg.empty() || arg[0] == '-') continue;
    if (runners.count(arg) == 0) {
      std::vector<std::string> names;
      for (const auto& [name, runner] : runners) names.push_back(name);
      err << "trainctl: unknown verb '" << arg << "'; one of " << absl::StrJoin(names, ", ")
          << " (trainctl --help)\n";
      return kExitUsage;
    }
    break;
  }

  // `run`/`submit` with a program as FILE: its own arguments follow it.
  std::vector<std::string> args = SeparateScriptArgs(argc, argv);
  std::vector<const char*> arg_ptrs;
  for (const std::string& a : args) arg_ptrs.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e, out, err);
    return code == 0 ? kExitOk : kExitUsage;
  }
  std::vector<CLI::App*> chosen = app.get_subcommands();
  if (chosen.empty()) return kExitUsage;  // require_subcommand already said so.
  ctx.verb = chosen.front()->get_name();
  if (ctx.output == "csv" && ctx.verb != "metrics") {
    err << "trainctl " << ctx.verb << ": --output: csv is only for `trainctl metrics`; use table or json\n";
    return kExitUsage;
  }
  auto it = runners.find(ctx.verb);
  if (it == runners.end()) return kExitUsage;
  return it->second();
}

int RunCli(int argc, const char* const argv[], std::ostream& out, std::ostream& err) {
  CliEnvironment env = CliEnvironment::FromProcess();
  if (&out != &std::cout) env.out_is_terminal = false;
  return RunCli(argc, argv, out, err, env);
}

}  // namespace trainctl::cli
