#include "client/cli/cli.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/context.h"
#include "client/cli/format.h"
#include "client/cli/script_job.h"
#include "common/auth/secret.h"
#include "common/coordinator_failover.h"

namespace trainctl::cli {

namespace {

constexpr char kDefaultCoordinator[] = "localhost:7070";

// Every verb, in the order `trainctl --help` lists them. A new verb is one
// function (see context.h) and one line here.
constexpr VerbFactory kVerbs[] = {
    AddSubmitVerb, AddStatusVerb, AddDescribeVerb,    AddListVerb,      AddLogsVerb,
    AddCancelVerb, AddResumeVerb, AddCheckpointsVerb, AddFetchVerb,     AddWorkersVerb,
    AddRunVerb,    AddRunsVerb,   AddMetricsVerb,     AddQueueVerb,     AddUsageVerb,
    AddTokenVerb,  AddLoginVerb,  AddWorkerVerb,      AddDashboardVerb,
};

constexpr char kMainFooter[] =
    "Coordinator: --coordinator, else $TRAINCTL_COORDINATOR (or $TRAINCTL_ADDRESS), else\n"
    "`coordinator: host:port` in ~/.config/trainctl/config.yaml, else localhost:7070. Each takes\n"
    "a list, a:7070,b:7070: a standby's answer leads to the active one, an unreachable one to the "
    "next.\n"
    "Token and CA: --token-file (or --token) / --ca, else $TRAINCTL_TOKEN / $TRAINCTL_CA, else\n"
    "`token:` / `ca:` in the config file (trainctl login writes it). A token goes in clear text\n"
    "only to a loopback address; elsewhere give the CA.\n"
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
  if (isatty(STDIN_FILENO) == 1) {
    env.read_answer = []() -> std::optional<std::string> {
      std::string line;
      if (!std::getline(std::cin, line)) return std::nullopt;
      return line;
    };
  }
  return env;
}

std::string ConfigFilePath(const CliEnvironment& env) {
  auto get = [&](const std::string& name) -> std::string {
    if (!env.getenv) return "";
    return env.getenv(name).value_or("");
  };
  std::string config_dir = get("XDG_CONFIG_HOME");
  if (config_dir.empty() && !get("HOME").empty()) config_dir = get("HOME") + "/.config";
  if (config_dir.empty()) return "";
  return config_dir + "/trainctl/config.yaml";
}

namespace {

// One scalar key of the config file ("" when the file or key is absent).
// False with "path:line:col: reason" in *error when the file is malformed.
bool ConfigValue(const CliEnvironment& env, const std::string& key, std::string* value,
                 std::string* path_out, std::string* error) {
  std::string path = ConfigFilePath(env);
  *path_out = path;
  value->clear();
  if (path.empty()) return true;
  std::ifstream in(path);
  if (!in) return true;
  try {
    YAML::Node doc = YAML::Load(in);
    if (!doc.IsNull() && !doc.IsMap()) {
      *error = absl::StrCat(path,
                            ": expected a mapping such as `coordinator: host:port[,host:port...]`");
      return false;
    }
    if (doc.IsMap() && doc[key]) {
      YAML::Node c = doc[key];
      if (!c.IsScalar() || c.as<std::string>().empty()) {
        *error = absl::StrCat(
            path, ":", c.Mark().line + 1, ":", c.Mark().column + 1, ": ", key,
            key == "coordinator" ? ": expected host:port[,host:port...]" : ": expected a string");
        return false;
      }
      *value = c.as<std::string>();
    }
  } catch (const YAML::Exception& e) {
    *error = absl::StrCat(path, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg);
    return false;
  }
  return true;
}

// flag, else $env_name, else the config file's `key`, else "".
bool ResolveSetting(const std::string& flag, const std::vector<std::string>& env_names,
                    const std::string& key, const CliEnvironment& env, std::string* value,
                    std::string* source, std::string* error) {
  if (!flag.empty()) {
    *value = flag;
    *source = "flag";
    return true;
  }
  for (const std::string& name : env_names) {
    std::optional<std::string> v = env.getenv ? env.getenv(name) : std::nullopt;
    if (v.has_value() && !v->empty()) {
      *value = *v;
      *source = name;
      return true;
    }
  }
  std::string path;
  if (!ConfigValue(env, key, value, &path, error)) return false;
  *source = value->empty() ? "default" : path;
  return true;
}

}  // namespace

std::optional<ResolvedAddress> ResolveCoordinator(const std::string& flag,
                                                  const CliEnvironment& env, std::string* error) {
  std::string value, source;
  if (!ResolveSetting(flag, {"TRAINCTL_COORDINATOR", "TRAINCTL_ADDRESS"}, "coordinator", env,
                      &value, &source, error)) {
    return std::nullopt;
  }
  if (source == "flag") return ResolvedAddress{value, "--coordinator"};
  if (value.empty()) return ResolvedAddress{kDefaultCoordinator, "default"};
  return ResolvedAddress{value, source};
}

std::optional<ResolvedCredentials> ResolveCredentials(const std::string& token_flag,
                                                      const std::string& ca_flag,
                                                      const CliEnvironment& env,
                                                      std::string* error) {
  ResolvedCredentials out;
  std::string source;
  if (!ResolveSetting(token_flag, {"TRAINCTL_TOKEN"}, "token", env, &out.token, &source, error)) {
    return std::nullopt;
  }
  if (!ResolveSetting(ca_flag, {"TRAINCTL_CA"}, "ca", env, &out.ca_file, &source, error)) {
    return std::nullopt;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Client>> CliContext::Connect(std::optional<absl::Duration> timeout) {
  if (!run_flag.empty()) return ConnectToRun(*this);
  std::string error;
  std::optional<ResolvedAddress> addr = ResolveCoordinator(coordinator_flag, env, &error);
  if (!addr.has_value()) return absl::InvalidArgumentError(error);
  std::optional<ResolvedCredentials> creds = ResolveCredentials(token_flag, ca_flag, env, &error);
  if (!creds.has_value()) return absl::InvalidArgumentError(error);
  // One parser for every spelling of the list; its error names where the
  // address came from.
  std::string where = "coordinator";  // the default's
  if (addr->source == "--coordinator") {
    where = "--coordinator";
  } else if (absl::StartsWith(addr->source, "TRAINCTL_")) {
    where = absl::StrCat("$", addr->source);
  } else if (addr->source != "default") {
    where = absl::StrCat(addr->source, ": coordinator");  // the config file
  }
  if (absl::StatusOr<std::vector<std::string>> list = ParseCoordinatorList(addr->address, where);
      !list.ok()) {
    return list.status();
  }
  ClientOptions options;
  options.address = addr->address;
  options.token = creds->token;
  options.ca_file = creds->ca_file;
  options.timeout = absl::Seconds(timeout_s);
  if (timeout.has_value()) options.timeout = *timeout;
  // A followed job outlives a coordinator restart: say so once per break.
  options.on_watch_broken = [this,
                             reconnect_for = options.watch_reconnect_for](const absl::Status& why) {
    err << "trainctl " << verb << ": the stream broke (" << why.message()
        << "); reconnecting for up to " << absl::FormatDuration(reconnect_for) << "\n"
        << std::flush;
  };
  return Client::Connect(options);
}

int CliContext::Fail(const absl::Status& status) {
  err << "trainctl " << verb << ": " << status.message();
  if (run_live && status.code() == absl::StatusCode::kPermissionDenied) {
    err << " (--run reaches a run still going with a token that only reads; stop the run with "
           "Ctrl-C where "
           "it runs)";
  }
  err << "\n" << std::flush;
  return status.code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitFailed;
}

void CliContext::PrintJson(const google::protobuf::Message& msg) { out << ToJson(msg) << "\n"; }

CLI::App* AddVerb(CLI::App& app, const std::string& name, const std::string& description,
                  const std::string& examples, const std::string& heading) {
  CLI::App* sub = app.add_subcommand(name, description);
  sub->footer(absl::StrCat(heading, "\n", examples));
  return sub;
}

namespace {

// The whole command line: global flags and every verb; the verbs' runners by name.
std::map<std::string, VerbRunner> BuildApp(CLI::App& app, CliContext& ctx) {
  app.footer(kMainFooter);
  app.set_version_flag("--version", "trainctl 0.1.0");
  app.require_subcommand(1, 1);
  // Global flags are accepted after the verb too: `trainctl status JOB -o json`.
  app.fallthrough();

  app.add_option("--coordinator", ctx.coordinator_flag,
                 "Coordinator HOST:PORT, or a comma-separated list of them (active and standby "
                 "coordinators): calls go to the active one")
      ->type_name("HOST:PORT[,...]");
  app.add_option("--run", ctx.run_flag,
                 "Ask a local run (trainctl run) instead of a coordinator, live or kept: its "
                 "directory, its "
                 "name (or the start or end of one) from `trainctl runs`, or latest")
      ->type_name("RUN");
  app.add_option(
         "--token", ctx.token_flag,
         "Bearer token (default $TRAINCTL_TOKEN, then the config file); other users can read it "
         "from the command line: prefer --token-file")
      ->type_name("TOKEN");
  app.add_option("--token-file", ctx.token_file_flag,
                 "File whose first line is the bearer token (instead of --token: kept off the "
                 "command line)")
      ->type_name("FILE");
  app.add_option("--ca", ctx.ca_flag,
                 "Cluster CA certificate (PEM): use TLS and verify the coordinator")
      ->type_name("FILE");
  app.add_option(
         "-o,--output", ctx.output,
         "Output format: table (for people) or json (for scripts); csv for `metrics` and `usage`")
      ->check(CLI::IsMember({"table", "json", "csv"}))
      ->capture_default_str();
  app.add_flag("--latest", ctx.latest,
               "A JOB that matches several jobs (by name or id prefix) means the newest");
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
  return runners;
}

// "--name" and "-n" of every option of `app` (and of its verbs in `verbs`)
// that takes a value, as CLI11 declares them: the lists that tell a value
// from a verb or a program never drift from the flags themselves.
std::set<std::string> OptionsTakingValues(const CLI::App& app,
                                          const std::vector<std::string>& verbs) {
  std::set<std::string> out;
  auto add = [&out](const CLI::App& a) {
    for (const CLI::Option* o : a.get_options()) {
      if (o->get_items_expected_min() == 0) continue;  // a flag (no value of its own)
      for (const std::string& n : o->get_lnames()) out.insert("--" + n);
      for (const std::string& n : o->get_snames()) out.insert("-" + n);
    }
  };
  add(app);
  for (const std::string& v : verbs) {
    for (const CLI::App* sub :
         app.get_subcommands([&v](const CLI::App* s) { return s->get_name() == v; }))
      add(*sub);
  }
  return out;
}

// --token-file read into ctx.token_flag; --token said to be readable by
// others (it stays accepted: scripts and tests pass it, and the value is
// the user's own to expose; the warning says what it costs and the way
// out). kExitOk, or the exit code of a usage error already printed.
int TakeTokenFlags(CliContext& ctx) {
  if (!ctx.token_file_flag.empty()) {
    if (!ctx.token_flag.empty()) {
      ctx.err << "trainctl " << ctx.verb << ": --token and --token-file: give one of them\n";
      return kExitUsage;
    }
    absl::StatusOr<std::string> token = auth::ReadTokenFile(ctx.token_file_flag);
    if (!token.ok()) {
      ctx.err << "trainctl " << ctx.verb << ": --token-file: " << token.status().message() << "\n";
      return kExitUsage;
    }
    ctx.token_flag = *token;
    return kExitOk;
  }
  if (!ctx.token_flag.empty()) {
    ctx.err
        << "trainctl: warning: --token puts the token on the command line, where every user of "
           "this "
           "host can read it (ps, /proc/PID/cmdline); use --token-file FILE or $TRAINCTL_TOKEN\n";
  }
  return kExitOk;
}

}  // namespace

bool ScriptVerbOptionTakesValue(const std::string& arg) {
  static const std::set<std::string> names = [] {
    std::ostringstream sink;
    CliContext ctx(sink, sink, CliEnvironment::FromProcess());
    CLI::App app("trainctl", "trainctl");
    BuildApp(app, ctx);
    return OptionsTakingValues(app, {"run", "submit"});
  }();
  return names.count(arg) > 0;
}

int RunCli(int argc, const char* const argv[], std::ostream& out, std::ostream& err,
           const CliEnvironment& env) {
  CLI::App app("trainctl: submit, follow and manage distributed training jobs", "trainctl");
  CliContext ctx(out, err, env);
  std::map<std::string, VerbRunner> runners = BuildApp(app, ctx);
  const std::set<std::string> global_values = OptionsTakingValues(app, {});
  const std::set<std::string> script_values = OptionsTakingValues(app, {"run", "submit"});

  // CLI11 reports an unknown verb as "a subcommand is required"; name it.
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (global_values.count(arg) > 0) {
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
  std::vector<std::string> args = SeparateScriptArgs(
      argc, argv, [&script_values](const std::string& a) { return script_values.count(a) > 0; });
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
  if (ctx.output == "csv" && ctx.verb != "metrics" && ctx.verb != "usage") {
    err << "trainctl " << ctx.verb
        << ": --output: csv is only for `trainctl metrics` and `trainctl usage`; use table or "
           "json\n";
    return kExitUsage;
  }
  if (int code = TakeTokenFlags(ctx); code != kExitOk) return code;
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
