// The trainctl command line, as a library: main() is one call to RunCli, and
// tests call it in-process with string streams.
//
//   trainctl [--coordinator HOST:PORT] [-o table|json] [--timeout S] VERB ...
//
// Verbs: submit, status, describe, list, logs, cancel, workers, run (local mode). Each is one
// function in verbs.cc that declares its flags and returns its runner;
// adding a verb is one such function plus one line in kVerbs (cli.cc).
//
// Exit codes: 0 ok; 1 an RPC failed, or (with --follow) the job ended other
// than SUCCEEDED; 2 bad usage or an invalid job spec.
//
// Thread-safe: concurrent calls share nothing but the streams they are given
// (tests run `submit --follow` on one thread while driving the job on another).
#pragma once

#include <functional>
#include <optional>
#include <ostream>
#include <string>

#include "absl/time/time.h"

namespace trainctl::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

// What the CLI takes from its process, injectable for tests.
struct CliEnvironment {
  // An environment variable's value, or nullopt (default: ::getenv).
  std::function<std::optional<std::string>(const std::string&)> getenv;
  // stdout is a terminal: follow mode redraws a status line in place.
  bool out_is_terminal = false;
  // Reads the user's answer to a question (one line; nullopt at the end of
  // input) when stdin is a terminal; unset when it is not, so that nothing
  // that needs a confirmation (a bulk `cancel`) proceeds without --yes.
  std::function<std::optional<std::string>()> read_answer;
  // Plain follow mode: least time between two progress lines.
  absl::Duration progress_interval = absl::Seconds(5);
  // How long --dry-run waits for a coordinator before skipping the placement.
  absl::Duration dry_run_connect_timeout = absl::Seconds(2);

  // The real process: ::getenv, isatty(STDOUT_FILENO), and std::cin when
  // isatty(STDIN_FILENO).
  static CliEnvironment FromProcess();
};

struct ResolvedAddress {
  std::string address;
  // Where it came from: "--coordinator", "TRAINCTL_COORDINATOR", the config
  // file's path, or "default".
  std::string source;
};
// The coordinator address: `flag` when set, else $TRAINCTL_COORDINATOR, else
// `coordinator:` in $XDG_CONFIG_HOME (or ~/.config)/trainctl/config.yaml,
// else localhost:7070. A malformed config file is an error: nullopt, with
// "path:line:col: reason" in *error.
std::optional<ResolvedAddress> ResolveCoordinator(const std::string& flag,
                                                  const CliEnvironment& env, std::string* error);

// The token and CA file: each from its flag when set, else $TRAINCTL_TOKEN /
// $TRAINCTL_CA, else `token:` / `ca:` in the config file, else "".
struct ResolvedCredentials {
  std::string token;
  std::string ca_file;
};
std::optional<ResolvedCredentials> ResolveCredentials(const std::string& token_flag,
                                                      const std::string& ca_flag,
                                                      const CliEnvironment& env,
                                                      std::string* error);
// $XDG_CONFIG_HOME (or ~/.config)/trainctl/config.yaml; "" without either.
std::string ConfigFilePath(const CliEnvironment& env);

// Runs one trainctl command line; returns its exit code. Everything is
// written to `out` (results) and `err` (errors, validation messages).
int RunCli(int argc, const char* const argv[], std::ostream& out, std::ostream& err,
           const CliEnvironment& env);
// The same with CliEnvironment::FromProcess(); `out` counts as a terminal
// only when it is std::cout and stdout is one.
int RunCli(int argc, const char* const argv[], std::ostream& out, std::ostream& err);

// Whether `arg` ("--set", "-o") is one of trainctl's options that takes a
// separate value, globally or for `run`/`submit` (from the CLI11
// declarations; what SeparateScriptArgs needs outside RunCli, e.g. tests).
bool ScriptVerbOptionTakesValue(const std::string& arg);

}  // namespace trainctl::cli
