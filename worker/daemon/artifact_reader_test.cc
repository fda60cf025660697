// ReadArtifactChunk and the checkpoint directory manifests on real files:
// bounded pieces that cover the file, the zlib CRC-32 the trainer records,
// and every refusal of a file that is not the record's job's (another
// name, a symlink, a hard link, no manifest, another job's manifest).
#include "worker/daemon/artifact_reader.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/temp_dir.h"
#include "worker/daemon/job_dir.h"

namespace trainctl::worker {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// A scratch directory, removed with everything in it when the test ends.
class TestDir : public ScopedTempDir {
 public:
  TestDir() : ScopedTempDir("artifact_reader_test") {}
  // Its canonical path (the checks compare resolved paths).
  std::string Path() const { return fs::canonical(path()).string(); }
};

v1::ReadFile Req(const std::string& path, int64_t offset, int32_t max, bool checksum = false,
                 const std::string& job = "j-1") {
  v1::ReadFile r;
  r.set_request_id(7);
  r.set_path(path);
  r.set_offset(offset);
  r.set_max_bytes(max);
  r.set_want_checksum(checksum);
  r.set_job_id(job);
  return r;
}

TEST(ArtifactReaderTest, PiecesCoverTheFileAndTheChecksumIsZlibs) {
  TestDir tmp;
  const std::string dir = tmp.Path() + "/ck";
  ASSERT_TRUE(ClaimCheckpointDir(dir, "j-1", "alice", "").ok());
  const std::string path = dir + "/j-1.model.pt";
  std::string content;
  for (int i = 0; i < 3000; ++i) content += static_cast<char>(i * 31 % 251);
  std::ofstream(path, std::ios::binary) << content;

  std::string got;
  int pieces = 0;
  for (int64_t off = 0; off < static_cast<int64_t>(content.size()); ++pieces) {
    v1::FileChunk c = ReadArtifactChunk(Req(path, off, 1000, off == 0));
    ASSERT_EQ(c.error(), "");
    EXPECT_EQ(c.request_id(), 7);
    EXPECT_EQ(c.offset(), off);
    EXPECT_EQ(c.size(), 3000);
    EXPECT_LE(c.data().size(), 1000u);
    if (off == 0) {
      uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(content.data()), content.size());
      EXPECT_EQ(c.checksum(), absl::StrFormat("crc32:%08x", static_cast<uint32_t>(crc)));
    } else {
      EXPECT_EQ(c.checksum(), "") << "only when asked";
    }
    got += c.data();
    off += static_cast<int64_t>(c.data().size());
  }
  EXPECT_EQ(got, content);
  EXPECT_EQ(pieces, 3);
  // Never more than the cap, whatever is asked.
  EXPECT_LE(ReadArtifactChunk(Req(path, 0, 1 << 30)).data().size(),
            static_cast<size_t>(kMaxFileChunkBytes));
  EXPECT_THAT(ReadArtifactChunk(Req(path, 3001, 10)).error(), HasSubstr("offset"));
}

