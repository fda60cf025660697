// Ranks cannot read their daemon's secrets (issue 25, finding 2; docs/
// security.md "Ranks run as another user"). A real coordinator over TLS and
// a worker daemon (root, as in CI) that joined with a one-time token and
// runs ranks with --rank-user nobody: a submitter's command job that opens
// the daemon's worker.key, worker-id, its join token file or another
// attempt's rank.conf (which holds that attempt's store secret) gets
// EACCES for each, while an engine job and a command job succeed as that
// user and write their checkpoints; pre-flight touches a job-chosen
// checkpoint.dir as the rank user, so root creates nothing for the job
// where that user could not; a daemon that cannot switch users refuses to
// start. With --rank-uids, two owners' jobs run as two uids of their own
// and neither reads the other's checkpoint or scratch files, while one
// owner's jobs share theirs.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/auth/secret.h"
#include "common/jobspec/job_spec.h"
#include "common/subprocess.h"
#include "common/temp_dir.h"
#include "tests/support/cluster.h"
#include "tests/support/source_dir.h"
#include "worker/daemon/rank_files.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using trainctl::testing::Cluster;
using trainctl::testing::SourceDir;

// Tries to read every file named; prints DENIED/READ per file and exits 3
// when anything was readable.
constexpr char kAttackScript[] = R"sh(#!/bin/sh
echo "uid=$(id -u)"
status=0
for f in "$@"; do
  if out=$(cat "$f" 2>&1 >/dev/null); then echo "READ $f"; status=3; else echo "DENIED $f: $out"; fi
done
exit $status
)sh";

// What a normal command job does: writes its checkpoint where it is told.
constexpr char kWriterScript[] = R"sh(#!/bin/sh
set -e
echo "uid=$(id -u)"
echo "weights" > "$TRAINCTL_CHECKPOINT_DIR/model.txt"
echo "wrote $TRAINCTL_CHECKPOINT_DIR/model.txt"
)sh";

// A job of some owner: prints who it runs as, writes its checkpoint and a
// scratch file, then tries to read every file named (READ/DENIED per file).
constexpr char kOwnerScript[] = R"sh(#!/bin/sh
echo "uid=$(id -u) gid=$(id -g) home=$HOME"
echo "weights" > "$TRAINCTL_CHECKPOINT_DIR/model.txt"
echo "scratch" > scratch.txt
for f in "$@"; do
  if cat "$f" >/dev/null 2>&1; then echo "READ $f"; else echo "DENIED $f"; fi
done
)sh";

struct stat FileStat(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st;
}

