#include "worker/daemon/rank_workspace.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/codepack/code_pack.h"
#include "common/file_env.h"
#include "common/temp_dir.h"

namespace trainctl::worker {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct stat Stat(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st;
}

class RankWorkspaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = MakeTempDir("rank_workspace_test");
    ASSERT_FALSE(base_.empty());
    // A rank user must reach the work dir at all (as it would /var/lib).
    ASSERT_EQ(::chmod(base_.c_str(), 0755), 0);
    options_.work_dir = base_ + "/work";
    ASSERT_EQ(::mkdir(options_.work_dir.c_str(), 0711), 0);
    ASSERT_EQ(::mkdir((options_.work_dir + "/jobs").c_str(), 0711), 0);
    paths_.base_dir = base_;
  }
  void TearDown() override {
    if (!base_.empty()) std::system(("rm -rf " + base_).c_str());
  }
  RankWorkspace Workspace() const { return RankWorkspace(options_, paths_); }
  // Skips the test unless this process may take on another user.
  bool UseNobody() {
    if (::geteuid() != 0) return false;
    absl::StatusOr<RunAs> nobody = LookupUser("nobody");
    if (!nobody.ok()) return false;
    nobody_ = *nobody;
    return true;
  }

  std::string base_;
  DaemonOptions options_;
  RankTablePaths paths_;
  RunAs nobody_;
};

TEST_F(RankWorkspaceTest, PathsFollowTheWorkDirLayout) {
  const RankWorkspace ws = Workspace();
  const std::string jobs = options_.work_dir + "/jobs";
  EXPECT_EQ(ws.JobDir("j-1"), jobs + "/j-1");
  EXPECT_EQ(ws.AttemptDir("j-1", 3), jobs + "/j-1/attempt-3");
  EXPECT_EQ(ws.RankConfigFile("j-1", 3, 2), jobs + "/j-1/attempt-3/rank-2.conf");
  EXPECT_EQ(ws.PreemptFile("j-1", 3, 2), jobs + "/j-1/attempt-3/rank-2.preempted");
}

TEST_F(RankWorkspaceTest, APreemptionFileIsMadeOnceAndNeverThroughALink) {
  const RankWorkspace ws = Workspace();
  absl::Status missing = ws.MakePreemptFile("j-1", 1, 0);
  EXPECT_THAT(std::string(missing.message()), HasSubstr(ws.PreemptFile("j-1", 1, 0)));
  ASSERT_TRUE(ws.MakeRankDirs("j-1", 1, v1::JobSpec(), std::nullopt, 0).ok());
  ASSERT_TRUE(ws.MakePreemptFile("j-1", 1, 0).ok());
  EXPECT_TRUE(S_ISREG(Stat(ws.PreemptFile("j-1", 1, 0)).st_mode));
  EXPECT_TRUE(ws.MakePreemptFile("j-1", 1, 0).ok()) << "a second StopRanks";
  const std::string target = base_ + "/elsewhere";
  ASSERT_EQ(::symlink(target.c_str(), ws.PreemptFile("j-1", 1, 1).c_str()), 0);
  (void)ws.MakePreemptFile("j-1", 1, 1);
  EXPECT_FALSE(fs::exists(target)) << "made through a link";
}

TEST_F(RankWorkspaceTest, WithoutARankUserEveryDirectoryIsTheDaemonsAlone) {
  const RankWorkspace ws = Workspace();
  absl::StatusOr<std::string> dir = ws.MakeRankDirs("j-1", 2, v1::JobSpec(), std::nullopt, 1);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, ws.AttemptDir("j-1", 2) + "/rank-1");
  for (const std::string& d :
       {ws.JobDir("j-1"), ws.AttemptDir("j-1", 2), *dir, ws.JobDir("j-1") + "/checkpoints"}) {
    const struct stat st = Stat(d);
    EXPECT_TRUE(S_ISDIR(st.st_mode)) << d;
    EXPECT_EQ(st.st_uid, ::geteuid()) << d;
    EXPECT_EQ(st.st_mode & 07777, 0700u) << d;
  }
  v1::JobSpec chose;
  chose.mutable_checkpoint()->set_dir(base_ + "/mine");
  ASSERT_TRUE(ws.MakeJobDirs("j-2", chose, std::nullopt).ok());
  EXPECT_FALSE(fs::exists(ws.JobDir("j-2") + "/checkpoints"))
      << "a job that chose its directory gets no default";
}

