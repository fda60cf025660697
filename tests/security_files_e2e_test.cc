// Files, end to end (issue 25: findings 4, 7, 8, 10), with a real
// coordinator, worker daemon, trainctl-rank processes (Gloo on CPU) and CLI:
//  - links planted in a job's checkpoint directory (at the daemon's
//    pre-flight probe name, the rank's write-probe names, the model's old
//    temporary name and the model's name) leave their targets unchanged,
//    and the job still SUCCEEDS;
//  - under umask 022, what the coordinator and the worker create (database
//    and its -wal/-shm, work dir, rank files, checkpoints, model) is 0600
//    (directories 0700);
//  - without --data-root a data path outside the work dir is refused, and a
//    CSV holding a secret fails its job without the secret in any message;
//  - trainctl fetch names its file from the job id, writes it 0600, and
//    refuses to overwrite one without --force.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "tests/support/source_dir.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using trainctl::testing::Cluster;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

mode_t Mode(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return 0;
  return st.st_mode;
}

// A one-rank CPU job of the classic example; `sets` override.
v1::JobSpec Classic(std::vector<std::string> sets) {
  std::vector<std::string> all = {"world_size=1", "device=cpu", "training.epochs=2",
                                  "data.train.length=600"};
  all.insert(all.end(), sets.begin(), sets.end());
  ParsedJobSpec p =
      ParseJobSpecFile(trainctl::testing::SourceDir() + "/examples/mlp-synthetic.yaml", all);
  EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
  return p.spec;
}

// A one-rank CPU job training on the CSV at `path` (one feature, a class).
v1::JobSpec CsvJob(const std::string& path) {
  ParsedJobSpec p =
      ParseJobSpecYaml(absl::StrCat("name: csv\nworld_size: 1\ndevice: cpu\n"
                                    "model: {name: mlp, input_dim: 1, classes: 2}\n"
                                    "data: {train: {format: csv, path: ",
                                    path, ", header: false}}\nrestart: {max_restarts: 0}\n"),
                       "csv.yaml", {});
  EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
  return p.spec;
}

// The CLI run in `cwd`: its exit code, stdout+stderr in *out.
int Cli(const Cluster& c, const std::string& cwd, const std::string& args, std::string* out) {
  const std::string log = c.dir() + "/cli.out";
  const std::string cmd =
      absl::StrCat("cd '", cwd, "' && ", trainctl::testing::BuildDirOfThisTest(),
                   "/client/trainctl --coordinator=", c.address(), " --token=", c.admin_token(),
                   " ", args, " > ", log, " 2>&1");
  int rc = std::system(cmd.c_str());
  *out = ReadFile(log);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

class SecurityFilesE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The documented manual setup's umask: the daemons must not rely on it.
    old_umask_ = ::umask(022);
    std::string build = trainctl::testing::BuildDirOfThisTest();
    cluster_ = std::make_unique<Cluster>(build, build + "/worker/trainer/trainctl-rank");
    ASSERT_TRUE(cluster_->StartCoordinator());
  }
  void TearDown() override {
    cluster_.reset();
    ::umask(old_umask_);
  }
  mode_t old_umask_ = 0;
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(SecurityFilesE2ETest, PlantedLinksChangeNothingFilesArePrivateAndFetchWritesOnlyWhereAsked) {
  const std::string ck = cluster_->dir() + "/ck", shared = ck + "/shared",
                    victims = cluster_->dir() + "/victims";
  fs::create_directories(shared);
  fs::create_directories(victims);
  ASSERT_TRUE(cluster_->StartWorker("w0", 1, false, {"--checkpoint-root=" + ck}));
  ASSERT_TRUE(cluster_->WaitWorkers(1));

  // The links a job (or its owner) can plant ahead of a run, each at a file
  // that must stay as it is.
  std::vector<std::pair<std::string, std::string>> planted;  // link, victim
  auto plant = [&](const std::string& name, const std::string& victim) {
    const std::string target = victims + "/" + victim;
    if (!fs::exists(target)) std::ofstream(target) << "precious " << victim;
    fs::create_symlink(target, shared + "/" + name);
    planted.emplace_back(shared + "/" + name, target);
  };
  plant(absl::StrCat(".trainctl-preflight-", cluster_->worker("w0")->pid()), "preflight");
  plant("model.pt.tmp", "model-tmp");
  plant("model.pt", "model");
  // The rank's pid is not known yet: the next few thousand pids.
  int64_t last_pid = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile("/proc/sys/kernel/ns_last_pid")),
                               &last_pid));
  for (int64_t pid = last_pid + 1; pid <= last_pid + 3000; ++pid) {
    plant(absl::StrCat(".trainctl-write-probe.", pid), "write-probe");
  }

  const std::string id = cluster_->Submit(Classic({"checkpoint.dir=" + shared}));
  ASSERT_FALSE(id.empty());
  v1::Job job = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(120));
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_reason();
  ASSERT_GE(job.checkpoints_size(), 1);
  for (const auto& [link, victim] : planted) {
    EXPECT_EQ(ReadFile(victim), "precious " + fs::path(victim).filename().string()) << link;
  }
  // The probes left the planted links alone (never followed, never removed).
  EXPECT_TRUE(fs::is_symlink(planted[0].first));
  EXPECT_TRUE(fs::is_symlink(planted[3].first));

  // Private at rest, whatever the umask the daemons were started with.
  // (-shm exists only outside SQLite's exclusive locking mode, which the
  // store uses: its WAL index is then in the coordinator's memory.)
  ASSERT_TRUE(fs::exists(cluster_->dir() + "/state.db"));
  ASSERT_TRUE(fs::exists(cluster_->dir() + "/state.db-wal"));
  for (const std::string f : {"/state.db", "/state.db-wal", "/state.db-shm"}) {
    const std::string path = cluster_->dir() + f;
    if (!fs::exists(path)) continue;
    EXPECT_EQ(Mode(path) & 0777, 0600u) << path;
  }
  int files = 0;
  for (const auto& e : fs::directory_iterator(shared)) {
    if (e.is_symlink()) continue;
    ++files;
    EXPECT_EQ(Mode(e.path()) & 0777, 0600u) << e.path();
  }
  EXPECT_GE(files, 2) << "checkpoints and the model";
  const std::string work = cluster_->dir() + "/worker-w0";
  EXPECT_EQ(Mode(work) & 0777, 0700u);
  int dirs = 0;
  for (const auto& e : fs::recursive_directory_iterator(work)) {
    if (e.is_symlink()) continue;
    const mode_t m = Mode(e.path());
    if (S_ISDIR(m)) {
      ++dirs;
      EXPECT_EQ(m & 0777, 0700u) << e.path();
    } else {
      EXPECT_EQ(m & 077, 0u) << e.path();
    }
  }
  EXPECT_GE(dirs, 3) << "jobs/<id>/attempt-1/rank-0";

  // fetch: a name of the job id's making, 0600, never over an existing file
  // unless --force.
  const std::string out_dir = cluster_->dir() + "/home";
  fs::create_directories(out_dir);
  std::string out;
  ASSERT_EQ(Cli(*cluster_, out_dir, absl::StrCat("fetch ", id), &out), 0) << out;
  const std::string model = out_dir + "/" + id + "-model.pt";
  ASSERT_TRUE(fs::is_regular_file(model)) << out;
  EXPECT_EQ(Mode(model) & 0777, 0600u);
  const std::string fetched = ReadFile(model);
  EXPECT_GT(fetched.size(), 0u);
  std::ofstream(model, std::ios::trunc) << "mine";
  EXPECT_NE(Cli(*cluster_, out_dir, absl::StrCat("fetch ", id), &out), 0);
  EXPECT_THAT(out, HasSubstr("exists; not overwritten (--force to replace it)"));
  EXPECT_EQ(ReadFile(model), "mine");
  const std::string bashrc = out_dir + "/.bashrc";
  std::ofstream(bashrc) << "# mine";
  EXPECT_NE(Cli(*cluster_, out_dir, absl::StrCat("fetch ", id, " -O .bashrc"), &out), 0);
  EXPECT_EQ(ReadFile(bashrc), "# mine");
  ASSERT_EQ(Cli(*cluster_, out_dir, absl::StrCat("fetch ", id, " --force"), &out), 0) << out;
  EXPECT_EQ(ReadFile(model), fetched);
  const int64_t step = job.checkpoints(0).global_step();
  ASSERT_EQ(Cli(*cluster_, out_dir, absl::StrCat("fetch ", id, " --checkpoint ", step), &out), 0)
      << out;
  const std::string ckpt = absl::StrCat(out_dir, "/", id, "-step-", step, ".pt");
  EXPECT_TRUE(fs::is_regular_file(ckpt)) << out;
  EXPECT_EQ(Mode(ckpt) & 0777, 0600u);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(out_dir))
    names.push_back(e.path().filename().string());
  EXPECT_EQ(names.size(), 3u) << "no temporary file left";
}

