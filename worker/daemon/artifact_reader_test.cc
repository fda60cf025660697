// ReadArtifactChunk on real files: bounded pieces that cover the file, the
// zlib CRC-32 the trainer records, and refusals with their reasons.
#include "worker/daemon/artifact_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainctl::worker {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  std::string dir = absl::StrCat(::testing::TempDir(), "/artifact_reader_test.", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/served");
  return std::filesystem::canonical(dir).string();
}

v1::ReadFile Req(const std::string& path, int64_t offset, int32_t max, bool checksum = false) {
  v1::ReadFile r;
  r.set_request_id(7);
  r.set_path(path);
  r.set_offset(offset);
  r.set_max_bytes(max);
  r.set_want_checksum(checksum);
  return r;
}

TEST(ArtifactReaderTest, PiecesCoverTheFileAndTheChecksumIsZlibs) {
  const std::string dir = TempDir();
  const std::string path = dir + "/served/model.pt";
  std::string content;
  for (int i = 0; i < 3000; ++i) content += static_cast<char>(i * 31 % 251);
  std::ofstream(path, std::ios::binary) << content;
  auto under = [&](const std::string& p) { return PathIsUnder(p, dir + "/served"); };

  std::string got;
  int pieces = 0;
  for (int64_t off = 0; off < static_cast<int64_t>(content.size()); ++pieces) {
    v1::FileChunk c = ReadArtifactChunk(Req(path, off, 1000, off == 0), under);
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
  EXPECT_LE(ReadArtifactChunk(Req(path, 0, 1 << 30), under).data().size(),
            static_cast<size_t>(kMaxFileChunkBytes));
  EXPECT_THAT(ReadArtifactChunk(Req(path, 3001, 10), under).error(), HasSubstr("offset"));
}

TEST(ArtifactReaderTest, RefusesWhatItMayNotServe) {
  const std::string dir = TempDir();
  std::ofstream(dir + "/secret") << "x";
  std::filesystem::create_symlink(dir + "/secret", dir + "/served/link");
  auto under = [&](const std::string& p) { return PathIsUnder(p, dir + "/served"); };
  EXPECT_THAT(ReadArtifactChunk(Req(dir + "/secret", 0, 10), under).error(), HasSubstr("not a file this worker serves"));
  EXPECT_THAT(ReadArtifactChunk(Req(dir + "/served/link", 0, 10), under).error(),
              HasSubstr("not a file this worker serves"))
      << "a symlink out of the served directory";
  EXPECT_THAT(ReadArtifactChunk(Req(dir + "/served/../secret", 0, 10), under).error(),
              HasSubstr("not a file this worker serves"));
  EXPECT_THAT(ReadArtifactChunk(Req(dir + "/served/none", 0, 10), under).error(), HasSubstr("No such file"));
  EXPECT_THAT(ReadArtifactChunk(Req(dir + "/served", 0, 10), [](const std::string&) { return true; }).error(),
              HasSubstr("not a regular file"));
  EXPECT_THAT(ReadArtifactChunk(Req("relative", 0, 10), under).error(), HasSubstr("absolute"));
  EXPECT_FALSE(PathIsUnder("/a/bc", "/a/b"));
  EXPECT_TRUE(PathIsUnder("/a/b/c", "/a/b"));
}

}  // namespace
}  // namespace trainctl::worker