TEST_F(RankWorkspaceTest, TheRankUserOwnsItsDirectoriesAndPassesTheDaemons) {
  if (!UseNobody()) GTEST_SKIP() << "owners of another user need root";
  options_.rank_user = nobody_;
  const RankWorkspace ws = Workspace();
  absl::StatusOr<std::string> dir = ws.MakeRankDirs("j-1", 1, v1::JobSpec(), nobody_, 0);
  ASSERT_TRUE(dir.ok()) << dir.status();
  for (const std::string& d : {ws.JobDir("j-1"), ws.AttemptDir("j-1", 1)}) {
    const struct stat st = Stat(d);
    EXPECT_EQ(st.st_uid, ::geteuid()) << d;
    EXPECT_EQ(st.st_gid, nobody_.gid) << d;
    EXPECT_EQ(st.st_mode & 07777, 0710u) << d;
  }
  for (const std::string& d : {*dir, ws.JobDir("j-1") + "/checkpoints"}) {
    const struct stat st = Stat(d);
    EXPECT_EQ(st.st_uid, nobody_.uid) << d;
    EXPECT_EQ(st.st_mode & 07777, 0700u) << d;
  }
}

TEST_F(RankWorkspaceTest, IdentityIsTheDaemonsTheRankUsersOrTheOwnersOwnUid) {
  EXPECT_FALSE(Workspace().JobIdentity(1)->has_value()) << "no rank user: the daemon's";
  EXPECT_FALSE(Workspace().ManifestWritersHere().rank_user.has_value());
  RunAs rank_user;
  rank_user.uid = 500;
  rank_user.gid = 501;
  rank_user.groups = {501};
  options_.rank_user = rank_user;
  absl::StatusOr<std::optional<RunAs>> as = Workspace().JobIdentity(7);
  ASSERT_TRUE(as.ok() && as->has_value());
  EXPECT_EQ((*as)->uid, 500u);
  EXPECT_EQ(Workspace().ManifestWritersHere().rank_user, std::optional<uid_t>(500));

  options_.rank_uids = RankUidRange{61000, 61009};
  as = Workspace().JobIdentity(3);
  ASSERT_TRUE(as.ok() && as->has_value()) << as.status();
  EXPECT_EQ((*as)->uid, 61002u);
  EXPECT_EQ((*as)->home, options_.work_dir + "/homes/61002");
  const ManifestWriters w = Workspace().ManifestWritersHere();
  EXPECT_TRUE(w.Trusts(61009));
  EXPECT_FALSE(w.Trusts(61010));
  EXPECT_THAT(std::string(Workspace().JobIdentity(0).status().message()),
              HasSubstr("sent no owner number"));
}

TEST_F(RankWorkspaceTest, WithRankUidsTheOwnersHomeIsMadeAsItsUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "owners of another uid need root";
  RunAs rank_user;
  rank_user.uid = 61100;
  rank_user.gid = 61100;
  options_.rank_user = rank_user;
  options_.rank_uids = RankUidRange{61101, 61109};
  const RankWorkspace ws = Workspace();
  absl::StatusOr<std::optional<RunAs>> as = ws.JobIdentity(2);
  ASSERT_TRUE(as.ok()) << as.status();
  ASSERT_TRUE(ws.MakeJobDirs("j-1", v1::JobSpec(), *as).ok());
  const struct stat homes = Stat(options_.work_dir + "/homes");
  EXPECT_EQ(homes.st_uid, ::geteuid());
  EXPECT_EQ(homes.st_gid, 61100u);
  EXPECT_EQ(homes.st_mode & 07777, 0710u);
  const struct stat home = Stat(options_.work_dir + "/homes/61102");
  EXPECT_EQ(home.st_uid, 61102u);
  EXPECT_EQ(home.st_mode & 07777, 0700u);
  EXPECT_EQ(Stat(ws.JobDir("j-1")).st_gid, 61102u) << "passable by this owner's ranks only";
}

TEST_F(RankWorkspaceTest, TheDefaultCheckpointDirIsClaimedForTheOwner) {
  const RankWorkspace ws = Workspace();
  v1::JobSpec spec;
  spec.mutable_tensorboard()->set_enabled(true);
  AttemptPaths p = ws.ResolvePaths(spec, AttemptClaim{"j-1", "alice", ""});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.checkpoint_dir, ws.JobDir("j-1") + "/checkpoints");
  EXPECT_EQ(p.tensorboard_dir, p.checkpoint_dir + "/tensorboard");
  absl::StatusOr<std::optional<DirClaim>> claim = ReadDirClaim(p.checkpoint_dir);
  ASSERT_TRUE(claim.ok() && claim->has_value()) << claim.status();
  EXPECT_EQ((*claim)->owner, "alice");
  EXPECT_EQ((*claim)->job_id, "j-1");
  EXPECT_TRUE(fs::exists(p.checkpoint_dir + "/j-1.trainctl-job"));
}

