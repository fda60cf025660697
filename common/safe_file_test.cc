#include "common/safe_file.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/temp_dir.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode;
}

// Names in `dir` (links included), sorted.
std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

SafeWriteOptions KeepExisting() {
  SafeWriteOptions o;
  o.replace = false;
  return o;
}

class SafeFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    old_umask_ = ::umask(022);
    dir_ = MakeTempDir("safe_file_test");
    ASSERT_FALSE(dir_.empty());
    // The file an attacker wants overwritten, outside the directory.
    outside_ = MakeTempDir("safe_file_victim");
    victim_ = outside_ + "/victim";
    std::ofstream(victim_) << "precious";
  }
  void TearDown() override {
    ::umask(old_umask_);
    std::error_code ec;
    fs::remove_all(dir_, ec);
    fs::remove_all(outside_, ec);
  }
  mode_t old_umask_ = 0;
  std::string dir_, outside_, victim_;
};

TEST_F(SafeFileTest, WritesAtomicallyWithTheRequestedModeAndLeavesNoTemporaryFile) {
  const std::string path = dir_ + "/token";
  ASSERT_TRUE(WriteFileSafely(path, "secret\n", PrivateFile()).ok());
  EXPECT_EQ(Slurp(path), "secret\n");
  EXPECT_EQ(ModeOf(path) & 0777, 0600u);
  // Replaced in place; the default mode is what the umask allows.
  ASSERT_TRUE(WriteFileSafely(dir_ + "/plain", "a").ok());
  EXPECT_EQ(ModeOf(dir_ + "/plain") & 0777, 0644u);
  ASSERT_TRUE(WriteFileSafely(path, "second\n", PrivateFile()).ok());
  EXPECT_EQ(Slurp(path), "second\n");
  EXPECT_EQ(Names(dir_), (std::vector<std::string>{"plain", "token"}));
}

TEST_F(SafeFileTest, WritingAtAnOpenDirectoryNeverFollowsALinkAndKeepsWhatExistsWhenAsked) {
  const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dfd, 0);
  ASSERT_EQ(::symlink(victim_.c_str(), (dir_ + "/claim").c_str()), 0);
  // Not replacing: the planted link holds the name; nothing is written through it.
  absl::Status kept =
      WriteFileSafelyAt(dfd, "claim", "owner: mallory\n", PrivateFile(/*replace=*/false));
  EXPECT_EQ(kept.code(), absl::StatusCode::kAlreadyExists) << kept;
  EXPECT_EQ(Slurp(victim_), "precious");
  // Replacing: the link itself is replaced by a 0600 file.
  ASSERT_TRUE(WriteFileSafelyAt(dfd, "claim", "owner: ann\n", PrivateFile()).ok());
  EXPECT_FALSE(fs::is_symlink(dir_ + "/claim"));
  EXPECT_EQ(Slurp(dir_ + "/claim"), "owner: ann\n");
  EXPECT_EQ(ModeOf(dir_ + "/claim") & 0777, 0600u);
  EXPECT_EQ(Slurp(victim_), "precious");
  EXPECT_EQ(WriteFileSafelyAt(dfd, "../escape", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Names(dir_), std::vector<std::string>{"claim"});
  ::close(dfd);
}

// The fault seam (SafeWriteOptions::env, a FaultFileEnv): a full disk
// partway through, an EIO at the rename or the fsync, a refused create --
// without root or a special file system. Each fails with the errno's class,
// keeps the file that was there, and leaves no temporary file.
TEST_F(SafeFileTest, InjectedFaultsFailLikeTheSystemCallAndKeepTheOldFile) {
  const std::string path = fs::canonical(dir_).string() + "/ckpt";
  ASSERT_TRUE(WriteFileSafely(path, "old").ok());
  struct Case {
    FileOp op;
    int nth;
    int err;
    absl::StatusCode code;
  };
  // The write fails at the second write: a disk that fills partway through
  // the stream.
  for (const Case& c : {Case{FileOp::kWrite, 2, ENOSPC, absl::StatusCode::kResourceExhausted},
                        Case{FileOp::kFsync, 0, EIO, absl::StatusCode::kInternal},
                        Case{FileOp::kRename, 0, EIO, absl::StatusCode::kInternal},
                        Case{FileOp::kOpen, 0, EACCES, absl::StatusCode::kPermissionDenied}}) {
    FaultFileEnv env;
    env.Inject({c.op, path, c.err, c.nth});
    SafeWriteOptions options;
    options.env = &env;
    absl::Status s;
    {
      absl::StatusOr<std::unique_ptr<SafeFileWriter>> w = SafeFileWriter::Create(path, options);
      s = w.status();
      if (w.ok()) {
        s = (*w)->Append("new");
        if (s.ok()) s = (*w)->Append("er and longer");
        if (s.ok()) s = (*w)->Commit();
      }
    }  // a writer that failed before Commit removes its temporary file here
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_EQ(SafeFileErrno(s), c.err) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(path));
    EXPECT_EQ(Slurp(path), "old") << "the old file stays when the new one fails";
    EXPECT_EQ(Names(dir_), std::vector<std::string>{"ckpt"}) << "no temporary file";
    EXPECT_EQ(env.injected(), 1);
  }
  // Without a fault, the same write goes through.
  ASSERT_TRUE(WriteFileSafely(path, "newer").ok());
  EXPECT_EQ(Slurp(path), "newer");
}

