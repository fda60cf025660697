// Client::UploadCode and PackedCodeArchive against a fake JobService that
// implements only UploadCode (on 127.0.0.1, port 0): the pieces, the early
// end when the coordinator has the archive, the coordinator's errors.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/codepack/code_pack.h"
#include "common/temp_dir.h"
#include "trainctl/client.h"
#include "trainctl/v1/job_service.grpc.pb.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// What one UploadCode call received, and how the fake answers it.
class FakeJobService final : public v1::JobService::Service {
 public:
  // Given the first message; returns the status to end with after reading
  // everything (or, with `stop_after_first`, at once).
  std::function<grpc::Status(const v1::UploadCodeChunk& first, const std::string& data,
                             v1::UploadCodeResponse* resp)>
      answer;
  bool stop_after_first = false;

  // The lock orders the handler's last writes before the members are
  // destroyed, for TSan too (the hand-over otherwise runs through gRPC
  // core, which it cannot see).
  ~FakeJobService() override { std::lock_guard<std::mutex> l(mu_); }

  grpc::Status UploadCode(grpc::ServerContext*, grpc::ServerReader<v1::UploadCodeChunk>* reader,
                          v1::UploadCodeResponse* resp) override {
    v1::UploadCodeChunk chunk, first;
    std::string data;
    int messages = 0;
    bool ok = true;
    while (reader->Read(&chunk)) {
      if (messages == 0) {
        first = chunk;
      } else if (!chunk.digest().empty() || chunk.size_bytes() != 0) {
        ok = false;  // only the first message names the archive
      }
      if (chunk.data().size() > (size_t{1} << 20)) ok = false;
      data += chunk.data();
      ++messages;
      if (stop_after_first) break;
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      calls_++;
      messages_ = messages;
      data_ = data;
      first_ = first;
      well_formed_ = ok;
    }
    return answer(first, data, resp);
  }

  int calls() const {
    std::lock_guard<std::mutex> l(mu_);
    return calls_;
  }
  int messages() const {
    std::lock_guard<std::mutex> l(mu_);
    return messages_;
  }
  std::string data() const {
    std::lock_guard<std::mutex> l(mu_);
    return data_;
  }
  v1::UploadCodeChunk first() const {
    std::lock_guard<std::mutex> l(mu_);
    return first_;
  }
  bool well_formed() const {
    std::lock_guard<std::mutex> l(mu_);
    return well_formed_;
  }

 private:
  mutable std::mutex mu_;
  int calls_ = 0;
  int messages_ = 0;
  std::string data_;
  v1::UploadCodeChunk first_;
  bool well_formed_ = false;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class UploadCodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("upload_code_test");
    ASSERT_FALSE(dir_.empty());
    // 2.5 MiB of incompressible bytes and a small file: three pieces.
    fs::create_directories(dir_ + "/code/pkg");
    std::mt19937 rng(7);
    std::string big(size_t{5} << 19, '\0');
    for (char& c : big) c = static_cast<char>(rng());
    std::ofstream(dir_ + "/code/pkg/weights.bin", std::ios::binary) << big;
    std::ofstream(dir_ + "/code/train.py", std::ios::binary) << "print('hi')\n";
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    fs::remove_all(dir_);
  }

  // Starts `service` on 127.0.0.1:0 and connects a client to it.
  std::unique_ptr<Client> Serve(grpc::Service* service) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service);
    server_ = builder.BuildAndStart();
    EXPECT_GT(port, 0);
    ClientOptions options;
    options.address = absl::StrCat("127.0.0.1:", port);
    options.timeout = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  std::unique_ptr<PackedCodeArchive> Pack() {
    absl::StatusOr<std::unique_ptr<PackedCodeArchive>> archive =
        PackedCodeArchive::Pack(dir_ + "/code/");
    EXPECT_TRUE(archive.ok()) << archive.status();
    return archive.ok() ? std::move(*archive) : nullptr;
  }

  // Serves `service`, packs the tree and uploads it; archive_ keeps it.
  absl::StatusOr<UploadedCode> UploadTo(grpc::Service* service) {
    std::unique_ptr<Client> client = Serve(service);
    archive_ = Pack();
    if (client == nullptr || archive_ == nullptr)
      return absl::InternalError("no client or archive");
    return client->UploadCode(archive_->path(), archive_->code());
  }

  std::string dir_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<PackedCodeArchive> archive_;
};

