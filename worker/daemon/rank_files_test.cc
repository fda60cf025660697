#include "worker/daemon/rank_files.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/temp_dir.h"

namespace trainctl::worker {
namespace {

struct stat Stat(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(lstat(path.c_str(), &st), 0) << path;
  return st;
}

// What `script` prints (stdout and stderr) and its exit code, run by
// /bin/sh as `user`.
std::pair<std::string, int> RunAsUser(const RunAs& user, const std::string& script) {
  int fds[2];
  EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", script};
  o.run_as = user;
  o.fds = {{1, fds[1]}, {2, fds[1]}};
  absl::StatusOr<Subprocess> p = Subprocess::Spawn(o);
  close(fds[1]);
  EXPECT_TRUE(p.ok()) << p.status();
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) out.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  return {out, p.ok() ? p->Wait().code : -1};
}

class RankFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "owners and modes of another user need root";
    absl::StatusOr<RunAs> nobody = LookupUser("nobody");
    ASSERT_TRUE(nobody.ok()) << nobody.status();
    nobody_ = *nobody;
    base_ = MakeTempDir("rank_files_test");
    ASSERT_FALSE(base_.empty());
    // The rank user must reach the work dir at all (as it would /var/lib).
    ASSERT_EQ(chmod(base_.c_str(), 0755), 0);
    work_ = base_ + "/work";
    ASSERT_EQ(mkdir(work_.c_str(), 0755), 0);
    std::ofstream(work_ + "/worker.key") << "PRIVATE KEY\n";
    ASSERT_EQ(chmod((work_ + "/worker.key").c_str(), 0644), 0);
  }
  void TearDown() override {
    if (!base_.empty()) std::system(("rm -rf " + base_).c_str());
  }
  RunAs nobody_;
  std::string base_, work_;
};

TEST_F(RankFilesTest, WithoutARankUserTheWorkDirIsTheDaemonsAlone) {
  ASSERT_TRUE(SecureWorkDir(work_, std::nullopt).ok());
  EXPECT_EQ(Stat(work_).st_mode & 07777, 0700u);
  EXPECT_EQ(Stat(work_ + "/worker.key").st_mode & 07777, 0600u);
  EXPECT_EQ(Stat(work_ + "/jobs").st_mode & 07777, 0700u);
  ASSERT_TRUE(MakeRankDir(work_ + "/jobs/j", std::nullopt).ok());
  EXPECT_EQ(Stat(work_ + "/jobs/j").st_uid, 0u);
  EXPECT_EQ(Stat(work_ + "/jobs/j").st_mode & 07777, 0700u);
}

TEST_F(RankFilesTest, TheRankUserReachesItsDirectoriesAndNothingOfTheDaemons) {
  ASSERT_TRUE(SecureWorkDir(work_, nobody_).ok());
  const std::string job = work_ + "/jobs/j1", attempt = job + "/attempt-1";
  ASSERT_TRUE(MakeDaemonDir(job, nobody_).ok());
  ASSERT_TRUE(MakeDaemonDir(attempt, nobody_).ok());
  ASSERT_TRUE(MakeRankDir(attempt + "/rank-0", nobody_).ok());
  ASSERT_TRUE(MakeRankDir(job + "/checkpoints", nobody_).ok());
  std::ofstream(attempt + "/rank-0.conf") << "run.store_secret=abc\n";
  ASSERT_EQ(chmod((attempt + "/rank-0.conf").c_str(), 0600), 0);
  EXPECT_EQ(Stat(work_).st_mode & 07777, 0711u);
  EXPECT_EQ(Stat(work_).st_gid, 0u) << "the work dir keeps its group";
  for (const std::string& d : {work_ + "/jobs", job, attempt}) {
    EXPECT_EQ(Stat(d).st_uid, 0u) << d;
    EXPECT_EQ(Stat(d).st_gid, nobody_.gid) << d;
    EXPECT_EQ(Stat(d).st_mode & 07777, 0710u) << d;
  }
  for (const std::string& d : {attempt + "/rank-0", job + "/checkpoints"}) {
    EXPECT_EQ(Stat(d).st_uid, nobody_.uid) << d;
    EXPECT_EQ(Stat(d).st_mode & 07777, 0700u) << d;
  }
  // Its own directories: it writes there.
  auto [ok_out, ok_code] =
      RunAsUser(nobody_, "cd " + attempt + "/rank-0 && echo x > scratch && echo y > " + job +
                             "/checkpoints/model.pt");
  EXPECT_EQ(ok_code, 0) << ok_out;
  // The daemon's: no reading its key or a rank.conf, no listing, no creating.
  for (const std::string& script :
       {"cat " + work_ + "/worker.key", "cat " + attempt + "/rank-0.conf", "ls " + work_,
        "ls " + work_ + "/jobs", "ls " + attempt, "echo x > " + job + "/planted",
        "ln -s /etc/shadow " + attempt + "/rank-1"}) {
    auto [out, code] = RunAsUser(nobody_, script);
    EXPECT_NE(code, 0) << script;
    EXPECT_NE(out.find("Permission denied"), std::string::npos) << script << ": " << out;
  }
}