TEST_F(SafeFileTest, AStreamWriterCommitsAndAnAbandonedOneLeavesNothing) {
  const std::string path = dir_ + "/model.pt";
  {
    auto w = SafeFileWriter::Create(path);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_THAT((*w)->temp_path(), HasSubstr(dir_ + "/model.pt.tmp."));
    std::string big(300000, 'x');  // more than the stream's buffer
    (*w)->stream() << "head:" << big;
    ASSERT_TRUE((*w)->Append(":tail").ok());
    ASSERT_TRUE((*w)->Commit().ok());
    EXPECT_EQ(Slurp(path), "head:" + big + ":tail");
    EXPECT_FALSE((*w)->Commit().ok());  // once only
  }
  {
    auto w = SafeFileWriter::Create(path);
    ASSERT_TRUE(w.ok());
    (*w)->stream() << "never committed";
  }
  EXPECT_EQ(Names(dir_), std::vector<std::string>{"model.pt"});
  EXPECT_EQ(Slurp(path).substr(0, 5), "head:");
}

// A link planted at the final name is replaced, never written through.
TEST_F(SafeFileTest, ALinkAtTheFinalNameLeavesItsTargetUnchanged) {
  const std::string path = dir_ + "/model.pt";
  ASSERT_EQ(::symlink(victim_.c_str(), path.c_str()), 0);
  ASSERT_TRUE(WriteFileSafely(path, "new model").ok());
  EXPECT_EQ(Slurp(victim_), "precious");
  EXPECT_TRUE(S_ISREG(ModeOf(path)));
  EXPECT_EQ(Slurp(path), "new model");
}

// Links at every temporary name the old writers used (and that a job could
// predict) are neither followed nor removed: the writer's own name is random
// and created with O_EXCL|O_NOFOLLOW.
TEST_F(SafeFileTest, LinksAtPredictableTemporaryNamesLeaveTheirTargetsUnchanged) {
  const std::string path = dir_ + "/model.pt";
  for (const std::string& tmp :
       {path + ".tmp", absl::StrCat(path, ".tmp.", ::getpid()), path + ".part"}) {
    ASSERT_EQ(::symlink(victim_.c_str(), tmp.c_str()), 0);
  }
  ASSERT_TRUE(WriteFileSafely(path, "new model").ok());
  EXPECT_EQ(Slurp(victim_), "precious");
  EXPECT_EQ(Slurp(path), "new model");
  EXPECT_EQ(Names(dir_).size(), 4u);  // the three links and the model
}

TEST_F(SafeFileTest, NoReplaceRefusesAnExistingFileOrLinkAndLeavesItAlone) {
  const std::string path = dir_ + "/.bashrc";
  std::ofstream(path) << "mine";
  absl::Status s = WriteFileSafely(path, "theirs", KeepExisting());
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_EQ(SafeFileErrno(s), EEXIST);
  EXPECT_EQ(Slurp(path), "mine");
  const std::string link = dir_ + "/link";
  ASSERT_EQ(::symlink(victim_.c_str(), link.c_str()), 0);
  EXPECT_EQ(WriteFileSafely(link, "theirs", KeepExisting()).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Slurp(victim_), "precious");
  EXPECT_EQ(Names(dir_), (std::vector<std::string>{".bashrc", "link"}));
  // A free name is written.
  ASSERT_TRUE(WriteFileSafely(dir_ + "/new", "x", KeepExisting()).ok());
  EXPECT_EQ(Slurp(dir_ + "/new"), "x");
}

TEST_F(SafeFileTest, AProbeNeverFollowsALinkAtItsNameAndCleansUp) {
  const std::string probe = dir_ + "/.trainctl-preflight-123";
  ASSERT_EQ(::symlink(victim_.c_str(), probe.c_str()), 0);
  ASSERT_TRUE(ProbeWritableDir(dir_, ".trainctl-preflight-123", "preflight").ok());
  EXPECT_EQ(Slurp(victim_), "precious");
  EXPECT_EQ(Names(dir_),
            std::vector<std::string>{".trainctl-preflight-123"});  // the link, untouched
  ASSERT_TRUE(ProbeWritableDir(outside_, ".probe").ok());
  EXPECT_EQ(Names(outside_), std::vector<std::string>{"victim"});
}