TEST_F(UploadCodeTest, PiecesOfOneMebibyteReassembleToTheArchive) {
  FakeJobService fake;
  fake.answer = [](const v1::UploadCodeChunk& first, const std::string& data,
                   v1::UploadCodeResponse* resp) {
    resp->set_digest(first.digest());
    resp->set_size_bytes(static_cast<int64_t>(data.size()));
    return grpc::Status::OK;
  };
  std::unique_ptr<Client> client = Serve(&fake);
  ASSERT_NE(client, nullptr);
  std::unique_ptr<PackedCodeArchive> archive = Pack();
  ASSERT_NE(archive, nullptr);
  EXPECT_EQ(archive->code().source(), dir_ + "/code");
  EXPECT_EQ(archive->code().files(), 2);

  absl::StatusOr<UploadedCode> uploaded = client->UploadCode(archive->path(), archive->code());
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  EXPECT_FALSE(uploaded->already_stored);
  EXPECT_EQ(uploaded->code.digest(), archive->code().digest());
  EXPECT_EQ(uploaded->code.size_bytes(), archive->code().size_bytes());
  EXPECT_EQ(uploaded->code.files(), 2);
  EXPECT_EQ(uploaded->code.source(), dir_ + "/code");

  EXPECT_EQ(fake.calls(), 1);
  EXPECT_TRUE(fake.well_formed());
  EXPECT_EQ(fake.first().digest(), archive->code().digest());
  EXPECT_EQ(fake.first().size_bytes(), archive->code().size_bytes());
  EXPECT_EQ(fake.messages(), 3);  // 2.5 MiB and some: 1 + 1 + the rest
  EXPECT_EQ(fake.data(), ReadAll(archive->path()));
  absl::StatusOr<std::string> digest = codepack::FileDigest(archive->path());
  ASSERT_TRUE(digest.ok());
  EXPECT_EQ(*digest, archive->code().digest());

  // The temporary archive goes with the object.
  const std::string path = archive->path();
  archive.reset();
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(fs::path(path).parent_path()));
}

TEST_F(UploadCodeTest, AlreadyStoredEndsTheCallAfterTheFirstMessage) {
  FakeJobService fake;
  fake.stop_after_first = true;
  fake.answer = [](const v1::UploadCodeChunk& first, const std::string&,
                   v1::UploadCodeResponse* resp) {
    resp->set_digest(first.digest());
    resp->set_size_bytes(first.size_bytes());
    resp->set_already_stored(true);
    return grpc::Status::OK;
  };
  absl::StatusOr<UploadedCode> uploaded = UploadTo(&fake);
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  EXPECT_TRUE(uploaded->already_stored);
  EXPECT_EQ(uploaded->code.digest(), archive_->code().digest());
  EXPECT_EQ(fake.calls(), 1);
  EXPECT_EQ(fake.messages(), 1);
}

TEST_F(UploadCodeTest, TheCoordinatorsErrorComesBackWithItsCode) {
  FakeJobService fake;
  fake.answer = [](const v1::UploadCodeChunk&, const std::string&, v1::UploadCodeResponse*) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "code archive over --max-code-bytes (1 MiB)");
  };
  absl::StatusOr<UploadedCode> uploaded = UploadTo(&fake);
  ASSERT_FALSE(uploaded.ok());
  EXPECT_EQ(uploaded.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(uploaded.status().message(), "code archive over --max-code-bytes (1 MiB)");
}

TEST_F(UploadCodeTest, AStoredDigestThatDiffersIsDataLoss) {
  FakeJobService fake;
  fake.answer = [](const v1::UploadCodeChunk&, const std::string&, v1::UploadCodeResponse* resp) {
    resp->set_digest("sha256:" + std::string(64, '0'));
    return grpc::Status::OK;
  };
  absl::StatusOr<UploadedCode> uploaded = UploadTo(&fake);
  EXPECT_EQ(uploaded.status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(UploadCodeTest, ACoordinatorWithoutUploadsNamesTheWayAround) {
  v1::JobService::Service unimplemented;  // every method UNIMPLEMENTED
  absl::StatusOr<UploadedCode> uploaded = UploadTo(&unimplemented);
  EXPECT_EQ(uploaded.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(uploaded.status().message(), HasSubstr("--no-upload"));
}

TEST_F(UploadCodeTest, ASizeThatIsNotTheFilesIsRefusedBeforeAnyCall) {
  FakeJobService fake;
  fake.answer = [](const v1::UploadCodeChunk&, const std::string&, v1::UploadCodeResponse*) {
    return grpc::Status::OK;
  };
  std::unique_ptr<Client> client = Serve(&fake);
  ASSERT_NE(client, nullptr);
  std::unique_ptr<PackedCodeArchive> archive = Pack();
  ASSERT_NE(archive, nullptr);
  v1::CodePackage wrong = archive->code();
  wrong.set_size_bytes(wrong.size_bytes() + 1);
  absl::StatusOr<UploadedCode> uploaded = client->UploadCode(archive->path(), wrong);
  EXPECT_EQ(uploaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(uploaded.status().message(), HasSubstr("the package says"));
  EXPECT_EQ(fake.calls(), 0);
}

TEST_F(UploadCodeTest, PackRefusesAnOversizeDirectoryNamingTheBiggestFile) {
  absl::StatusOr<std::unique_ptr<PackedCodeArchive>> archive =
      PackedCodeArchive::Pack(dir_ + "/code", 1 << 20);
  ASSERT_FALSE(archive.ok());
  EXPECT_EQ(archive.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(archive.status().message(), HasSubstr("pkg/weights.bin (2.5 MiB)"));
}

}  // namespace
}  // namespace trainctl
