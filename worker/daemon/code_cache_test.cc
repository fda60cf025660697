// The worker's code cache on a disk that fails (the file seam,
// common/file_env.h): a full disk at the archive's write, an I/O error at
// its fsync or rename, a cache directory that cannot be made. Each is
// reported naming the path and the errno, leaves no half-written file in
// the cache, and a later Want on a healthy disk fetches the archive again.
#include "worker/daemon/code_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/codepack/code_pack.h"
#include "common/event_loop.h"
#include "common/file_env.h"

namespace trainctl::worker {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(30);

// Serves one archive's bytes, in two pieces (as chunks arrive); counts fetches.
class BytesSource final : public CodeSource {
 public:
  explicit BytesSource(std::string bytes) : bytes_(std::move(bytes)) {}
  absl::Status FetchCode(const std::string&, const std::string&, Sink write) override {
    {
      absl::MutexLock lock(&mu_);
      ++fetches_;
    }
    const size_t half = bytes_.size() / 2;
    if (absl::Status s = write(absl::string_view(bytes_).substr(0, half)); !s.ok()) return s;
    return write(absl::string_view(bytes_).substr(half));
  }
  void CancelFetches() override {}
  int fetches() {
    absl::MutexLock lock(&mu_);
    return fetches_;
  }

 private:
  const std::string bytes_;
  absl::Mutex mu_;
  int fetches_ ABSL_GUARDED_BY(mu_) = 0;
};

class CodeCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(::testing::TempDir(), "/code_cache_test.", getpid());
    fs::remove_all(root_);
    fs::create_directories(root_);
    root_ = fs::canonical(root_).string();  // the fault env matches absolute paths
    dir_ = root_ + "/code";
    const std::string sample = root_ + "/sample.tar";
    std::ofstream(sample, std::ios::binary) << bytes_;
    digest_ = *codepack::FileDigest(sample);
    fs::remove(sample);
  }
  void TearDown() override {
    cache_.reset();
    loop_.StopAndJoin();
    fs::remove_all(root_);
  }

  // Want on the loop; what its callback got.
  absl::StatusOr<std::string> Want() {
    absl::Notification done;
    absl::StatusOr<std::string> got = absl::UnknownError("not called");
    loop_.RunSync([&] {
      cache_->Want("job-1", digest_, [&](absl::StatusOr<std::string> archive) {
        got = std::move(archive);
        done.Notify();
      });
    });
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(kWait));
    return got;
  }
  // Every file in the cache directory (none when it does not exist).
  std::vector<std::string> Files() {
    std::vector<std::string> out;
    if (!fs::exists(dir_)) return out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    return out;
  }

  const std::string bytes_ = std::string(100000, 'x') + "the end";
  std::string root_, dir_, digest_;
  BytesSource source_{bytes_};
  FaultFileEnv env_;
  EventLoop loop_;
  std::unique_ptr<CodeCache> cache_;

  void NewCache() { cache_ = std::make_unique<CodeCache>(dir_, &source_, loop_, nullptr, &env_); }
};

TEST_F(CodeCacheTest, AFetchedArchiveIsKeptUnderItsDigestAndServedFromTheCacheAfter) {
  NewCache();
  absl::StatusOr<std::string> got = Want();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, cache_->ArchivePath(digest_));
  EXPECT_EQ(*codepack::FileDigest(*got), digest_);
  EXPECT_THAT(Files(), ::testing::ElementsAre(fs::path(*got).filename().string()));
  ASSERT_TRUE(Want().ok());
  EXPECT_EQ(source_.fetches(), 1);
}

TEST_F(CodeCacheTest, AFullDiskAtTheWriteIsReportedAndLeavesNoHalfFile) {
  env_.Inject({FileOp::kWrite, dir_ + "/", ENOSPC, 2});  // the second piece
  NewCache();
  absl::StatusOr<std::string> got = Want();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr(digest_));
  EXPECT_THAT(got.status().message(), HasSubstr(dir_));
  EXPECT_THAT(got.status().message(), HasSubstr(std::strerror(ENOSPC)));
  EXPECT_EQ(env_.injected(), 1);
  EXPECT_THAT(Files(), ::testing::IsEmpty());

  // Space again: the next Want fetches it anew and keeps it.
  env_.Clear();
  got = Want();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*codepack::FileDigest(*got), digest_);
  EXPECT_EQ(source_.fetches(), 2);
}

TEST_F(CodeCacheTest, AnIoErrorAtTheFsyncOrTheRenameIsReportedAndLeavesNothing) {
  for (FileOp op : {FileOp::kFsync, FileOp::kRename}) {
    SCOPED_TRACE(op == FileOp::kFsync ? "fsync" : "rename");
    env_.Clear();
    env_.Inject({op, dir_ + "/", EIO});
    NewCache();
    absl::StatusOr<std::string> got = Want();
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal) << got.status();
    EXPECT_THAT(got.status().message(), HasSubstr(dir_));
    EXPECT_THAT(got.status().message(), HasSubstr(std::strerror(EIO)));
    EXPECT_THAT(Files(), ::testing::IsEmpty());
  }
}

TEST_F(CodeCacheTest, ACacheDirectoryThatCannotBeMadeIsNamed) {
  env_.Inject({FileOp::kMkdir, dir_, EACCES});
  NewCache();
  absl::StatusOr<std::string> got = Want();
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(),
              HasSubstr(absl::StrCat("cannot make ", dir_, ": ", std::strerror(EACCES))));
  EXPECT_FALSE(fs::exists(dir_));
  EXPECT_EQ(source_.fetches(), 0);
}

}  // namespace
}  // namespace trainctl::worker
