// torchrun's command line for run/submit: where FILE ends and the program's
// own arguments begin, and the command job built from it.
#include "client/cli/script_job.h"

#include "client/cli/cli.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

namespace trainctl::cli {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Split(std::vector<const char*> argv) {
  return SeparateScriptArgs(static_cast<int>(argv.size()), argv.data(), ScriptVerbOptionTakesValue);
}

TEST(ScriptJobTest, ProgramArgumentsAreSeparatedFromTrainctls) {
  EXPECT_THAT(
      Split({"trainctl", "run", "--nproc-per-node", "2", "train.py", "--epochs", "3"}),
      ElementsAre("trainctl", "run", "--nproc-per-node", "2", "train.py", "--", "--epochs", "3"));
  EXPECT_THAT(Split({"trainctl", "-o", "json", "submit", "--nproc_per_node=2", "--python", "py",
                     "t.py", "--set", "x"}),
              ElementsAre("trainctl", "-o", "json", "submit", "--nproc_per_node=2", "--python",
                          "py", "t.py", "--", "--set", "x"));
  // A job.yaml keeps trainctl's own options after it; other verbs are untouched.
  EXPECT_THAT(Split({"trainctl", "run", "job.yaml", "--set", "a=1"}),
              ElementsAre("trainctl", "run", "job.yaml", "--set", "a=1"));
  EXPECT_THAT(Split({"trainctl", "logs", "job", "-f"}),
              ElementsAre("trainctl", "logs", "job", "-f"));
  // The global --token and --ca take a value too.
  EXPECT_THAT(
      Split({"trainctl", "--token", "t.py", "--ca", "ca.crt", "run", "t.py", "-x"}),
      ElementsAre("trainctl", "--token", "t.py", "--ca", "ca.crt", "run", "t.py", "--", "-x"));
  EXPECT_THAT(Split({"trainctl", "run", "t.py", "--", "-x"}),
              ElementsAre("trainctl", "run", "t.py", "--", "-x"));
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
  EXPECT_EQ(p.spec.scheduling().nodes(), 3)
      << "torchrun's --nnodes: exactly 3 workers, 2 ranks each";
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
  EXPECT_EQ(sh.spec.scheduling().nodes(), 0) << "no --nnodes: wherever the ranks fit";
  EXPECT_EQ(sh.spec.command().argv(0), "./run.sh") << "not a .py: run directly";
  EXPECT_EQ(sh.spec.name(), "run");
}

TEST(ScriptJobTest, TorchrunsRestartAndRendezvousFlags) {
  ScriptJobFlags f;
  ParsedJobSpec p = ScriptJobSpec("t.py", f, {});
  ASSERT_TRUE(p.ok()) << p.errors[0].ToString();
  ASSERT_TRUE(p.spec.restart().has_max_restarts());
  EXPECT_EQ(p.spec.restart().max_restarts(), 0)
      << "no --max-restarts: torchrun's default 0, not the spec's 3";
  f.max_restarts = 4;
  p = ScriptJobSpec("t.py", f, {});
  EXPECT_EQ(p.spec.restart().max_restarts(), 4);
  f.max_restarts = 0;
  p = ScriptJobSpec("t.py", f, {});
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
  for (const char* a :
       {"--python", "--nproc-per-node", "--nproc_per_node", "--nnodes", "--set", "-o", "--output",
        "--token", "--ca", "--coordinator", "--timeout", "--max-restarts", "--max_restarts",
        "--master-addr", "--rdzv_endpoint", "--node-rank"}) {
    EXPECT_TRUE(ScriptVerbOptionTakesValue(a)) << a;
  }
  for (const char* a : {"--follow", "--epochs", "-f", "train.py", "--standalone", "--latest"})
    EXPECT_FALSE(ScriptVerbOptionTakesValue(a)) << a;
}

// Issue #27 item 4: "RUNNING  step 30  loss 0.5978[rank0]: epoch 0 ..." in
// a terminal. A rank line clears the status line first and the status is
// drawn again below it; no screen line holds both. Without a status line
// (no terminal) nothing adds a control character.
// torchrun's --log-dir / --redirects / --tee values.
TEST(ScriptJobTest, RedirectsAndTeeTakeTorchrunsValues) {
  absl::StatusOr<StdStreams> all = StdStreams::Parse("--redirects", "3");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->Mask(0), 3);
  EXPECT_EQ(all->Mask(7), 3);
  absl::StatusOr<StdStreams> per = StdStreams::Parse("--tee", "0:1,2:2");
  ASSERT_TRUE(per.ok()) << per.status();
  EXPECT_EQ(per->Mask(0), 1);
  EXPECT_EQ(per->Mask(1), 0) << "a rank not named: none";
  EXPECT_EQ(per->Mask(2), 2);
  for (const char* bad : {"4", "x", "0:", "a:1", "0:9", "-1:1"}) {
    absl::StatusOr<StdStreams> b = StdStreams::Parse("--tee", bad);
    EXPECT_TRUE(absl::IsInvalidArgument(b.status())) << bad;
    EXPECT_THAT(std::string(b.status().message()), ::testing::StartsWith("--tee: ")) << bad;
  }
  ScriptJobFlags flags;
  flags.redirects = "1";
  absl::Status needs_dir = RankOutputOf(flags).status();
  EXPECT_EQ(needs_dir.message(), "--redirects: needs --log-dir (where the files go)");
  flags.log_dir = "/tmp/logs";
  absl::StatusOr<RankOutput> out = RankOutputOf(flags);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->redirects.Mask(0), 1);
  EXPECT_FALSE(out->tee.any());
  EXPECT_THAT(
      Split({"trainctl", "run", "--log-dir", "L", "--redirects", "3", "t.py", "--tee", "x"}),
      ElementsAre("trainctl", "run", "--log-dir", "L", "--redirects", "3", "t.py", "--", "--tee",
                  "x"));
}

TEST(TerminalMuxTest, ARankLineNeverSharesTheStatusLinesScreenLine) {
  std::ostringstream screen;
  {
    TerminalMux mux(screen);
    mux.status_out() << "\r\033[KRUNNING  step 30" << std::flush;
    mux.lines_out() << "[rank0]: epoch 0: loss 0.6170\n";
    mux.status_out() << "\r\033[KRUNNING  step 40" << std::flush;
    mux.status_out() << "\r\033[K"
                     << "12:00:01  epoch_end  epoch 1/3 done\n"
                     << "\r\033[KRUNNING  step 50" << std::flush;
    mux.lines_out() << "[rank1]: done\n";
  }
  // What a terminal shows: "\r\033[K" clears the line the cursor is on.
  std::vector<std::string> lines;
  std::string current;
  const std::string out = screen.str();
  for (size_t i = 0; i < out.size(); ++i) {
    if (out.compare(i, 4, "\r\033[K") == 0) {
      current.clear();
      i += 3;
    } else if (out[i] == '\n') {
      lines.push_back(current);
      current.clear();
    } else {
      current += out[i];
    }
  }
  lines.push_back(current);
  EXPECT_THAT(lines, ::testing::ElementsAre("[rank0]: epoch 0: loss 0.6170",
                                            "12:00:01  epoch_end  epoch 1/3 done", "[rank1]: done",
                                            "RUNNING  step 50"));

  std::ostringstream plain;
  {
    TerminalMux mux(plain);
    mux.status_out() << "12:00:01  running\n" << std::flush;
    mux.lines_out() << "[rank0]: hello\n";
  }
  EXPECT_EQ(plain.str(), "12:00:01  running\n[rank0]: hello\n");
}

}  // namespace
}  // namespace trainctl::cli