class RankUserE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "--rank-user needs a daemon running as root";
    absl::StatusOr<RunAs> nobody = LookupUser("nobody");
    if (!nobody.ok()) GTEST_SKIP() << nobody.status();
    nobody_ = *nobody;
    build_ = trainctl::testing::BuildDirOfThisTest();
    // The rank user runs trainctl-rank: a build tree under a directory it
    // cannot pass (a checkout in /root) would fail the engine job for that
    // reason alone, so the daemon is given a copy it can reach.
    std::string rank_binary = build_ + "/worker/trainer/trainctl-rank";
    if (access(rank_binary.c_str(), X_OK) == 0) {
      bin_dir_ = MakeTempDir("trainctl_rank_bin_");
      const std::string copy = bin_dir_ + "/trainctl-rank";
      std::error_code ec;
      std::filesystem::copy_file(rank_binary, copy, ec);
      ASSERT_FALSE(ec) << ec.message();
      ASSERT_EQ(chmod(bin_dir_.c_str(), 0711), 0);
      ASSERT_EQ(chmod(copy.c_str(), 0755), 0);
      rank_binary = copy;
    }
    cluster_ = std::make_unique<Cluster>(build_, rank_binary);
    // The rank user passes through the test's directory (0700 from
    // mkdtemp) to the worker's work dir and the scripts, as it would
    // through /var/lib; it cannot list it.
    ASSERT_EQ(chmod(cluster_->dir().c_str(), 0711), 0);
    ASSERT_TRUE(cluster_->InitTls());
    ASSERT_TRUE(cluster_->StartCoordinator(ExtraCoordinatorFlags()));
    const std::string join = cluster_->CreateToken(v1::ROLE_JOIN, "rank-user-host");
    ASSERT_FALSE(join.empty());
    join_file_ = cluster_->dir() + "/join.token";
    ASSERT_TRUE(auth::WritePrivateFile(join_file_, join + "\n").ok());
    std::vector<std::string> flags = {"--join_token_file=" + join_file_, "--allow_commands",
                                      "--rank-user=nobody"};
    for (const std::string& f : ExtraWorkerFlags()) flags.push_back(f);
    ASSERT_TRUE(cluster_->StartWorker("w0", 2, false, flags));
    ASSERT_TRUE(cluster_->WaitWorkers(1)) << cluster_->worker("w0")->ReadLog();
    work_ = cluster_->dir() + "/worker-w0";
    for (const auto& [name, text] :
         {std::pair{"attack.sh", kAttackScript}, std::pair{"writer.sh", kWriterScript},
          std::pair{"owner.sh", kOwnerScript}}) {
      const std::string path = cluster_->dir() + "/" + name;
      std::ofstream(path) << text;
      ASSERT_EQ(chmod(path.c_str(), 0755), 0);
    }
  }

  // A one-rank command job running `script` with `args`.
  v1::JobSpec Command(const std::string& name, const std::string& script,
                      const std::vector<std::string>& args,
                      const std::string& checkpoint_dir = "") {
    std::string argv = absl::StrCat("[/bin/sh, ", cluster_->dir(), "/", script);
    for (const std::string& a : args) absl::StrAppend(&argv, ", '", a, "'");
    argv += "]";
    std::string yaml =
        absl::StrCat("name: ", name, "\nworld_size: 1\ndevice: cpu\ncommand:\n  argv: ", argv,
                     "\nrestart: {max_restarts: 0}\n");
    if (!checkpoint_dir.empty())
      absl::StrAppend(&yaml, "checkpoint: {dir: ", checkpoint_dir, "}\n");
    ParsedJobSpec p = ParseJobSpecYaml(yaml, "job.yaml");
    EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
    return p.spec;
  }

  // Runs the attack script against `files` (each must exist, so that a
  // refusal is EACCES, not ENOENT) and expects every one refused.
  void ExpectEveryReadRefused(const std::vector<std::string>& files) {
    for (const std::string& f : files)
      ASSERT_EQ(access(f.c_str(), R_OK), 0) << f << " must exist (root reads it)";
    const std::string id = cluster_->Submit(Command("attacker", "attack.sh", files));
    ASSERT_FALSE(id.empty());
    v1::Job j = cluster_->WaitFor(id, [](const v1::Job& j) {
      return j.state() == v1::JOB_STATE_SUCCEEDED || j.state() == v1::JOB_STATE_FAILED;
    });
    const std::string log = cluster_->RankLog(id, 1, 0);
    EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED)
        << "something was readable: " << j.state_reason() << "\n"
        << log;
    EXPECT_THAT(log, HasSubstr(absl::StrCat("uid=", nobody_.uid)));
    for (const std::string& f : files) {
      EXPECT_THAT(log, HasSubstr(absl::StrCat("DENIED ", f, ": cat: ", f, ": Permission denied")))
          << log;
    }
    EXPECT_THAT(log, Not(HasSubstr("READ ")));
  }

  virtual std::vector<std::string> ExtraWorkerFlags() const { return {}; }
  virtual std::vector<std::string> ExtraCoordinatorFlags() const { return {}; }

  void TearDown() override {
    if (!bin_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(bin_dir_, ec);
    }
  }

  RunAs nobody_;
  std::string build_, work_, join_file_, bin_dir_;
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(RankUserE2ETest, CommandJobGetsPermissionDeniedOnTheDaemonsKeyIdAndToken) {
  ExpectEveryReadRefused(
      {work_ + "/worker.key", work_ + "/worker.crt", work_ + "/worker-id", join_file_});
  // The daemon's files are its own, 0600, in directories the rank user may
  // pass through but not list.
  for (const char* f : {"/worker.key", "/worker.crt", "/worker-id"}) {
    EXPECT_EQ(FileStat(work_ + f).st_mode & 0777, 0600u) << f;
    EXPECT_EQ(FileStat(work_ + f).st_uid, 0u) << f;
  }
  EXPECT_EQ(FileStat(work_).st_mode & 0777, 0711u);
  EXPECT_EQ(FileStat(work_ + "/jobs").st_mode & 0777, 0710u);
  EXPECT_EQ(FileStat(work_ + "/jobs").st_gid, nobody_.gid);
}

