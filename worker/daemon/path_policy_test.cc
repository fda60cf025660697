#include "worker/daemon/path_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace trainctl::worker {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class PathPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/path_policy_XXXXXX";
    dir_ = fs::canonical(mkdtemp(tmpl)).string();
    fs::create_directories(dir_ + "/data/mnist");
    fs::create_directories(dir_ + "/datasets2");
    std::ofstream(dir_ + "/data/mnist/train.idx") << "x";
    fs::create_symlink("/etc", dir_ + "/data/escape");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(PathPolicyTest, RelativePathsResolveAgainstTheDaemonsDirectory) {
  auto p = ResolveJobPath("data.train.path", "data/mnist/./train.idx", dir_, {}, "--data-root");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, dir_ + "/data/mnist/train.idx");
  // Without roots every path is allowed (resolved all the same).
  p = ResolveJobPath("data.train.path", "/etc/shadow", dir_, {}, "--data-root");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, "/etc/shadow");
}

TEST_F(PathPolicyTest, RootsConfineAfterResolvingDotDotAndSymlinks) {
  auto roots = CanonicalRoots({dir_ + "/data/", dir_ + "/datasets2"}, "--data-root");
  ASSERT_TRUE(roots.ok()) << roots.status();
  EXPECT_TRUE(
      ResolveJobPath("data.train.path", "data/mnist/train.idx", dir_, *roots, "--data-root").ok());
  EXPECT_TRUE(
      ResolveJobPath("data.train.path", dir_ + "/datasets2/new.csv", dir_, *roots, "--data-root")
          .ok());
  for (const std::string& bad :
       {std::string("/etc/shadow"), std::string("data/../../../etc/passwd"),
        std::string("data/escape/passwd"), dir_ + "/datasets", dir_ + "/data2/x"}) {
    auto p = ResolveJobPath("data.train.path", bad, dir_, *roots, "--data-root");
    ASSERT_FALSE(p.ok()) << bad << " -> " << *p;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(p.status().message()), HasSubstr("data.train.path: '" + bad + "'"));
    EXPECT_THAT(std::string(p.status().message()),
                HasSubstr("is outside every --data-root of this worker"));
  }
  EXPECT_FALSE(CanonicalRoots({dir_ + "/nope"}, "--data-root").ok());
}

TEST_F(PathPolicyTest, EveryDataAndModelPathOfARankConfigIsResolved) {
  rankproto::FlatConfig c = {{"data.train.images", "data/mnist/train.idx"},
                             {"data.train.labels", "data/mnist/labels.idx"},
                             {"data.eval.path", "/etc/shadow"},
                             {"model.path", "data/model.pt"},
                             {"data.batch_size", "32"}};
  rankproto::FlatConfig open = c;
  ASSERT_TRUE(ResolveDataPaths(open, dir_, {}).ok());
  EXPECT_EQ(open["data.train.images"], dir_ + "/data/mnist/train.idx");
  EXPECT_EQ(open["model.path"], dir_ + "/data/model.pt");
  EXPECT_EQ(open["data.batch_size"], "32");
  absl::Status s = ResolveDataPaths(c, dir_, {dir_ + "/data"});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("data.eval.path: '/etc/shadow'"));
}

// Without --data-root: the work dir and the system dataset dirs that exist,
// nothing else (a job must not read /etc/shadow or another job's rank.conf
// as its "data").
TEST_F(PathPolicyTest, DefaultRootsAreTheWorkDirAndTheSystemDatasets) {
  std::vector<std::string> roots = DefaultDataRoots(dir_ + "/data/../data");
  ASSERT_FALSE(roots.empty());
  EXPECT_EQ(roots[0], dir_ + "/data");
  const bool system = fs::is_directory("/usr/share/datasets");
  EXPECT_EQ(roots.size(), system ? 2u : 1u);
  if (system) {
    EXPECT_EQ(roots[1], fs::canonical("/usr/share/datasets").string());
  }
  rankproto::FlatConfig ok = {{"data.train.path", "data/mnist/train.idx"}};
  ASSERT_TRUE(ResolveDataPaths(ok, dir_, roots, kDefaultDataRootsName).ok());
  for (const std::string& bad :
       {std::string("/etc/shadow"), dir_ + "/other/x.csv", std::string("data/escape/passwd")}) {
    rankproto::FlatConfig c = {{"data.train.path", bad}};
    absl::Status s = ResolveDataPaths(c, dir_, roots, kDefaultDataRootsName);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << bad;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("is outside every data root (without --data-root: the work dir"));
  }
}

}  // namespace
}  // namespace trainctl::worker