TEST_F(SecurityFilesE2ETest, DataOutsideTheRootsIsRefusedAndASecretIsNeverEchoed) {
  ASSERT_TRUE(cluster_->StartWorker("w0", 1));  // no --data-root
  ASSERT_TRUE(cluster_->WaitWorkers(1));
  const std::string work = cluster_->dir() + "/worker-w0";
  const std::string outside = cluster_->dir() + "/elsewhere";
  fs::create_directories(outside);
  std::ofstream(outside + "/secret.csv") << "1,TOPSECRET-password-abc\n";
  std::ofstream(work + "/secret.csv") << "1,TOPSECRET-password-abc\n";

  // Outside the work dir (and /usr/share/datasets): refused at pre-flight.
  std::string id = cluster_->Submit(CsvJob(outside + "/secret.csv"));
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_FAILED, absl::Seconds(60));
  ASSERT_EQ(j.state(), v1::JOB_STATE_FAILED) << j.state_reason();
  EXPECT_THAT(j.state_reason(), HasSubstr("data.train.path: '" + outside + "/secret.csv'"));
  EXPECT_THAT(j.state_reason(), HasSubstr("is outside every data root"));
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_PREFLIGHT);

  // Inside the work dir it is read, and its parse error names the file, line
  // and column, never the content.
  id = cluster_->Submit(CsvJob(work + "/secret.csv"));
  ASSERT_FALSE(id.empty());
  j = cluster_->WaitState(id, v1::JOB_STATE_FAILED, absl::Seconds(60));
  ASSERT_EQ(j.state(), v1::JOB_STATE_FAILED) << j.state_reason();
  EXPECT_THAT(j.state_reason(), HasSubstr("line 1 column 2: not a finite number"));
  std::string everything = j.DebugString() + cluster_->RankLog(id, 1, 0);
  for (const v1::Event& e : cluster_->Events(id)) everything += e.DebugString();
  EXPECT_THAT(everything, Not(HasSubstr("TOPSECRET")));
  EXPECT_THAT(cluster_->worker("w0")->ReadLog(), Not(HasSubstr("TOPSECRET")));
}

}  // namespace
}  // namespace trainctl