TEST_F(RankUserE2ETest, CommandJobRunsAsTheRankUserAndWritesItsCheckpoint) {
  const std::string id = cluster_->Submit(Command("writer", "writer.sh", {}));
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason() << "\n"
                                                << cluster_->RankLog(id, 1, 0);
  EXPECT_THAT(cluster_->RankLog(id, 1, 0), HasSubstr(absl::StrCat("uid=", nobody_.uid)));
  const std::string ckpt = work_ + "/jobs/" + id + "/checkpoints";
  EXPECT_EQ(FileStat(ckpt).st_uid, nobody_.uid);
  EXPECT_EQ(FileStat(ckpt).st_mode & 0777, 0700u);
  EXPECT_EQ(FileStat(ckpt + "/model.txt").st_uid, nobody_.uid);
  // Its scratch directory (its working directory) is its own too.
  EXPECT_EQ(FileStat(work_ + "/jobs/" + id + "/attempt-1/rank-0").st_uid, nobody_.uid);
}

TEST_F(RankUserE2ETest, EngineJobSucceedsAsTheRankUserAndNoRankReadsAnotherAttemptsConfig) {
  const std::string rank_binary = build_ + "/worker/trainer/trainctl-rank";
  if (access(rank_binary.c_str(), X_OK) != 0)
    GTEST_SKIP() << "built without LibTorch: no trainctl-rank";
  ParsedJobSpec p = ParseJobSpecFile(SourceDir() + "/examples/mlp-synthetic.yaml",
                                     {"training.epochs=1", "data.train.length=600", "device=cpu"});
  ASSERT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
  const std::string id = cluster_->Submit(p.spec);
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(120));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason() << "\n"
                                                << cluster_->RankLog(id, 1, 0);
  // Trained and wrote its model as the rank user, in the directory the
  // daemon made for it.
  EXPECT_EQ(j.final_model(), work_ + "/jobs/" + id + "/checkpoints/" + id + ".model.pt");
  EXPECT_EQ(FileStat(j.final_model()).st_uid, nobody_.uid);
  // Each rank's config (with the attempt's store secret) stays the
  // daemon's: the rank got it as an open fd.
  const std::string attempt = work_ + "/jobs/" + id + "/attempt-1";
  for (const char* conf : {"/rank-0.conf", "/rank-1.conf"}) {
    EXPECT_EQ(FileStat(attempt + conf).st_uid, 0u) << conf;
    EXPECT_EQ(FileStat(attempt + conf).st_mode & 0777, 0600u) << conf;
  }
  std::ifstream in(attempt + "/rank-0.conf");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("run.store_secret="));
  // Another job's command cannot read it, nor list the attempt's directory.
  ExpectEveryReadRefused(
      {attempt + "/rank-0.conf", attempt + "/rank-1.conf", work_ + "/worker.key"});
}