TEST_F(RankWorkspaceTest, AChosenCheckpointDirIsAnotherOwnersOnlyWhenResumed) {
  const RankWorkspace ws = Workspace();
  v1::JobSpec spec;
  spec.mutable_checkpoint()->set_dir("shared/ck");  // Relative: against base_dir.
  AttemptPaths p = ws.ResolvePaths(spec, AttemptClaim{"a-1", "alice", ""});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.checkpoint_dir, fs::canonical(base_ + "/shared/ck").string());
  EXPECT_EQ(p.checkpoint_dir_named, base_ + "/shared/ck");
  p = ws.ResolvePaths(spec, AttemptClaim{"b-1", "bob", ""});
  EXPECT_THAT(p.error, HasSubstr("alice"));
  EXPECT_FALSE(fs::exists(base_ + "/shared/ck/b-1.trainctl-job"));
  p = ws.ResolvePaths(spec, AttemptClaim{"b-2", "bob", "alice"});
  EXPECT_EQ(p.error, "") << "resumes alice's job";
}

TEST_F(RankWorkspaceTest, ARefusedIdentityClaimsNothing) {
  const RankWorkspace ws = Workspace();
  AttemptPaths p = ws.ResolvePaths(
      v1::JobSpec(),
      AttemptClaim{"j-1", "alice", "", absl::FailedPreconditionError("no uid left")});
  EXPECT_EQ(p.error, "no uid left");
  EXPECT_EQ(p.checkpoint_dir, ws.JobDir("j-1") + "/checkpoints");
  EXPECT_FALSE(fs::exists(p.checkpoint_dir)) << "claimed for a job whose identity was refused";
}

TEST_F(RankWorkspaceTest, RefusedPathsAreNamedByField) {
  ASSERT_EQ(::mkdir((base_ + "/roots").c_str(), 0755), 0);
  options_.checkpoint_roots = {fs::canonical(base_ + "/roots").string()};
  options_.data_roots = options_.checkpoint_roots;
  const RankWorkspace ws = Workspace();
  v1::JobSpec ck;
  ck.mutable_checkpoint()->set_dir("/tmp");
  EXPECT_THAT(ws.ResolvePaths(ck, AttemptClaim{"j-1", "alice", ""}).error,
              HasSubstr("checkpoint.dir"));
  v1::JobSpec tb;
  tb.mutable_tensorboard()->set_dir("/tmp");
  EXPECT_THAT(ws.ResolvePaths(tb, AttemptClaim{"j-1", "alice", ""}).error,
              HasSubstr("tensorboard.dir"));

  v1::JobSpec cmd;
  cmd.mutable_command()->add_argv("python3");
  EXPECT_THAT(ws.ResolvePaths(cmd, AttemptClaim{"j-1", "alice", ""}).error,
              HasSubstr("--allow-commands"));
  options_.allow_commands = true;
  cmd.mutable_command()->set_working_dir("/tmp");
  EXPECT_THAT(Workspace().ResolvePaths(cmd, AttemptClaim{"j-1", "alice", ""}).error,
              HasSubstr("command.working_dir"));
  cmd.mutable_command()->set_working_dir(base_ + "/roots/missing");
  EXPECT_THAT(Workspace().ResolvePaths(cmd, AttemptClaim{"j-1", "alice", ""}).error,
              HasSubstr("is not a directory on this worker"));
  cmd.mutable_command()->set_working_dir("roots");
  AttemptPaths ok = Workspace().ResolvePaths(cmd, AttemptClaim{"j-1", "alice", ""});
  EXPECT_EQ(ok.error, "");
  EXPECT_EQ(ok.command_dir, options_.data_roots[0]);
  cmd.mutable_command()->mutable_code()->set_digest("d");
  cmd.mutable_command()->set_working_dir("../up");
  EXPECT_THAT(
      Workspace().ResolvePaths(cmd, AttemptClaim{"j-1", "alice", ""}).error,
      HasSubstr("command.working_dir: '../up' must be a relative path inside the job's code"));
}

