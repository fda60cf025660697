#include "common/codepack/code_pack.h"

#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl::codepack {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

void WriteFile(const std::string& path, const std::string& contents, mode_t mode = 0644) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << contents;
  ASSERT_EQ(chmod(path.c_str(), mode), 0) << path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The names `tar tf` (GNU tar) lists, in archive order.
std::vector<std::string> TarList(const std::string& archive) {
  std::string out;
  FILE* p = popen(absl::StrCat("tar tf '", archive, "' 2>&1").c_str(), "r");
  if (p == nullptr) return {"popen failed"};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0) return {absl::StrCat("tar failed: ", out)};
  return absl::StrSplit(out, '\n', absl::SkipEmpty());
}

class CodePackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = MakeTempDir("code_pack_test");
    ASSERT_FALSE(tmp_.empty());
    src_ = tmp_ + "/src";
    fs::create_directories(src_);
  }
  void TearDown() override { fs::remove_all(tmp_); }

  // Packs src_ and returns the names in the archive.
  std::vector<std::string> PackedNames(const PackOptions& options = {}) {
    absl::StatusOr<PackedCode> packed = PackDirectory(src_, tmp_ + "/code.tar", options);
    if (!packed.ok()) return {packed.status().ToString()};
    return TarList(tmp_ + "/code.tar");
  }

  std::string tmp_;
  std::string src_;
};