TEST_F(RankUserE2ETest, PreflightMakesAJobChosenCheckpointDirAsTheRankUser) {
  // A directory only root may write in: the job is refused at pre-flight,
  // and root created nothing there on the job's behalf.
  const std::string root_only = cluster_->dir() + "/root-only";
  ASSERT_EQ(mkdir(root_only.c_str(), 0755), 0);
  const std::string refused_dir = root_only + "/ckpt";
  const std::string refused = cluster_->Submit(Command("refused", "writer.sh", {}, refused_dir));
  ASSERT_FALSE(refused.empty());
  v1::Job r = cluster_->WaitState(refused, v1::JOB_STATE_FAILED, absl::Seconds(60));
  ASSERT_EQ(r.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(r.state_reason(), HasSubstr(refused_dir));
  EXPECT_THAT(r.state_reason(), HasSubstr("Permission denied"));
  EXPECT_NE(access(refused_dir.c_str(), F_OK), 0) << "root made the job's directory";
  // Where the rank user may create it, it is created as that user.
  const std::string shared = cluster_->dir() + "/shared";
  ASSERT_EQ(mkdir(shared.c_str(), 0755), 0);
  ASSERT_EQ(chown(shared.c_str(), nobody_.uid, nobody_.gid), 0);
  const std::string made_dir = shared + "/run-1";
  const std::string id = cluster_->Submit(Command("writer", "writer.sh", {}, made_dir));
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason() << "\n"
                                                << cluster_->RankLog(id, 1, 0);
  EXPECT_EQ(FileStat(made_dir).st_uid, nobody_.uid);
  EXPECT_EQ(FileStat(made_dir + "/model.txt").st_uid, nobody_.uid);
}

// Without pre-flight (issue 45, finding 1) the launch itself makes a
// job-chosen checkpoint.dir as the rank user: root creates no directory and
// no manifest where that user could not, also through a link the job
// planted in a directory of its own.
class RankUserNoPreflightE2ETest : public RankUserE2ETest {
 protected:
  std::vector<std::string> ExtraCoordinatorFlags() const override { return {"--preflight=false"}; }
};

TEST_F(RankUserNoPreflightE2ETest, RootCreatesNothingAtAPathTheJobChose) {
  const std::string root_only = cluster_->dir() + "/root-only";
  ASSERT_EQ(mkdir(root_only.c_str(), 0755), 0);
  const std::string shared = cluster_->dir() + "/shared";
  ASSERT_EQ(mkdir(shared.c_str(), 0755), 0);
  ASSERT_EQ(chown(shared.c_str(), nobody_.uid, nobody_.gid), 0);
  // What a job of the rank user could plant in its own directory.
  ASSERT_EQ(symlink(root_only.c_str(), (shared + "/planted").c_str()), 0);
  for (const std::string& dir :
       {root_only + "/made-by-root/deeper", shared + "/planted/deeper", root_only}) {
    SCOPED_TRACE(dir);
    const std::string id = cluster_->Submit(Command("refused", "writer.sh", {}, dir));
    ASSERT_FALSE(id.empty());
    v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_FAILED, absl::Seconds(60));
    ASSERT_EQ(j.state(), v1::JOB_STATE_FAILED);
    EXPECT_THAT(j.state_reason(), HasSubstr("as the rank user (Permission denied)"));
    ASSERT_GT(j.attempts_size(), 0);
    EXPECT_EQ(j.attempts(j.attempts_size() - 1).failure_kind(), v1::FAILURE_KIND_CONFIG);
  }
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(root_only))
    left.push_back(e.path().filename());
  EXPECT_THAT(left, ::testing::IsEmpty())
      << "root made something in a directory the rank user cannot write";
  // Where the rank user may, the directory and its manifests are that
  // user's: root writes nothing there (a fetch trusts a rank uid's
  // manifest, job_dir.h).
  const std::string made = shared + "/run-1";
  const std::string id = cluster_->Submit(Command("writer", "writer.sh", {}, made));
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason() << "\n"
                                                << cluster_->RankLog(id, 1, 0);
  EXPECT_EQ(FileStat(made).st_uid, nobody_.uid);
  EXPECT_EQ(FileStat(made + "/.trainctl-dir").st_uid, nobody_.uid);
  EXPECT_EQ(FileStat(made + "/" + id + ".trainctl-job").st_uid, nobody_.uid);
  EXPECT_EQ(FileStat(made + "/model.txt").st_uid, nobody_.uid);
}