TEST_F(RankFilesTest, DirectoriesAreNeverTakenThroughALinkOrFromAnotherOwner) {
  ASSERT_TRUE(SecureWorkDir(work_, nobody_).ok());
  const std::string target = base_ + "/elsewhere";
  ASSERT_EQ(mkdir(target.c_str(), 0700), 0);
  ASSERT_EQ(symlink(target.c_str(), (work_ + "/jobs/linked").c_str()), 0);
  EXPECT_EQ(MakeRankDir(work_ + "/jobs/linked", nobody_).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MakeDaemonDir(work_ + "/jobs/linked", nobody_).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Stat(target).st_uid, 0u) << "the link's target keeps its owner";
  EXPECT_EQ(Stat(target).st_mode & 07777, 0700u);
  // A directory the rank user made is not one the daemon will write in.
  ASSERT_TRUE(MakeRankDir(work_ + "/jobs/theirs", nobody_).ok());
  absl::Status s = MakeDaemonDir(work_ + "/jobs/theirs", nobody_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("owned by uid"), std::string::npos) << s;
}

TEST_F(RankFilesTest, AsRankUserTouchesFilesAsTheRankWouldOnThisThreadOnly) {
  const std::string root_only = base_ + "/root-only";
  ASSERT_EQ(mkdir(root_only.c_str(), 0700), 0);
  const std::string open_dir = base_ + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0777), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0777), 0);
  // Another thread (started before: a new thread copies its creator's
  // credentials) keeps the daemon's identity meanwhile.
  absl::Notification go;
  bool other_thread_may = false;
  std::thread other([&] {
    go.WaitForNotification();
    other_thread_may = mkdir((root_only + "/by-other-thread").c_str(), 0700) == 0;
  });
  {
    AsRankUser as(nobody_);
    EXPECT_TRUE(as.ok());
    EXPECT_NE(mkdir((root_only + "/made").c_str(), 0700), 0);
    EXPECT_EQ(errno, EACCES);
    EXPECT_EQ(mkdir((open_dir + "/made").c_str(), 0700), 0);
    go.Notify();
    other.join();
    EXPECT_TRUE(other_thread_may);
  }
  EXPECT_EQ(Stat(open_dir + "/made").st_uid, nobody_.uid) << "made as the rank user";
  EXPECT_EQ(Stat(open_dir + "/made").st_gid, nobody_.gid);
  // Back to root after the scope.
  EXPECT_EQ(mkdir((root_only + "/after").c_str(), 0700), 0);
  EXPECT_EQ(Stat(root_only + "/after").st_uid, 0u);
  // Without a rank user it changes nothing.
  AsRankUser none(std::nullopt);
  EXPECT_TRUE(none.ok());
  EXPECT_EQ(mkdir((root_only + "/plain").c_str(), 0700), 0);
}

TEST(RankUidsTest, ParsesARangeAndRefusesBadOnesNamingTheFlag) {
  absl::StatusOr<RankUidRange> r = ParseRankUids("61000-61999");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->first, 61000u);
  EXPECT_EQ(r->last, 61999u);
  for (const char* bad :
       {"", "61000", "61000-", "a-b", "0-10", "20-10", "1-2147483648", "1000-70000", "1-2-3"}) {
    absl::StatusOr<RankUidRange> b = ParseRankUids(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(b.status())) << bad;
    EXPECT_THAT(std::string(b.status().message()), ::testing::HasSubstr("--rank-uids")) << bad;
  }
}

TEST(RankUidsTest, IdsOfAnExistingUserOrGroupAreRefused) {
  // root (uid and gid 0) exists everywhere; ids this high are nobody's here.
  absl::Status root = CheckRankUidsUnused({0, 5});
  EXPECT_TRUE(absl::IsFailedPrecondition(root)) << root;
  EXPECT_THAT(std::string(root.message()), ::testing::HasSubstr("has uid 0"));
  EXPECT_TRUE(CheckRankUidsUnused({2147000000, 2147000999}).ok());
}

TEST(RankUidsTest, EachOwnerNumberHasItsOwnIdentityWithTheRankUsersGroups) {
  RunAs rank_user;
  rank_user.uid = 500;
  rank_user.gid = 501;
  rank_user.groups = {501, 44};
  const RankUidRange range{61000, 61009};
  absl::StatusOr<RunAs> one = OwnerIdentity(range, 1, rank_user, "/w/homes");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->uid, 61000u);
  EXPECT_EQ(one->gid, 61000u);
  EXPECT_EQ(one->name, "trainctl-61000");
  EXPECT_EQ(one->home, "/w/homes/61000");
  EXPECT_EQ(one->groups, (std::vector<gid_t>{61000, 501, 44}));
  absl::StatusOr<RunAs> last = OwnerIdentity(range, 10, rank_user, "/w/homes");
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->uid, 61009u);
  absl::Status beyond = OwnerIdentity(range, 11, rank_user, "/w/homes").status();
  EXPECT_TRUE(absl::IsFailedPrecondition(beyond));
  EXPECT_THAT(std::string(beyond.message()), ::testing::HasSubstr("widen the range"));
  absl::Status none = OwnerIdentity(range, 0, rank_user, "/w/homes").status();
  EXPECT_THAT(std::string(none.message()), ::testing::HasSubstr("sent no owner number"));
}

}  // namespace
}  // namespace trainctl::worker
