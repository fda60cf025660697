// torchrun's command line for run/submit: where FILE ends and the program's
// own arguments begin, and the command job built from it.
#include "client/cli/script_job.h"

#include "client/cli/cli.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

namespace trainctl::cli {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Split(std::vector<const char*> argv) {
  return SeparateScriptArgs(static_cast<int>(argv.size()), argv.data(), ScriptVerbOptionTakesValue);
}

TEST(ScriptJobTest, ProgramArgumentsAreSeparatedFromTrainctls) {
  EXPECT_THAT(Split({"trainctl", "run", "--nproc-per-node", "2", "train.py", "--epochs", "3"}),
              ElementsAre("trainctl", "run", "--nproc-per-node", "2", "train.py", "--", "--epochs", "3"));
  EXPECT_THAT(Split({"trainctl", "-o", "json", "submit", "--nproc_per_node=2", "--python", "py", "t.py", "--set", "x"}),
              ElementsAre("trainctl", "-o", "json", "submit", "--nproc_per_node=2", "--python", "py", "t.py", "--",
                          "--set", "x"));
  // A job.yaml keeps trainctl's own options after it; other verbs are untouched.
  EXPECT_THAT(Split({"trainctl", "run", "job.yaml", "--set", "a=1"}),
              ElementsAre("trainctl", "run", "job.yaml", "--set", "a=1"));
  EXPECT_THAT(Split({"trainctl", "logs", "job", "-f"}), ElementsAre("trainctl", "logs", "job", "-f"));
  // The global --token and --ca take a value too.
  EXPECT_THAT(Split({"trainctl", "--token", "t.py", "--ca", "ca.crt", "run", "t.py", "-x"}),
              ElementsAre("trainctl", "--token", "t.py", "--ca", "ca.crt", "run", "t.py", "--", "-x"));
  EXPECT_THAT(Split({"trainctl", "run", "t.py", "--", "-x"}), ElementsAre("trainctl", "run", "t.py", "--", "-x"));
  EXPECT_THAT(Split({"trainctl", "run", "t.py"}), ElementsAre("trainctl", "run", "t.py"));
}

TEST(ScriptJobTest, BuildsAValidCommandJob) {
  ScriptJobFlags f;
  f.nproc_per_node = 2;
  f.nnodes = 3;
  f.python = "/usr/bin/python3";
  f.script_args = {"--epochs", "3", "--name", "a b"};
  EXPECT_TRUE(IsScriptForm("train_DDP v2.py", f));
  ParsedJobSpec p = ScriptJobSpec("train_DDP v2.py", f, {"priority=5"});
  ASSERT_TRUE(p.ok()) << p.errors[0].ToString();
  EXPECT_EQ(p.spec.name(), "train-ddp-v2");
  EXPECT_EQ(p.spec.world_size(), 6);
  EXPECT_EQ(p.spec.priority(), 5);
  const v1::CommandSpec& c = p.spec.command();
  EXPECT_THAT(std::vector<std::string>(c.argv().begin(), c.argv().end()),
              ElementsAre("/usr/bin/python3", "train_DDP v2.py", "--epochs", "3", "--name", "a b"));
  EXPECT_EQ(c.working_dir(), std::filesystem::current_path().string());
  EXPECT_EQ(c.local_rank(), v1::LOCAL_RANK_MODE_ENV);

  ScriptJobFlags plain;
  EXPECT_FALSE(IsScriptForm("job.yaml", plain));
  EXPECT_TRUE(IsScriptForm("./run.sh", plain));
  ParsedJobSpec sh = ScriptJobSpec("./run.sh", plain, {});
  ASSERT_TRUE(sh.ok());
  EXPECT_EQ(sh.spec.world_size(), 1);
  EXPECT_EQ(sh.spec.command().argv(0), "./run.sh") << "not a .py: run directly";
  EXPECT_EQ(sh.spec.name(), "run");
}

TEST(ScriptJobTest, TorchrunsRestartAndRendezvousFlags) {
  ScriptJobFlags f;
  f.max_restarts = 0;
  ParsedJobSpec p = ScriptJobSpec("t.py", f, {});
  ASSERT_TRUE(p.ok()) << p.errors[0].ToString();
  ASSERT_TRUE(p.spec.restart().has_max_restarts());
  EXPECT_EQ(p.spec.restart().max_restarts(), 0) << "--max-restarts 0, not the default 3";
  p = ScriptJobSpec("t.py", f, {"restart.max_restarts=2"});
  EXPECT_EQ(p.spec.restart().max_restarts(), 2) << "--set comes last";
  f.rendezvous_flag = "--master-addr";
  p = ScriptJobSpec("t.py", f, {});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.errors[0].field, "--master-addr");
  EXPECT_THAT(p.errors[0].message, ::testing::HasSubstr("trainctl does the rendezvous"));
}

}  // namespace
}  // namespace trainctl::cli

namespace trainctl::cli {
namespace {

// The options that take a value come from the CLI11 declarations.
TEST(ScriptJobTest, OptionsTakingValuesComeFromTheDeclarations) {
  for (const char* a : {"--python", "--nproc-per-node", "--nproc_per_node", "--nnodes", "--set", "-o", "--output",
                        "--token", "--ca", "--coordinator", "--timeout", "--max-restarts", "--max_restarts",
                        "--master-addr", "--rdzv_endpoint", "--node-rank"}) {
    EXPECT_TRUE(ScriptVerbOptionTakesValue(a)) << a;
  }
  for (const char* a : {"--follow", "--epochs", "-f", "train.py", "--standalone", "--latest"}) EXPECT_FALSE(ScriptVerbOptionTakesValue(a)) << a;
}

}  // namespace
}  // namespace trainctl::cli