// TORCHELASTIC_ERROR_FILE lies in the rank's own directory, which the rank
// user owns: the daemon reads it as that user and never through a link, so
// a rank cannot make the daemon quote a file only root may read (here a
// JSON document in torchrun's form, as a real target would be made to
// look) in its failure reason. A file the rank wrote is quoted.
TEST_F(RankUserE2ETest, ErrorFileIsReadAsTheRankUserNeverThroughALink) {
  const std::string secret = cluster_->dir() + "/secret.json";
  ASSERT_TRUE(auth::WritePrivateFile(
                  secret, R"({"message": {"message": "SECRET-7f3a only root reads this"}})")
                  .ok());
  const std::string script = cluster_->dir() + "/errfile.sh";
  std::ofstream(script)
      << "#!/bin/sh\n"
         "case \"$1\" in\n"
         "  own) echo '{\"message\": {\"message\": \"ValueError: written by the rank\", "
         "\"extraInfo\": {\"py_callstack\": \"x\", \"timestamp\": \"1\"}}}' > "
         "\"$TORCHELASTIC_ERROR_FILE\" ;;\n"
         "  symlink) ln -s \"$2\" \"$TORCHELASTIC_ERROR_FILE\" ;;\n"
         "  hardlink) ln \"$2\" \"$TORCHELASTIC_ERROR_FILE\" || echo 'no hard link' ;;\n"
         "esac\n"
         "exit 1\n";
  ASSERT_EQ(chmod(script.c_str(), 0755), 0);
  for (const std::string mode : {"own", "symlink", "hardlink"}) {
    SCOPED_TRACE(mode);
    const std::string id =
        cluster_->Submit(Command("errfile-" + mode, "errfile.sh", {mode, secret}));
    ASSERT_FALSE(id.empty());
    v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_FAILED, absl::Seconds(60));
    ASSERT_EQ(j.state(), v1::JOB_STATE_FAILED);
    EXPECT_THAT(j.state_reason(), HasSubstr("exited with code 1"));
    if (mode == "own") {
      EXPECT_THAT(j.state_reason(),
                  HasSubstr("exited with code 1: ValueError: written by the rank"));
    } else {
      EXPECT_THAT(j.state_reason(), Not(HasSubstr("SECRET")));
    }
  }
}

// Ids far above any user or group a test machine has.
constexpr uid_t kFirstOwnerUid = 2147000000;
constexpr uid_t kLastOwnerUid = 2147000099;

class OwnerUidsE2ETest : public RankUserE2ETest {
 protected:
  void SetUp() override {
    if (geteuid() == 0) {
      absl::Status unused = worker::CheckRankUidsUnused({kFirstOwnerUid, kLastOwnerUid});
      if (!unused.ok()) GTEST_SKIP() << unused;
    }
    RankUserE2ETest::SetUp();
  }
  std::vector<std::string> ExtraWorkerFlags() const override {
    return {absl::StrCat("--rank-uids=", kFirstOwnerUid, "-", kLastOwnerUid)};
  }