TEST(ArtifactReaderTest, ServesOnlyTheRecordsJobsFilesInItsOwnDirectory) {
  TestDir tmp;
  const std::string root = tmp.Path();
  const std::string dir = root + "/ck";
  ASSERT_TRUE(ClaimCheckpointDir(dir, "j-1", "alice", "").ok());
  std::ofstream(root + "/worker.key") << "KEY";
  std::ofstream(dir + "/j-1.ckpt-epoch-000001.pt") << "ck";
  EXPECT_EQ(ReadArtifactChunk(Req(dir + "/j-1.ckpt-epoch-000001.pt", 0, 10)).data(), "ck");

  // The fd-3 trick: the key by its own name, or through "..".
  EXPECT_THAT(ReadArtifactChunk(Req(root + "/worker.key", 0, 10)).error(),
              HasSubstr("not a checkpoint or final model of job j-1"));
  EXPECT_THAT(ReadArtifactChunk(Req(dir + "/../worker.key", 0, 10)).error(),
              HasSubstr("not a checkpoint"));
  // A job-named symlink or hard link to the key.
  fs::create_symlink(root + "/worker.key", dir + "/j-1.ckpt-epoch-000002.pt");
  EXPECT_THAT(ReadArtifactChunk(Req(dir + "/j-1.ckpt-epoch-000002.pt", 0, 10)).error(),
              HasSubstr("symbolic link"));
  fs::create_hard_link(root + "/worker.key", dir + "/j-1.ckpt-epoch-000003.pt");
  EXPECT_THAT(ReadArtifactChunk(Req(dir + "/j-1.ckpt-epoch-000003.pt", 0, 10)).error(),
              HasSubstr("2 links"));
  // A job-named file in a directory no daemon prepared for the job.
  std::ofstream(root + "/j-1.model.pt") << "m";
  EXPECT_THAT(ReadArtifactChunk(Req(root + "/j-1.model.pt", 0, 10)).error(),
              HasSubstr("no manifest of job j-1"));
  // Another job's record cannot point into j-1's directory; a link to j-1's
  // own directory finds the same manifest.
  EXPECT_THAT(
      ReadArtifactChunk(Req(dir + "/j-1.ckpt-epoch-000001.pt", 0, 10, false, "j-2")).error(),
      HasSubstr("not a checkpoint or final model of job j-2"));
  std::ofstream(dir + "/j-2.model.pt") << "2";
  EXPECT_THAT(ReadArtifactChunk(Req(dir + "/j-2.model.pt", 0, 10, false, "j-2")).error(),
              HasSubstr("no manifest of job j-2"));
  fs::create_directory_symlink(dir, root + "/ck-link");
  EXPECT_EQ(ReadArtifactChunk(Req(root + "/ck-link/j-1.ckpt-epoch-000001.pt", 0, 10)).data(), "ck");
  // A forged manifest must be a regular file naming the job.
  fs::create_directories(root + "/forged");
  std::ofstream(root + "/forged/j-1.trainctl-job") << "trainctl job 1\njob j-9\n";
  std::ofstream(root + "/forged/j-1.model.pt") << "m";
  EXPECT_THAT(ReadArtifactChunk(Req(root + "/forged/j-1.model.pt", 0, 10)).error(),
              HasSubstr("does not name job j-1"));

  EXPECT_THAT(ReadArtifactChunk(Req(dir + "/j-1.ckpt-epoch-000009.pt", 0, 10)).error(),
              HasSubstr("No such file"));
  EXPECT_THAT(ReadArtifactChunk(Req("relative", 0, 10)).error(), HasSubstr("absolute"));
  EXPECT_THAT(ReadArtifactChunk(Req(dir + "/j-1.model.pt", 0, 10, false, "")).error(),
              HasSubstr("job_id"));
}

TEST(JobDirTest, TheFirstOwnerClaimsTheDirectoryAndOthersAreRefusedByName) {
  TestDir tmp;
  const std::string dir = tmp.Path() + "/shared";
  ASSERT_TRUE(ClaimCheckpointDir(dir, "a-1", "alice", "").ok());
  ASSERT_TRUE(ClaimCheckpointDir(dir, "a-2", "alice", "").ok())
      << "one owner's jobs share a directory";
  absl::Status s = ClaimCheckpointDir(dir, "b-1", "bob", "");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("belongs to 'alice' (claimed by job a-1)"));
  EXPECT_TRUE(ClaimCheckpointDir(dir, "b-2", "bob", "alice").ok()) << "resuming alice's job";
  absl::StatusOr<std::optional<DirClaim>> claim = ReadDirClaim(dir);
  ASSERT_TRUE(claim.ok() && claim->has_value());
  EXPECT_EQ((*claim)->owner, "alice");
  EXPECT_EQ((*claim)->job_id, "a-1");
  EXPECT_TRUE(fs::exists(dir + "/a-2.trainctl-job"));
  EXPECT_FALSE(fs::exists(dir + "/b-1.trainctl-job")) << "a refused job writes nothing";
  EXPECT_FALSE(ReadDirClaim(dir + "/none")->has_value());
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos)
        << "no temporary file left";
  }
}