TEST_F(RankWorkspaceTest, CodeIsUnpackedIntoTheAttemptAndItsWorkingDirChecked) {
  const std::string src = base_ + "/src";
  fs::create_directories(src + "/pkg");
  std::ofstream(src + "/pkg/train.py") << "print('hi')\n";
  const std::string archive = base_ + "/code.tar";
  ASSERT_TRUE(codepack::PackDirectory(src, archive).ok());
  const RankWorkspace ws = Workspace();
  v1::JobSpec spec;
  spec.mutable_command()->add_argv("python3");
  spec.mutable_command()->set_working_dir("pkg");
  absl::StatusOr<std::string> dir = ws.UnpackCode("j-1", 1, spec, std::nullopt, archive);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, ws.AttemptDir("j-1", 1) + "/code/pkg");
  EXPECT_TRUE(fs::exists(*dir + "/train.py"));
  spec.mutable_command()->set_working_dir("nope");
  absl::Status bad = ws.UnpackCode("j-1", 1, spec, std::nullopt, archive).status();
  EXPECT_TRUE(absl::IsInvalidArgument(bad));
  EXPECT_THAT(std::string(bad.message()), HasSubstr("command.working_dir: 'nope'"));
}

// The disk fails while the checkpoint directory is claimed (common/file_env.h):
// full at the claim's write, EIO at its rename, EACCES at its create. Each
// refuses the attempt naming the directory, the claim file and the errno's
// text, leaves no claim (whole or half) behind, and once the disk is well
// the same workspace claims the directory.
TEST_F(RankWorkspaceTest, ADiskFaultWhileClaimingIsNamedAndLeavesNothingHalfWritten) {
  FaultFileEnv env;
  options_.file_env = &env;
  const RankWorkspace ws = Workspace();
  const std::string ck = fs::canonical(options_.work_dir).string() + "/jobs/j-1/checkpoints";
  struct Case {
    FileOp op;
    int err;
  };
  for (const Case& c :
       {Case{FileOp::kWrite, ENOSPC}, Case{FileOp::kRename, EIO}, Case{FileOp::kOpen, EACCES}}) {
    env.Clear();
    env.Inject({c.op, ck + "/.trainctl-dir", c.err});
    AttemptPaths p = ws.ResolvePaths(v1::JobSpec(), AttemptClaim{"j-1", "alice", ""});
    EXPECT_THAT(p.error, HasSubstr("checkpoint.dir " + ws.JobDir("j-1") + "/checkpoints"))
        << p.error;
    EXPECT_THAT(p.error, HasSubstr(".trainctl-dir")) << p.error;
    EXPECT_THAT(p.error, HasSubstr(std::strerror(c.err))) << p.error;
    for (const auto& e : fs::directory_iterator(ck)) ADD_FAILURE() << "left behind: " << e.path();
  }
  env.Clear();
  AttemptPaths p = ws.ResolvePaths(v1::JobSpec(), AttemptClaim{"j-1", "alice", ""});
  ASSERT_EQ(p.error, "");
  absl::StatusOr<std::optional<DirClaim>> claim = ReadDirClaim(p.checkpoint_dir);
  ASSERT_TRUE(claim.ok() && claim->has_value()) << claim.status();
  EXPECT_EQ((*claim)->owner, "alice");
  EXPECT_TRUE(fs::exists(p.checkpoint_dir + "/j-1.trainctl-job"));
}

// A refused mkdir of a rank's directory and a failed preemption file name
// the path and why; the workspace makes both once the fault is gone.
TEST_F(RankWorkspaceTest, ARefusedDirectoryOrPreemptFileIsNamedAndTheWorkspaceGoesOn) {
  FaultFileEnv env;
  options_.file_env = &env;
  const RankWorkspace ws = Workspace();
  const std::string attempt = fs::canonical(options_.work_dir).string() + "/jobs/j-1/attempt-1";
  env.Inject({FileOp::kMkdir, attempt + "/rank-0", EACCES});
  absl::StatusOr<std::string> dir = ws.MakeRankDirs("j-1", 1, v1::JobSpec(), std::nullopt, 0);
  ASSERT_FALSE(dir.ok());
  EXPECT_THAT(std::string(dir.status().message()), HasSubstr(ws.AttemptDir("j-1", 1) + "/rank-0"));
  EXPECT_THAT(std::string(dir.status().message()), HasSubstr(std::strerror(EACCES)));
  EXPECT_FALSE(fs::exists(ws.AttemptDir("j-1", 1) + "/rank-0"));
  env.Clear();
  env.Inject({FileOp::kOpen, attempt + "/rank-0.preempted", EIO});
  dir = ws.MakeRankDirs("j-1", 1, v1::JobSpec(), std::nullopt, 0);
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::Status pre = ws.MakePreemptFile("j-1", 1, 0);
  EXPECT_THAT(std::string(pre.message()), HasSubstr(ws.PreemptFile("j-1", 1, 0)));
  EXPECT_THAT(std::string(pre.message()), HasSubstr(std::strerror(EIO)));
  EXPECT_FALSE(fs::exists(ws.PreemptFile("j-1", 1, 0)));
  env.Clear();
  EXPECT_TRUE(ws.MakePreemptFile("j-1", 1, 0).ok());
  EXPECT_EQ(env.injected(), 2);
}