  // Runs owner.sh as the holder of `token` trying to read `files`; the job
  // must succeed. Its rank's output.
  std::string RunOwnerJob(const std::string& token, const std::string& name,
                          const std::vector<std::string>& files, std::string* id) {
    EXPECT_TRUE(cluster_->SubmitAs(token, Command(name, "owner.sh", files), id).ok());
    v1::Job j = cluster_->WaitState(*id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
    const std::string log = cluster_->RankLog(*id, 1, 0);
    EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason() << "\n" << log;
    return log;
  }
};

TEST_F(OwnerUidsE2ETest, EachOwnersRanksRunAsTheirOwnUidAndCannotReadAnotherOwnersFiles) {
  const std::string alice = cluster_->CreateToken(v1::ROLE_SUBMITTER, "alice");
  const std::string bob = cluster_->CreateToken(v1::ROLE_SUBMITTER, "bob");
  ASSERT_FALSE(alice.empty());
  ASSERT_FALSE(bob.empty());
  std::string a1, b1, a2;
  const std::string a1_log = RunOwnerJob(alice, "alice-1", {}, &a1);
  const std::string model = work_ + "/jobs/" + a1 + "/checkpoints/model.txt";
  const std::string scratch = work_ + "/jobs/" + a1 + "/attempt-1/rank-0/scratch.txt";
  // The files alice's job wrote are hers, in directories only she passes.
  const uid_t alice_uid = FileStat(model).st_uid;
  EXPECT_GE(alice_uid, kFirstOwnerUid);
  EXPECT_LE(alice_uid, kLastOwnerUid);
  EXPECT_EQ(FileStat(scratch).st_uid, alice_uid);
  EXPECT_THAT(a1_log, HasSubstr(absl::StrCat("uid=", alice_uid, " gid=", alice_uid, " home=", work_,
                                             "/homes/", alice_uid)));
  EXPECT_EQ(FileStat(work_ + "/homes/" + std::to_string(alice_uid)).st_uid, alice_uid);
  EXPECT_EQ(FileStat(work_ + "/jobs/" + a1).st_gid, alice_uid);
  EXPECT_EQ(FileStat(work_ + "/jobs/" + a1).st_mode & 0777, 0710u);

  // Bob's job runs as another uid of the range and reads none of it.
  const std::string b1_log = RunOwnerJob(bob, "bob-1", {model, scratch}, &b1);
  const uid_t bob_uid = FileStat(work_ + "/jobs/" + b1 + "/checkpoints/model.txt").st_uid;
  EXPECT_NE(bob_uid, alice_uid);
  EXPECT_GE(bob_uid, kFirstOwnerUid);
  EXPECT_LE(bob_uid, kLastOwnerUid);
  EXPECT_THAT(b1_log, HasSubstr(absl::StrCat("uid=", bob_uid, " ")));
  EXPECT_THAT(b1_log, HasSubstr("DENIED " + model));
  EXPECT_THAT(b1_log, HasSubstr("DENIED " + scratch));
  EXPECT_THAT(b1_log, Not(HasSubstr("READ ")));

  // Alice's next job is alice again: same uid, her files are hers to read.
  const std::string a2_log = RunOwnerJob(alice, "alice-2", {model, scratch}, &a2);
  EXPECT_THAT(a2_log, HasSubstr(absl::StrCat("uid=", alice_uid, " ")));
  EXPECT_THAT(a2_log, HasSubstr("READ " + model));
  EXPECT_THAT(a2_log, HasSubstr("READ " + scratch));
  // Neither owner reaches the daemon's secrets.
  EXPECT_EQ(FileStat(work_ + "/worker.key").st_mode & 0777, 0600u);
}

TEST(RankUserFlagTest, ADaemonThatCannotSwitchUsersRefusesToStart) {
  const std::string build = trainctl::testing::BuildDirOfThisTest();
  const std::string worker = build + "/worker/daemon/trainctl-worker";
  // A token file anyone may read: the flags before --rank-user must pass.
  const std::string dir = MakeTempDir("rank_user_flag_test");
  ASSERT_EQ(chmod(dir.c_str(), 0755), 0);
  const std::string token = dir + "/worker.token";
  std::ofstream(token) << "tct_x_0\n";
  ASSERT_EQ(chmod(token.c_str(), 0644), 0);
  auto start = [&](const std::vector<std::string>& flags, const std::optional<RunAs>& as) {
    int fds[2];
    EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
    SpawnOptions o;
    o.argv = {worker, "--coordinator=127.0.0.1:1", "--token_file=" + token, "--slots=1",
              "--work_dir=/nonexistent/w"};
    o.argv.insert(o.argv.end(), flags.begin(), flags.end());
    o.run_as = as;
    o.fds = {{1, fds[1]}, {2, fds[1]}};
    absl::StatusOr<Subprocess> p = Subprocess::Spawn(o);
    close(fds[1]);
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    close(fds[0]);
    const int code = p.ok() ? p->Wait().code : -1;
    return std::pair{code, out};
  };
  auto [code, out] = start({"--rank-user=no-such-user-trainctl"}, std::nullopt);
  EXPECT_EQ(code, 2) << out;
  EXPECT_THAT(out, HasSubstr("--rank-user: user no-such-user-trainctl: no such user on this host"));
  std::tie(code, out) = start({"--rank-uids=20-10"}, std::nullopt);
  EXPECT_EQ(code, 2) << out;
  EXPECT_THAT(out, HasSubstr("--rank-uids: 20-10: needs 1 <= FIRST <= LAST"));
  std::tie(code, out) = start({"--rank-uids=2147000000-2147000009"}, std::nullopt);
  EXPECT_EQ(code, 2) << out;
  EXPECT_THAT(out, HasSubstr("--rank-uids: needs --rank-user"));
  if (geteuid() != 0) GTEST_SKIP() << "starting the daemon as another user needs root";
  absl::StatusOr<RunAs> nobody = LookupUser("nobody");
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  std::tie(code, out) = start({"--rank-user=root"}, *nobody);
  EXPECT_EQ(code, 2) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("--rank-user: this daemon runs as uid ", nobody->uid,
                                          ", not root")));
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace trainctl