TEST(JobDirTest, ManifestsAreNeverWrittenThroughALink) {
  TestDir tmp;
  const std::string root = tmp.Path();
  const std::string dir = root + "/ck";
  fs::create_directories(dir);
  std::ofstream(root + "/victim") << "victim";
  fs::create_symlink(root + "/victim", dir + "/.trainctl-dir");
  EXPECT_FALSE(ClaimCheckpointDir(dir, "j-1", "alice", "").ok()) << "a planted link is not a claim";
  fs::remove(dir + "/.trainctl-dir");
  fs::create_symlink(root + "/victim", dir + "/j-1.trainctl-job");
  ASSERT_TRUE(ClaimCheckpointDir(dir, "j-1", "alice", "").ok());
  std::ifstream in(root + "/victim");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "victim") << "the link was replaced, its target untouched";
  EXPECT_FALSE(fs::is_symlink(dir + "/j-1.trainctl-job"));
  // The directory itself as a link is refused.
  fs::create_directory_symlink(dir, root + "/ck-link");
  EXPECT_FALSE(ClaimCheckpointDir(root + "/ck-link", "j-2", "alice", "").ok());
}

// A checkpoint.dir the job chose is made as the ranks' user (issue 45,
// finding 1): where that user cannot create or write, root creates nothing,
// not through a link either (no link is followed at any depth, even to a
// place that user could write); where it can, the directory and the
// manifests are that user's, and a fetch trusts them only from a uid the
// daemon runs ranks as.
// A directory only root may write in (`root_only_`) and one of the rank
// user's (`mine_`, nobody's), for claims made as that user. Needs root
// (CI's tests run as root).
class RankUserDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "switching to the rank user needs root";
    absl::StatusOr<RunAs> nobody = LookupUser("nobody");
    if (!nobody.ok()) GTEST_SKIP() << nobody.status();
    nobody_ = *nobody;
    const std::string root = tmp_.Path();
    ASSERT_EQ(::chmod(root.c_str(), 0755), 0);
    root_only_ = root + "/root-only";
    mine_ = root + "/mine";
    fs::create_directories(root_only_);
    fs::create_directories(mine_);
    ASSERT_EQ(::chmod(root_only_.c_str(), 0755), 0);
    ASSERT_EQ(::chown(mine_.c_str(), nobody_.uid, nobody_.gid), 0);
  }

  RunAs nobody_;
  TestDir tmp_;
  std::string root_only_, mine_;
};