// The disk fills, or refuses a file, while the job's code is unpacked: the
// error names the code directory, the file and the errno's text, and no
// half-unpacked code is left for a rank to start in; then it unpacks.
TEST_F(RankWorkspaceTest, ADiskFaultWhileUnpackingCodeLeavesNoHalfUnpackedCode) {
  const std::string src = base_ + "/src";
  fs::create_directories(src + "/pkg");
  std::ofstream(src + "/pkg/a.py") << "print('a')\n";
  std::ofstream(src + "/pkg/train.py") << "print('hi')\n";
  const std::string archive = base_ + "/code.tar";
  ASSERT_TRUE(codepack::PackDirectory(src, archive).ok());
  FaultFileEnv env;
  options_.file_env = &env;
  const RankWorkspace ws = Workspace();
  v1::JobSpec spec;
  spec.mutable_command()->add_argv("python3");
  spec.mutable_command()->set_working_dir("pkg");
  const std::string code = fs::canonical(options_.work_dir).string() + "/jobs/j-1/attempt-1/code";
  struct Case {
    FileOp op;
    int err;
    absl::StatusCode code;
  };
  for (const Case& c : {Case{FileOp::kWrite, ENOSPC, absl::StatusCode::kResourceExhausted},
                        Case{FileOp::kOpen, EACCES, absl::StatusCode::kPermissionDenied},
                        Case{FileOp::kWrite, EIO, absl::StatusCode::kInternal}}) {
    env.Clear();
    // One file of two: the other may be whole by then.
    env.Inject({c.op, code + "/pkg/train.py", c.err});
    absl::Status s = ws.UnpackCode("j-1", 1, spec, std::nullopt, archive).status();
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(ws.AttemptDir("j-1", 1) + "/code")) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("pkg/train.py")) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(std::strerror(c.err))) << s;
    EXPECT_FALSE(fs::exists(ws.AttemptDir("j-1", 1) + "/code")) << "half-unpacked code left behind";
  }
  env.Clear();
  absl::StatusOr<std::string> dir = ws.UnpackCode("j-1", 1, spec, std::nullopt, archive);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE(fs::exists(*dir + "/train.py"));
}

TEST_F(RankWorkspaceTest, AJobChosenDirIsClaimedAsTheRankUser) {
  if (!UseNobody()) GTEST_SKIP() << "switching to the rank user needs root";
  options_.rank_user = nobody_;
  const std::string mine = base_ + "/mine";
  ASSERT_EQ(::mkdir(mine.c_str(), 0755), 0);
  ASSERT_EQ(::chown(mine.c_str(), nobody_.uid, nobody_.gid), 0);
  const RankWorkspace ws = Workspace();
  v1::JobSpec spec;
  spec.mutable_checkpoint()->set_dir(mine + "/run");
  AttemptPaths p =
      ws.ResolvePaths(spec, AttemptClaim{"j-1", "alice", "", std::optional<RunAs>(nobody_)});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(Stat(mine + "/run").st_uid, nobody_.uid);
  EXPECT_EQ(Stat(mine + "/run/.trainctl-dir").st_uid, nobody_.uid)
      << "root writes nothing a job chose";
  // The default directory is the daemon's own: the daemon claims it.
  ASSERT_TRUE(ws.MakeJobDirs("j-2", v1::JobSpec(), nobody_).ok());
  p = ws.ResolvePaths(v1::JobSpec(),
                      AttemptClaim{"j-2", "alice", "", std::optional<RunAs>(nobody_)});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(Stat(p.checkpoint_dir + "/.trainctl-dir").st_uid, ::geteuid());
}

}  // namespace
}  // namespace trainctl::worker
