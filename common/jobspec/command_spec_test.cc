// The command: block (the user's own program, docs/command-jobs.md): read,
// resolved, printed back and bounded like the engine's fields.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/jobspec/job_spec.h"
#include "common/jobspec/spec_test_util.h"
#include "google/protobuf/util/message_differencer.h"

namespace trainctl {
namespace {

using namespace testing_spec;  // NOLINT: kBase, Errors, Source, matchers

constexpr char kCommand[] =
    "name: script\n"
    "world_size: 2\n"
    "command:\n"
    "  argv: [python3, train.py, --epochs, 3]\n"
    "  working_dir: /srv/code\n"
    "  env: {OMP_NUM_THREADS: 4, WANDB_MODE: offline}\n"
    "  local_rank: arg\n"
    "  arg_style: dash\n";

TEST(JobSpecCommandTest, CommandBlockIsReadAndResolved) {
  ParsedJobSpec r = ParseJobSpecYaml(kCommand, "job.yaml");
  ASSERT_TRUE(r.ok()) << r.errors[0].ToString();
  const v1::CommandSpec& c = r.spec.command();
  EXPECT_THAT(std::vector<std::string>(c.argv().begin(), c.argv().end()),
              ElementsAre("python3", "train.py", "--epochs", "3"));
  EXPECT_EQ(c.working_dir(), "/srv/code");
  EXPECT_EQ(c.env().at("OMP_NUM_THREADS"), "4");
  EXPECT_EQ(c.env().at("WANDB_MODE"), "offline");
  EXPECT_EQ(c.local_rank(), v1::LOCAL_RANK_MODE_ARG);
  EXPECT_EQ(c.arg_style(), v1::LOCAL_RANK_ARG_STYLE_DASH);
  // No engine defaults are invented for a command job.
  EXPECT_FALSE(r.spec.has_model());
  EXPECT_FALSE(r.spec.has_data());
  EXPECT_FALSE(r.spec.has_training());
  EXPECT_EQ(r.spec.restart().max_restarts(), 3);

  ParsedJobSpec plain = ParseJobSpecYaml("name: s\ncommand: {argv: [./run.sh]}\n", "job.yaml");
  ASSERT_TRUE(plain.ok()) << plain.errors[0].ToString();
  EXPECT_EQ(plain.spec.command().local_rank(), v1::LOCAL_RANK_MODE_ENV);
  EXPECT_EQ(plain.spec.command().arg_style(), v1::LOCAL_RANK_ARG_STYLE_UNDERSCORE);
}

TEST(JobSpecCommandTest, RoundTripsThroughYaml) {
  ParsedJobSpec r = ParseJobSpecYaml(kCommand, "job.yaml");
  ASSERT_TRUE(r.ok());
  std::string yaml = JobSpecToYaml(r.spec);
  ParsedJobSpec again = ParseJobSpecYaml(yaml, "round-trip.yaml");
  ASSERT_TRUE(again.ok()) << again.errors[0].ToString() << "\n" << yaml;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(r.spec, again.spec)) << yaml;
  EXPECT_THAT(yaml, HasSubstr("local_rank: arg"));
}

TEST(JobSpecCommandTest, BadCommandsGetExactMessages) {
  EXPECT_THAT(
      Errors(std::string(kBase) + "command: {argv: [python3, t.py]}\n"),
      ElementsAre("job.yaml:2:8: model: not allowed with command: a job runs either trainctl's "
                  "engine (model, data, training) or its own command, not both",
                  "job.yaml:4:3: data: not allowed with command: a job runs either trainctl's "
                  "engine (model, data, training) or its own command, not both"));
  EXPECT_THAT(Errors("name: s\ncommand: {working_dir: /x}\n"),
              ElementsAre("job.yaml:2:10: command.argv: required: the program and its arguments, "
                          "e.g. [python3, train.py]"));
  EXPECT_THAT(
      Errors("name: s\ncommand:\n  argv: [\"\"]\n"),
      ElementsAre("job.yaml:3:10: command.argv[0]: must name the program, got an empty string"));
  EXPECT_THAT(
      Errors("name: s\ncommand:\n  argv: [x]\n  env:\n    RANK: 3\n"),
      ElementsAre("job.yaml:5:5: command.env.RANK: set by the worker for every rank (torchrun's "
                  "contract); it cannot be overridden"));
  EXPECT_THAT(Errors("name: s\ncommand:\n  argv: [x]\n  env: {A-B: 1}\n"),
              ElementsAre("job.yaml:4:9: command.env.A-B: not an environment variable name "
                          "([A-Za-z_][A-Za-z0-9_]*)"));
  EXPECT_THAT(
      Errors("name: s\ncommand:\n  argv: [x]\n  env: [A]\n"),
      ElementsAre("job.yaml:4:8: command.env: must be a mapping of NAME: value, got a list"));
  EXPECT_THAT(
      Errors("name: s\ncommand:\n  argv: [x]\n  local_rank: args\n"),
      ElementsAre("job.yaml:4:15: command.local_rank: must be one of env, arg, both, got 'args'; "
                  "did you mean 'arg'?"));
  EXPECT_THAT(
      Errors("name: s\ncommand:\n  argv: [x]\n  arg_style: kebab\n"),
      ElementsAre(HasSubstr("command.arg_style: must be one of underscore, dash, got 'kebab'")));
}

TEST(JobSpecCommandTest, GrpcCommandsAreBounded) {
  v1::JobSpec s;
  s.set_name("cmd");
  s.mutable_command()->add_argv("python3");
  ASSERT_TRUE(ValidateJobSpec(s).empty());
  auto errors = [](const v1::JobSpec& spec) {
    std::vector<std::string> got;
    for (const SpecError& e : ValidateJobSpec(spec)) got.push_back(e.ToString());
    return got;
  };
  v1::JobSpec t = s;
  for (int i = 0; i < 64; ++i) t.mutable_command()->add_argv("a");
  EXPECT_THAT(errors(t), ElementsAre("command.argv: at most 64 items, got 65"));
  t = s;
  t.mutable_command()->add_argv(std::string("a\0b", 3));
  EXPECT_THAT(errors(t), ElementsAre("command.argv[1]: contains a NUL byte"));
  t = s;
  (*t.mutable_command()->mutable_env())["X"] = std::string(5000, 'v');
  EXPECT_THAT(errors(t), ElementsAre("command.env.X: at most 4096 bytes, got 5000"));
  t = s;
  for (int i = 0; i < 65; ++i) (*t.mutable_command()->mutable_env())[absl::StrCat("V", i)] = "1";
  EXPECT_THAT(errors(t), ElementsAre("command.env: at most 64 entries, got 65"));
  t = s;
  t.mutable_command()->set_local_rank(static_cast<v1::LocalRankMode>(9));
  EXPECT_THAT(errors(t), ElementsAre(::testing::StartsWith("command.local_rank: unknown value 9")));
  t = s;
  t.mutable_command()->clear_argv();
  EXPECT_THAT(errors(t), ElementsAre(::testing::StartsWith("command.argv: required")));
  t = s;
  t.mutable_training()->set_epochs(2);
  EXPECT_THAT(errors(t), ElementsAre(::testing::StartsWith("training: not allowed with command")));
  t = s;
  t.mutable_resume_from()->set_job("old-1");
  EXPECT_THAT(errors(t), ::testing::IsEmpty())
      << "trainctl.load_checkpoint() hands the program the checkpoint";
  EXPECT_TRUE(IsCommandContractVariable("TRAINCTL_STATUS_FD"));
  EXPECT_TRUE(IsCommandContractVariable("TORCHELASTIC_ERROR_FILE"))
      << "the worker sets it per rank";
  EXPECT_FALSE(IsCommandContractVariable("OMP_NUM_THREADS"));
}

}  // namespace
}  // namespace trainctl