TEST_F(RankUserDirTest, AJobChosenDirIsMadeAsTheRankUser) {
  fs::create_directory_symlink(root_only_, mine_ + "/planted");
  fs::create_directories(mine_ + "/elsewhere");
  ASSERT_EQ(::chown((mine_ + "/elsewhere").c_str(), nobody_.uid, nobody_.gid), 0);
  fs::create_directory_symlink(mine_ + "/elsewhere", mine_ + "/own-link");

  absl::Status s =
      ClaimCheckpointDir(root_only_ + "/made-by-root/deeper", "j-1", "alice", "", nobody_);
  EXPECT_THAT(s.message(), HasSubstr("cannot be created as the rank user (Permission denied)"));
  s = ClaimCheckpointDir(mine_ + "/planted/deeper", "j-1", "alice", "", nobody_);
  EXPECT_THAT(s.message(), HasSubstr("symbolic link (not followed)"));
  s = ClaimCheckpointDir(mine_ + "/own-link/deeper", "j-1", "alice", "", nobody_);
  EXPECT_THAT(s.message(), HasSubstr("symbolic link (not followed)"));
  EXPECT_TRUE(fs::is_empty(mine_ + "/elsewhere"))
      << "a link is not followed even where the rank user may write";
  s = ClaimCheckpointDir(root_only_, "j-1", "alice", "", nobody_);
  EXPECT_THAT(s.message(), HasSubstr("not writable as the rank user (Permission denied)"));
  EXPECT_FALSE(ClaimCheckpointDir(mine_ + "/planted", "j-1", "alice", "", nobody_).ok())
      << "the directory as a link";
  EXPECT_TRUE(fs::is_empty(root_only_)) << "root made something where the rank user cannot";

  const std::string dir = mine_ + "/run-1";
  ASSERT_TRUE(ClaimCheckpointDir(dir, "j-1", "alice", "", nobody_).ok());
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, nobody_.uid);
  for (const char* name : {"/j-1.trainctl-job", "/.trainctl-dir"}) {
    ASSERT_EQ(::stat((dir + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, nobody_.uid)
        << name << ": root writes nothing in a directory the job chose";
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
  EXPECT_THAT(names, ::testing::UnorderedElementsAre(".trainctl-dir", "j-1.trainctl-job"))
      << "no probe left";

  // Served only where the daemon runs ranks as that uid.
  {
    std::ofstream out(dir + "/j-1.model.pt");
    out << "model";
  }
  ManifestWriters with_nobody;
  with_nobody.rank_user = nobody_.uid;
  EXPECT_EQ(ReadArtifactChunk(Req(dir + "/j-1.model.pt", 0, 10), with_nobody).data(), "model");
  EXPECT_THAT(ReadArtifactChunk(Req(dir + "/j-1.model.pt", 0, 10)).error(),
              HasSubstr("neither this worker's user nor one it runs ranks as"));
  ManifestWriters range;
  range.rank_uids = RankUidRange{nobody_.uid, nobody_.uid};
  EXPECT_EQ(ReadArtifactChunk(Req(dir + "/j-1.model.pt", 0, 10), range).data(), "model");
  // A checkpoint there is dropped as that uid, not as root: where that uid
  // may not delete, it stays.
  const std::string ck = dir + "/j-1.ckpt-epoch-000001.pt";
  { std::ofstream(ck) << "ck"; }
  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  EXPECT_THAT(DropJobCheckpoint(ck, "j-1", with_nobody).message(), HasSubstr("Permission denied"));
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  EXPECT_TRUE(DropJobCheckpoint(ck, "j-1", with_nobody).ok());
  EXPECT_FALSE(fs::exists(ck));
  // Nor does a claim by an untrusted uid bind or free anyone: it is no claim.
  EXPECT_THAT(ClaimCheckpointDir(dir, "j-2", "alice", "").message(), HasSubstr("written by uid"));
  EXPECT_TRUE(ClaimCheckpointDir(dir, "j-2", "alice", "", nobody_, with_nobody).ok());
  EXPECT_FALSE(ClaimCheckpointDir(dir, "b-1", "bob", "", nobody_, with_nobody).ok())
      << "alice's directory";
}

// The race of issue 45, finding 1: while the daemon claims a job's
// directory, the job's own user keeps swapping a component of the path
// between a real directory and a link to a place only root may write.
// Whatever the interleaving, root makes nothing there.
TEST_F(RankUserDirTest, ALinkSwappedInDuringTheClaimLeadsNowhere) {
  const std::string swapped = mine_ + "/ck";
  std::atomic<bool> stop{false};
  std::thread swapper([&] {
    // As the job would: a directory, then a link in its place, and back.
    const std::string link = mine_ + "/.link", real = mine_ + "/.real";
    while (!stop.load()) {
      std::error_code ec;
      fs::remove_all(real, ec);
      fs::create_directory(real, ec);
      ::rename(real.c_str(), swapped.c_str());
      ::unlink(link.c_str());
      (void)::symlink(root_only_.c_str(), link.c_str());
      fs::remove_all(swapped + ".old", ec);
      ::rename(swapped.c_str(), (swapped + ".old").c_str());
      ::rename(link.c_str(), swapped.c_str());
      std::this_thread::yield();
      ::unlink(swapped.c_str());
    }
  });
  int claimed = 0;
  for (int i = 0; i < 300; ++i) {
    claimed +=
        ClaimCheckpointDir(swapped + "/deeper", absl::StrCat("j-", i), "alice", "", nobody_).ok();
    (void)ClaimCheckpointDir(swapped, absl::StrCat("k-", i), "alice", "", nobody_);
  }
  stop = true;
  swapper.join();
  EXPECT_TRUE(fs::is_empty(root_only_)) << "root made something through the swapped link ("
                                        << claimed << " claims went through the real directory)";
}

// DropCheckpoints: the coordinator's deletions meet the rules a fetch meets;
// only the job's checkpoints go, never its final model, a link's target, or
// a file of a directory no daemon prepared for the job.
TEST(ArtifactReaderTest, DropDeletesOnlyTheJobsOwnCheckpoints) {
  TestDir tmp;
  const std::string root = tmp.Path();
  const std::string dir = root + "/ck";
  ASSERT_TRUE(ClaimCheckpointDir(dir, "j-1", "alice", "").ok());
  std::ofstream(root + "/worker.key") << "KEY";
  std::ofstream(dir + "/j-1.ckpt-epoch-000001.w-a.pt") << "ck";
  std::ofstream(dir + "/j-1.model.pt") << "model";
  EXPECT_TRUE(DropJobCheckpoint(dir + "/j-1.ckpt-epoch-000001.w-a.pt", "j-1").ok());
  EXPECT_FALSE(fs::exists(dir + "/j-1.ckpt-epoch-000001.w-a.pt"));
  EXPECT_TRUE(absl::IsNotFound(DropJobCheckpoint(dir + "/j-1.ckpt-epoch-000001.w-a.pt", "j-1")));
  EXPECT_THAT(DropJobCheckpoint(dir + "/j-1.model.pt", "j-1").message(),
              HasSubstr("not a checkpoint of job j-1"));
  EXPECT_TRUE(fs::exists(dir + "/j-1.model.pt"));
  EXPECT_THAT(DropJobCheckpoint(root + "/worker.key", "j-1").message(),
              HasSubstr("not a checkpoint"));
  fs::create_symlink(root + "/worker.key", dir + "/j-1.ckpt-epoch-000002.pt");
  EXPECT_THAT(DropJobCheckpoint(dir + "/j-1.ckpt-epoch-000002.pt", "j-1").message(),
              HasSubstr("symbolic link"));
  EXPECT_TRUE(fs::exists(root + "/worker.key"));
  std::ofstream(root + "/j-1.ckpt-epoch-000003.pt") << "x";
  EXPECT_THAT(DropJobCheckpoint(root + "/j-1.ckpt-epoch-000003.pt", "j-1").message(),
              HasSubstr("no manifest of job j-1"));
  EXPECT_TRUE(fs::exists(root + "/j-1.ckpt-epoch-000003.pt"));
  std::ofstream(dir + "/j-1.ckpt-epoch-000004.pt") << "y";
  EXPECT_FALSE(DropJobCheckpoint(dir + "/j-1.ckpt-epoch-000004.pt", "j-2").ok())
      << "another job's record";
  EXPECT_TRUE(fs::exists(dir + "/j-1.ckpt-epoch-000004.pt"));
}

TEST(JobDirTest, OnlyJobNamedFilesInTheAttemptsDirectoryAreReported) {
  const std::string d = "/real/ck", named = "/link/ck";
  EXPECT_EQ(JobArtifactReport("/real/ck/j.ckpt-epoch-000001.pt", "j", d, named, false),
            "/link/ck/j.ckpt-epoch-000001.pt");
  EXPECT_EQ(JobArtifactReport("/link/ck/j.model.pt", "j", d, named, true), "/link/ck/j.model.pt");
  EXPECT_EQ(JobArtifactReport("/work/worker.key", "j", d, named, false), std::nullopt);
  EXPECT_EQ(JobArtifactReport("/real/ck/../j.ckpt-epoch-000001.pt", "j", d, named, false),
            std::nullopt);
  EXPECT_EQ(JobArtifactReport("/real/ck/sub/j.model.pt", "j", d, named, true), std::nullopt);
  EXPECT_EQ(JobArtifactReport("/real/ck/k.model.pt", "j", d, named, true), std::nullopt);
  EXPECT_EQ(JobArtifactReport("/real/ck/j.model.pt", "j", d, named, false), std::nullopt)
      << "not a checkpoint name";
}

}  // namespace
}  // namespace trainctl::worker
