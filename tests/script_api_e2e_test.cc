// A command job's script on trainctl's Python API (python/trainctl,
// issue #44 items 3 and 4), against a real coordinator and worker:
// trainctl.save_checkpoint is listed by `trainctl checkpoints`, `trainctl
// resume` hands it to the new job's trainctl.load_checkpoint(); the model of
// trainctl.save_model comes back with `trainctl fetch` and loads in Python;
// an engine job's checkpoint and final model (TorchScript) become plain
// state_dicts with trainctl.load_state_dict.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <regex>

#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "tests/support/source_dir.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using trainctl::testing::Cluster;
using trainctl::testing::SourceDir;

bool HaveTorch() { return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0; }

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class ScriptApiE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveTorch()) GTEST_SKIP() << "Debian's python3-torch is not installed";
    cluster_ = std::make_unique<Cluster>(trainctl::testing::BuildDirOfThisTest(), "/bin/false");
    ASSERT_TRUE(cluster_->StartCoordinator());
    ASSERT_TRUE(cluster_->StartWorker("w0", 1, false, {"--allow_commands"}));
    ASSERT_TRUE(cluster_->WaitWorkers(1));
  }

  // The CLI's exit code, with its stdout+stderr in *out.
  int Cli(const std::string& args, std::string* out) {
    const std::string log = cluster_->dir() + "/cli.out";
    const std::string cmd =
        absl::StrCat(trainctl::testing::BuildDirOfThisTest(),
                     "/client/trainctl --coordinator=", cluster_->address(),
                     " --token=", cluster_->admin_token(), " ", args, " > ", log, " 2>&1");
    const int rc = std::system(cmd.c_str());
    *out = Slurp(log);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  }

  v1::JobSpec Job() {
    ParsedJobSpec p = ParseJobSpecYaml(
        absl::StrCat(
            "name: script-api\nworld_size: 1\ndevice: cpu\ncommand:\n  argv: [/usr/bin/python3, ",
            SourceDir(), "/tests/support/script_api.py]\n  working_dir: ", cluster_->dir(),
            "\nrestart: {max_restarts: 0}\n"),
        "job.yaml");
    EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
    return p.spec;
  }

  std::unique_ptr<Cluster> cluster_;
};