TEST_F(CodePackTest, RoundTripKeepsTreeModesEmptyFilesAndDirectories) {
  WriteFile(src_ + "/train.py", "print('hi')\n");
  WriteFile(src_ + "/run.sh", "#!/bin/sh\necho run\n", 0755);
  WriteFile(src_ + "/pkg/sub/deep.txt", std::string(5000, 'x'));
  WriteFile(src_ + "/pkg/empty", "");
  fs::create_directories(src_ + "/pkg/nothing");
  absl::StatusOr<PackedCode> packed = PackDirectory(src_, tmp_ + "/code.tar");
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(packed->files, 4);
  EXPECT_EQ(packed->size_bytes, static_cast<int64_t>(fs::file_size(tmp_ + "/code.tar")));
  EXPECT_EQ(packed->size_bytes % 512, 0);
  absl::StatusOr<std::string> digest = FileDigest(tmp_ + "/code.tar");
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(packed->digest, *digest);
  EXPECT_EQ(packed->digest.size(), 7u + 64u);

  // GNU tar reads it: sorted names, directories with their '/'.
  EXPECT_THAT(TarList(tmp_ + "/code.tar"),
              ElementsAre("pkg/", "pkg/empty", "pkg/nothing/", "pkg/sub/", "pkg/sub/deep.txt",
                          "run.sh", "train.py"));

  const std::string out = tmp_ + "/out";
  fs::create_directories(out);
  ASSERT_TRUE(UnpackArchive(tmp_ + "/code.tar", out).ok());
  EXPECT_EQ(ReadFile(out + "/train.py"), "print('hi')\n");
  EXPECT_EQ(ReadFile(out + "/pkg/sub/deep.txt"), std::string(5000, 'x'));
  EXPECT_TRUE(fs::is_regular_file(out + "/pkg/empty"));
  EXPECT_EQ(fs::file_size(out + "/pkg/empty"), 0u);
  EXPECT_TRUE(fs::is_directory(out + "/pkg/nothing"));
  struct stat st;
  ASSERT_EQ(stat((out + "/run.sh").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  ASSERT_EQ(stat((out + "/train.py").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  ASSERT_EQ(stat((out + "/pkg/nothing").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);

  // Into a directory that is not empty: refused.
  EXPECT_EQ(UnpackArchive(tmp_ + "/code.tar", out).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CodePackTest, SameTreeSameDigestWhateverTheMtimesAndCreationOrder) {
  WriteFile(src_ + "/b.py", "b");
  WriteFile(src_ + "/a/x.py", "x");
  WriteFile(src_ + "/a/y.py", "y");
  absl::StatusOr<PackedCode> first = PackDirectory(src_, tmp_ + "/1.tar");
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<PackedCode> again = PackDirectory(src_, tmp_ + "/2.tar");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(first->digest, again->digest);

  // The same contents made in another order, with other times.
  const std::string other = tmp_ + "/other";
  WriteFile(other + "/a/y.py", "y");
  WriteFile(other + "/a/x.py", "x");
  WriteFile(other + "/b.py", "b");
  struct timeval times[2] = {{1000, 0}, {1000, 0}};
  ASSERT_EQ(utimes((other + "/b.py").c_str(), times), 0);
  ASSERT_EQ(utimes((other + "/a").c_str(), times), 0);
  absl::StatusOr<PackedCode> moved = PackDirectory(other, tmp_ + "/3.tar");
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->digest, first->digest);

  // A changed byte is another digest.
  WriteFile(other + "/b.py", "c");
  absl::StatusOr<PackedCode> changed = PackDirectory(other, tmp_ + "/4.tar");
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_NE(changed->digest, first->digest);
}

TEST_F(CodePackTest, AlwaysSkipsGitPycacheAndPyc) {
  WriteFile(src_ + "/.git/HEAD", "ref");
  WriteFile(src_ + "/sub/.git", "gitdir: elsewhere");
  WriteFile(src_ + "/__pycache__/m.cpython-311.pyc", "c");
  WriteFile(src_ + "/m.pyc", "c");
  WriteFile(src_ + "/m.py", "m");
  EXPECT_THAT(PackedNames(), ElementsAre("m.py", "sub/"));
}

TEST_F(CodePackTest, GitignoreCommentsNegationAndWildcards) {
  WriteFile(src_ + "/.gitignore",
            "# a comment\n"
            "\n"
            "*.log\n"
            "!keep.log\n"
            "data?.bin\n"
            "ckpt[0-9]\n");
  WriteFile(src_ + "/a.log", "");
  WriteFile(src_ + "/keep.log", "");
  WriteFile(src_ + "/deep/b.log", "");
  WriteFile(src_ + "/data1.bin", "");
  WriteFile(src_ + "/data12.bin", "");
  WriteFile(src_ + "/ckpt3", "");
  WriteFile(src_ + "/ckptx", "");
  WriteFile(src_ + "/# a comment", "");
  EXPECT_THAT(PackedNames(),
              ElementsAre("# a comment", ".gitignore", "ckptx", "data12.bin", "deep/", "keep.log"));
}

TEST_F(CodePackTest, TrailingSlashMatchesDirectoriesOnly) {
  WriteFile(src_ + "/.gitignore", "build/\n");
  WriteFile(src_ + "/build/out.o", "");
  WriteFile(src_ + "/src/build/gen.o", "");  // a name at any depth
  WriteFile(src_ + "/tools/build", "a file named build");
  EXPECT_THAT(PackedNames(), ElementsAre(".gitignore", "src/", "tools/", "tools/build"));
}

TEST_F(CodePackTest, SlashAnchorsToTheIgnoreFilesDirectory) {
  WriteFile(src_ + "/.gitignore", "/top.txt\nconf/local.yaml\n");
  WriteFile(src_ + "/top.txt", "");
  WriteFile(src_ + "/sub/top.txt", "");
  WriteFile(src_ + "/conf/local.yaml", "");
  WriteFile(src_ + "/sub/conf/local.yaml", "");
  EXPECT_THAT(PackedNames(), ElementsAre(".gitignore", "conf/", "sub/", "sub/conf/",
                                         "sub/conf/local.yaml", "sub/top.txt"));
}

TEST_F(CodePackTest, DoubleStarMatchesAnyDepth) {
  WriteFile(src_ + "/.gitignore", "**/cache\nlogs/**\na/**/z.txt\n");
  WriteFile(src_ + "/cache/x", "");
  WriteFile(src_ + "/p/q/cache/x", "");
  WriteFile(src_ + "/logs/1/2.txt", "");
  WriteFile(src_ + "/a/z.txt", "");
  WriteFile(src_ + "/a/b/c/z.txt", "");
  WriteFile(src_ + "/a/b/y.txt", "");
  EXPECT_THAT(PackedNames(), ElementsAre(".gitignore", "a/", "a/b/", "a/b/c/", "a/b/y.txt", "logs/",
                                         "p/", "p/q/"));
}

TEST_F(CodePackTest, NestedIgnoreFilesRuleTheirSubtreeAndTrainctlignoreToo) {
  WriteFile(src_ + "/.trainctlignore", "datasets/\n");
  WriteFile(src_ + "/datasets/big.bin", "");
  WriteFile(src_ + "/sub/.gitignore", "*.tmp\n!keep.tmp\n");
  WriteFile(src_ + "/sub/a.tmp", "");
  WriteFile(src_ + "/sub/keep.tmp", "");
  WriteFile(src_ + "/top.tmp", "");  // above sub/.gitignore: kept
  EXPECT_THAT(PackedNames(),
              ElementsAre(".trainctlignore", "sub/", "sub/.gitignore", "sub/keep.tmp", "top.tmp"));
}

TEST_F(CodePackTest, SymlinkInsideIsPackedAsWhatItNames) {
  WriteFile(src_ + "/real/data.txt", "data");
  ASSERT_EQ(symlink("real/data.txt", (src_ + "/link.txt").c_str()), 0);
  ASSERT_EQ(symlink("real", (src_ + "/linkdir").c_str()), 0);
  EXPECT_THAT(PackedNames(),
              ElementsAre("link.txt", "linkdir/", "linkdir/data.txt", "real/", "real/data.txt"));
  const std::string out = tmp_ + "/out";
  fs::create_directories(out);
  ASSERT_TRUE(UnpackArchive(tmp_ + "/code.tar", out).ok());
  EXPECT_FALSE(fs::is_symlink(out + "/link.txt"));
  EXPECT_EQ(ReadFile(out + "/link.txt"), "data");
  EXPECT_EQ(ReadFile(out + "/linkdir/data.txt"), "data");
}

TEST_F(CodePackTest, SymlinkOutsideIsRefusedNamingLinkAndTarget) {
  WriteFile(tmp_ + "/secret.txt", "s");
  ASSERT_EQ(symlink("../secret.txt", (src_ + "/escape").c_str()), 0);
  absl::StatusOr<PackedCode> packed = PackDirectory(src_, tmp_ + "/code.tar");
  ASSERT_FALSE(packed.ok());
  EXPECT_EQ(packed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(packed.status().message(), HasSubstr(src_ + "/escape -> ../secret.txt"));
  EXPECT_THAT(packed.status().message(), HasSubstr("outside"));
  EXPECT_FALSE(fs::exists(tmp_ + "/code.tar"));

  // Listed in .trainctlignore, it is left out instead.
  WriteFile(src_ + "/.trainctlignore", "escape\n");
  EXPECT_THAT(PackedNames(), ElementsAre(".trainctlignore"));
}

TEST_F(CodePackTest, SymlinkLoopAndDanglingLinkAreRefused) {
  ASSERT_EQ(symlink(".", (src_ + "/self").c_str()), 0);
  absl::StatusOr<PackedCode> loop = PackDirectory(src_, tmp_ + "/code.tar");
  ASSERT_FALSE(loop.ok());
  EXPECT_THAT(loop.status().message(), HasSubstr("loop"));
  fs::remove(src_ + "/self");
  ASSERT_EQ(symlink("missing", (src_ + "/dangling").c_str()), 0);
  absl::StatusOr<PackedCode> dangling = PackDirectory(src_, tmp_ + "/code.tar");
  ASSERT_FALSE(dangling.ok());
  EXPECT_THAT(dangling.status().message(), HasSubstr("dangling -> missing"));
}

TEST_F(CodePackTest, OverTheLimitNamesTheLimitAndTheBiggestFiles) {
  WriteFile(src_ + "/small.txt", std::string(10, 's'));
  WriteFile(src_ + "/a.bin", std::string(3000, 'a'));
  WriteFile(src_ + "/b/c.bin", std::string(5000, 'c'));
  WriteFile(src_ + "/d.bin", std::string(4000, 'd'));
  PackOptions options;
  options.max_bytes = 4096;
  absl::StatusOr<PackedCode> packed = PackDirectory(src_, tmp_ + "/code.tar", options);
  ASSERT_FALSE(packed.ok());
  EXPECT_EQ(packed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(packed.status().message(), HasSubstr("limit of 4 KiB"));
  EXPECT_THAT(packed.status().message(),
              HasSubstr("b/c.bin (4.9 KiB), d.bin (3.9 KiB), a.bin (2.9 KiB)"));
  EXPECT_THAT(packed.status().message(), ::testing::Not(HasSubstr("small.txt")));
  EXPECT_FALSE(fs::exists(tmp_ + "/code.tar"));
}

TEST_F(CodePackTest, LongNamesUseThePrefixAndTooLongIsRefused) {
  const std::string dir = std::string(60, 'p') + "/" + std::string(60, 'q');
  const std::string name(90, 'n');
  WriteFile(src_ + "/" + dir + "/" + name, "long");
  EXPECT_THAT(PackedNames(), ElementsAre(std::string(60, 'p') + "/", dir + "/", dir + "/" + name));
  const std::string out = tmp_ + "/out";
  fs::create_directories(out);
  ASSERT_TRUE(UnpackArchive(tmp_ + "/code.tar", out).ok());
  EXPECT_EQ(ReadFile(out + "/" + dir + "/" + name), "long");

  const std::string too_long =
      std::string(90, 'e') + "/" + std::string(90, 'f') + "/" + std::string(90, 'g');
  WriteFile(src_ + "/" + too_long, "x");
  absl::StatusOr<PackedCode> packed = PackDirectory(src_, tmp_ + "/code2.tar");
  ASSERT_FALSE(packed.ok());
  EXPECT_THAT(packed.status().message(), HasSubstr(too_long + ": the path is too long"));
}

TEST_F(CodePackTest, NotADirectoryIsInvalidArgument) {
  WriteFile(tmp_ + "/file", "");
  EXPECT_EQ(PackDirectory(tmp_ + "/file", tmp_ + "/code.tar").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PackDirectory(tmp_ + "/missing", tmp_ + "/code.tar").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// --- hostile archives ----------------------------------------------------------------

// One ustar header block, checksummed (unless `bad_checksum`).
std::string HostileHeader(const std::string& name, char type, size_t size,
                          bool bad_checksum = false) {
  std::string h(512, '\0');
  std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(h.data() + 100, 8, "%07o", 0644);
  std::snprintf(h.data() + 108, 8, "%07o", 0);
  std::snprintf(h.data() + 116, 8, "%07o", 0);
  std::snprintf(h.data() + 124, 12, "%011zo", size);
  std::snprintf(h.data() + 136, 12, "%011o", 0);
  h[156] = type;
  if (type == '2') std::memcpy(h.data() + 157, "/etc/passwd", 11);
  std::memcpy(h.data() + 257, "ustar", 6);
  std::memcpy(h.data() + 263, "00", 2);
  unsigned sum = 0;
  for (size_t i = 0; i < 512; ++i)
    sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(h[i]);
  if (bad_checksum) ++sum;
  std::snprintf(h.data() + 148, 8, "%06o", sum);
  h[155] = ' ';
  return h;
}

std::string Data(const std::string& bytes) {
  std::string d = bytes;
  d.resize((bytes.size() + 511) / 512 * 512, '\0');
  return d;
}

const std::string kEnd(1024, '\0');

class HostileArchiveTest : public CodePackTest {
 protected:
  absl::Status Unpack(const std::string& archive) {
    std::ofstream(tmp_ + "/hostile.tar", std::ios::binary) << archive;
    fs::create_directories(tmp_ + "/out");
    return UnpackArchive(tmp_ + "/hostile.tar", tmp_ + "/out");
  }
};

TEST_F(HostileArchiveTest, AbsoluteNameIsRefused) {
  absl::Status s = Unpack(HostileHeader(tmp_ + "/planted", '0', 3) + Data("bad") + kEnd);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("an absolute name"));
  EXPECT_THAT(s.message(), HasSubstr(tmp_ + "/planted"));
  EXPECT_FALSE(fs::exists(tmp_ + "/planted"));
}

TEST_F(HostileArchiveTest, DotDotIsRefused) {
  absl::Status s = Unpack(HostileHeader("ok/../../x", '0', 3) + Data("bad") + kEnd);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("\"ok/../../x\": a '..' component"));
  EXPECT_FALSE(fs::exists(tmp_ + "/x"));
  s = UnpackArchive(tmp_ + "/hostile.tar", tmp_ + "/out");  // nothing was written: still empty
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
}

TEST_F(HostileArchiveTest, SymlinkAndHardLinkEntriesAreRefused) {
  absl::Status s = Unpack(HostileHeader("innocent", '2', 0) + kEnd);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("\"innocent\": type '2' is a symlink"));
  EXPECT_FALSE(fs::exists(tmp_ + "/out/innocent"));
  fs::remove_all(tmp_ + "/out");
  s = Unpack(HostileHeader("hard", '1', 0) + kEnd);
  EXPECT_THAT(s.message(), HasSubstr("\"hard\": type '1' is a hard link"));
}

TEST_F(HostileArchiveTest, BadChecksumIsRefused) {
  absl::Status s = Unpack(HostileHeader("a.txt", '0', 1, /*bad_checksum=*/true) + Data("a") + kEnd);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("\"a.txt\": header 1: bad checksum"));
}

TEST_F(HostileArchiveTest, TruncatedArchivesAreRefused) {
  // Inside the data.
  absl::Status s = Unpack(HostileHeader("a.txt", '0', 2000) + std::string(600, 'a'));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("\"a.txt\": truncated"));
  // Inside a header.
  fs::remove_all(tmp_ + "/out");
  s = Unpack(HostileHeader("a.txt", '0', 1) + Data("a") + std::string(100, 'x'));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("truncated"));
  // Without its end marker.
  fs::remove_all(tmp_ + "/out");
  s = Unpack(HostileHeader("a.txt", '0', 1) + Data("a"));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("truncated"));
}

TEST_F(HostileArchiveTest, DuplicateNamesAndOversizeAreRefused) {
  absl::Status s = Unpack(HostileHeader("a", '0', 1) + Data("a") + HostileHeader("a", '0', 1) +
                          Data("b") + kEnd);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("a second entry"));
  fs::remove_all(tmp_ + "/out");
  std::ofstream(tmp_ + "/big.tar", std::ios::binary)
      << HostileHeader("big", '0', 5000) << Data(std::string(5000, 'b')) << kEnd;
  fs::create_directories(tmp_ + "/out");
  UnpackOptions options;
  options.max_bytes = 4096;
  s = UnpackArchive(tmp_ + "/big.tar", tmp_ + "/out", options);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("\"big\": the files would be over the limit of 4 KiB"));
}

TEST_F(HostileArchiveTest, GnuTarArchiveOfPlainFilesUnpacks) {
  // Real tar's own output (ustar format) is accepted: the format is the standard one.
  WriteFile(src_ + "/d/f.txt", "from tar");
  ASSERT_EQ(
      std::system(
          absl::StrCat("tar --format=ustar -C '", src_, "' -cf '", tmp_, "/gnu.tar' d").c_str()),
      0);
  fs::create_directories(tmp_ + "/out");
  absl::Status s = UnpackArchive(tmp_ + "/gnu.tar", tmp_ + "/out");
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(ReadFile(tmp_ + "/out/d/f.txt"), "from tar");
}

TEST(FileDigestTest, KnownValue) {
  const std::string dir = MakeTempDir("file_digest_test");
  std::ofstream(dir + "/abc", std::ios::binary) << "abc";
  absl::StatusOr<std::string> d = FileDigest(dir + "/abc");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(FileDigest(dir + "/missing").status().code(), absl::StatusCode::kNotFound);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace trainctl::codepack