TEST_F(SafeFileTest, AWalkMakesMissingDirectoriesAndNeverFollowsALinkAtAnyDepth) {
  absl::StatusOr<int> fd = OpenOrMakeDirNoFollow(dir_ + "/a/b/./c", 0700);
  ASSERT_TRUE(fd.ok()) << fd.status();
  struct stat st {};
  ASSERT_EQ(::fstat(*fd, &st), 0);
  ::close(*fd);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(ModeOf(dir_ + "/a/b/c") & 0777, 0700);
  fd = OpenOrMakeDirNoFollow(dir_ + "/a/b/c");  // an existing directory opens
  ASSERT_TRUE(fd.ok()) << fd.status();
  ::close(*fd);
  // A link at the first, a middle and the last component: refused there,
  // nothing made where it points.
  ASSERT_EQ(::symlink(outside_.c_str(), (dir_ + "/link").c_str()), 0);
  ASSERT_EQ(::symlink(outside_.c_str(), (dir_ + "/a/b/link").c_str()), 0);
  for (const std::string p : {dir_ + "/link", dir_ + "/link/x/y", dir_ + "/a/b/link/x"}) {
    fd = OpenOrMakeDirNoFollow(p);
    ASSERT_FALSE(fd.ok()) << p;
    EXPECT_EQ(SafeFileErrno(fd.status()), ELOOP) << p;
    EXPECT_THAT(fd.status().message(), HasSubstr("symbolic link")) << p;
  }
  EXPECT_EQ(Names(outside_), std::vector<std::string>{"victim"});
  fd = OpenOrMakeDirNoFollow(victim_ + "/x");
  EXPECT_EQ(SafeFileErrno(fd.status()), ENOTDIR);
  fd = OpenOrMakeDirNoFollow(dir_ + "/a/../a");
  EXPECT_EQ(SafeFileErrno(fd.status()), EINVAL);
}

TEST_F(SafeFileTest, AMissingDirectoryIsNotFoundNamingThePath) {
  absl::Status s = WriteFileSafely(dir_ + "/no/such/file", "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr(dir_ + "/no/such/file"));
  EXPECT_EQ(SafeFileErrno(s), ENOENT);
  EXPECT_EQ(ProbeWritableDir(dir_ + "/no", "p").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(WriteFileSafely(dir_ + "/", "x").code(), absl::StatusCode::kInvalidArgument);
}

// Mounts a tmpfs on `dir` with `options`; false when this host cannot (not root).
bool MountTmpfs(const std::string& dir, const std::string& options) {
  return ::mount("tmpfs", dir.c_str(), "tmpfs", options == "ro" ? MS_RDONLY : 0,
                 options == "ro" ? nullptr : options.c_str()) == 0;
}

TEST_F(SafeFileTest, DiskFullIsResourceExhaustedAndLeavesNoTemporaryFile) {
  const std::string small = dir_ + "/small";
  fs::create_directory(small);
  if (!MountTmpfs(small, "size=8k")) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  absl::Status s = WriteFileSafely(small + "/ckpt.pt", std::string(64 * 1024, 'x'));
  std::vector<std::string> left = Names(small);
  ::umount(small.c_str());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(SafeFileErrno(s), ENOSPC);
  EXPECT_THAT(s.message(), HasSubstr(small + "/ckpt.pt"));
  EXPECT_THAT(s.message(), HasSubstr(std::strerror(ENOSPC)));
  EXPECT_TRUE(left.empty()) << left[0];
}

TEST_F(SafeFileTest, AnUnwritableDirectoryIsPermissionDenied) {
  const std::string ro = dir_ + "/ro";
  fs::create_directory(ro);
  bool mounted = false;
  if (::geteuid() == 0) {
    // root writes through mode bits: a read-only filesystem instead.
    if (!MountTmpfs(ro, "ro")) GTEST_SKIP() << "cannot mount a read-only tmpfs here";
    mounted = true;
  } else {
    ::chmod(ro.c_str(), 0500);
  }
  absl::Status s = WriteFileSafely(ro + "/f", "x");
  absl::Status probe = ProbeWritableDir(ro, ".probe");
  if (mounted) ::umount(ro.c_str());
  ::chmod(ro.c_str(), 0700);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr(ro + "/f"));
  EXPECT_NE(SafeFileErrno(s), 0);
  EXPECT_EQ(probe.code(), absl::StatusCode::kPermissionDenied) << probe;
  EXPECT_THAT(probe.message(), HasSubstr(ro));
}

}  // namespace
}  // namespace trainctl