TEST_F(ScriptApiE2ETest, SavedCheckpointIsListedResumedAndTheModelFetched) {
  const std::string a = cluster_->Submit(Job());
  ASSERT_FALSE(a.empty());
  v1::Job ja = cluster_->WaitState(a, v1::JOB_STATE_SUCCEEDED, absl::Seconds(90));
  ASSERT_EQ(ja.state(), v1::JOB_STATE_SUCCEEDED) << ja.state_reason() << "\n"
                                                 << cluster_->RankLog(a, 1, 0);
  EXPECT_THAT(cluster_->RankLog(a, 1, 0), HasSubstr("fresh start"));

  // save_checkpoint → recorded, and `trainctl checkpoints` lists it.
  ASSERT_EQ(ja.checkpoints_size(), 1) << ja.DebugString();
  const v1::CheckpointRecord& rec = ja.checkpoints(0);
  EXPECT_EQ(rec.epochs_done(), 1);
  EXPECT_EQ(rec.global_step(), 10);
  EXPECT_THAT(rec.path(), HasSubstr(absl::StrCat("/", a, ".ckpt-epoch-000001-0000000010.pt")));
  EXPECT_EQ(rec.checksum().substr(0, 6), "crc32:");
  std::string out;
  ASSERT_EQ(Cli(absl::StrCat("checkpoints ", a), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr(rec.path()));
  EXPECT_THAT(out, HasSubstr(rec.checksum()));

  // save_model → `trainctl fetch` gets it, says how to load it, and it loads.
  ASSERT_FALSE(ja.final_model().empty()) << ja.DebugString();
  const std::string fetched = cluster_->dir() + "/fetched-model.pt";
  ASSERT_EQ(Cli(absl::StrCat("fetch ", a, " -O ", fetched), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("torch.load it in Python"));
  EXPECT_THAT(out, Not(HasSubstr("torch.jit.load")));
  std::smatch sum;
  const std::string log_a = cluster_->RankLog(a, 1, 0);
  ASSERT_TRUE(std::regex_search(log_a, sum, std::regex("model weight sum (-?[0-9.]+)"))) << log_a;
  const std::string load = absl::StrCat(
      "/usr/bin/python3 -c \"import sys, torch; sys.path.insert(0, '", SourceDir(),
      "/python'); import trainctl; ", "m = torch.nn.Linear(3, 2); m.load_state_dict(torch.load('",
      fetched, "')); ", "m.load_state_dict(trainctl.load_state_dict('", fetched, "')); ",
      "print('loaded %.6f' % m.weight.sum().item())\" > ", cluster_->dir(), "/load.out 2>&1");
  ASSERT_EQ(std::system(load.c_str()), 0) << Slurp(cluster_->dir() + "/load.out");
  EXPECT_THAT(Slurp(cluster_->dir() + "/load.out"),
              HasSubstr(absl::StrCat("loaded ", sum[1].str())));

  // `trainctl resume` → the new job's load_checkpoint() returns that checkpoint.
  ASSERT_EQ(Cli(absl::StrCat("resume ", a), &out), 0) << out;
  std::smatch id;
  ASSERT_TRUE(std::regex_search(out, id, std::regex("submitted job ([^ ,]+), continuing"))) << out;
  EXPECT_THAT(out, HasSubstr("from epoch 1 (step 10)"));
  EXPECT_THAT(out, Not(HasSubstr("to epoch 0")));
  const std::string b = id[1].str();
  v1::Job jb = cluster_->WaitState(b, v1::JOB_STATE_SUCCEEDED, absl::Seconds(90));
  ASSERT_EQ(jb.state(), v1::JOB_STATE_SUCCEEDED) << jb.state_reason() << "\n"
                                                 << cluster_->RankLog(b, 1, 0);
  EXPECT_THAT(cluster_->RankLog(b, 1, 0), HasSubstr(absl::StrCat("resumed from ", rec.path(),
                                                                 " epoch 1 step 10 w=[1.0, 2.0]")));
  // It went on from there: its own checkpoint is epoch 2, step 20.
  ASSERT_FALSE(jb.checkpoints().empty());
  EXPECT_EQ(jb.checkpoints(jb.checkpoints_size() - 1).global_step(), 20) << jb.DebugString();
}

// The engine's files (issue #44 item 5): trainctl.load_state_dict turns its
// checkpoint and its TorchScript model into state_dicts an nn.Module with the
// engine's layout loads, and both compute what the TorchScript model does.
TEST(ScriptApiEngineTest, EngineCheckpointAndModelLoadIntoAnNnModule) {
  if (!HaveTorch()) GTEST_SKIP() << "Debian's python3-torch is not installed";
  const std::string build = trainctl::testing::BuildDirOfThisTest();
  const std::string rank = build + "/worker/trainer/trainctl-rank";
  if (access(rank.c_str(), X_OK) != 0) GTEST_SKIP() << "no trainctl-rank (built without LibTorch)";
  Cluster cluster(build, rank);
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.StartWorker("w0", 1));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  ParsedJobSpec p =
      ParseJobSpecFile(SourceDir() + "/examples/mlp-synthetic.yaml",
                       {"world_size=1", "device=cpu", "training.epochs=1", "model.hidden=[4]"});
  ASSERT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
  const std::string id = cluster.Submit(p.spec);
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster.WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(120));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  ASSERT_FALSE(j.final_model().empty());
  ASSERT_FALSE(j.checkpoints().empty());
  const std::string out = cluster.dir() + "/engine-load.out";
  const std::string script = absl::StrCat(
      "import sys, torch\n"
      "sys.path.insert(0, '",
      SourceDir(),
      "/python')\n"
      "import trainctl\n"
      "class MLP(torch.nn.Module):\n"
      "    def __init__(self):\n"
      "        super().__init__()\n"
      "        self.layers = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), "
      "torch.nn.Linear(4, 2))\n"
      "    def forward(self, x):\n"
      "        return self.layers(x)\n"
      "from_ckpt, from_model = MLP(), MLP()\n"
      "from_ckpt.load_state_dict(trainctl.load_state_dict('",
      j.checkpoints(0).path(),
      "'))\n"
      "from_model.load_state_dict(trainctl.load_state_dict('",
      j.final_model(),
      "', from_model))\n"
      "x = torch.randn(8, 5)\n"
      "want = torch.jit.load('",
      j.final_model(),
      "')(x)\n"
      "assert torch.allclose(from_model(x), want), 'model'\n"
      "assert torch.allclose(from_ckpt(x), want), 'checkpoint'\n"
      "print('engine files load')\n");
  {
    std::ofstream f(cluster.dir() + "/engine_load.py");
    f << script;
  }
  const int rc = std::system(
      absl::StrCat("/usr/bin/python3 ", cluster.dir(), "/engine_load.py > ", out, " 2>&1").c_str());
  EXPECT_EQ(rc, 0) << Slurp(out);
  EXPECT_THAT(Slurp(out), HasSubstr("engine files load"));
}

}  // namespace
}  // namespace trainctl
