// A job's code over gRPC, through a real in-process coordinator (127.0.0.1:0,
// a temporary database): JobService.UploadCode, SubmitJob's checks of
// CommandSpec.code, and WorkerService.FetchCode to fake workers that hold
// worker tokens. (The fetch by a real worker daemon: tests/.)
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/auth/secret.h"
#include "common/jobspec/job_spec.h"
#include "common/temp_dir.h"
#include "coordinator/server/coordinator_server.h"
#include "tests/support/fake_worker.h"
#include "trainctl/v1/job_service.grpc.pb.h"
#include "trainctl/v1/worker_service.grpc.pb.h"

namespace trainctl::coordinator {
namespace {

using ::trainctl::testing::FakeWorker;

constexpr int64_t kMaxCode = 4 << 20;

std::string Digest(const std::string& bytes) {
  return absl::StrCat("sha256:", auth::Sha256Hex(bytes));
}

// Bytes that are not one repeated value (a piece boundary shows).
std::string Archive(size_t size, char seed) {
  std::string s(size, '\0');
  for (size_t i = 0; i < size; ++i) s[i] = static_cast<char>(seed + i * 31 + i / 7);
  return s;
}

class CodeServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("code-service-test");
    CoordinatorOptions o;
    o.listen = "127.0.0.1:0";
    o.db_path = dir_ + "/state.db";
    o.registry.heartbeat_interval = absl::Milliseconds(100);
    o.registry.lease_timeout = absl::Seconds(5);
    o.check_interval = absl::Milliseconds(50);
    o.max_code_bytes = kMaxCode;
    Tweak(o);
    server_ = std::make_unique<CoordinatorServer>(o);
    absl::StatusOr<std::string> addr = server_->Start();
    ASSERT_TRUE(addr.ok()) << addr.status();
    address_ = *addr;
    admin_ = Channel(server_->admin_token());
  }
  virtual void Tweak(CoordinatorOptions& o) {}
  void TearDown() override {
    for (auto& w : workers_) w->Leave();
    workers_.clear();
    if (server_ != nullptr) server_->Shutdown();
    server_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& token) {
    auth::ChannelSecurity security;
    security.token = token;
    return *auth::MakeChannel(address_, security, grpc::ChannelArguments());
  }
  std::string Token(v1::Role role, const std::string& name) {
    absl::StatusOr<std::string> t = server_->IssueToken(role, name);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : "";
  }

  // Uploads `bytes` in 1 MiB pieces under `digest` and `size` (the first
  // message carries both and no bytes).
  grpc::Status Upload(const std::shared_ptr<grpc::Channel>& ch, const std::string& digest,
                      int64_t size, const std::string& bytes, v1::UploadCodeResponse* resp) {
    auto stub = v1::JobService::NewStub(ch);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto writer = stub->UploadCode(&ctx, resp);
    v1::UploadCodeChunk first;
    first.set_digest(digest);
    first.set_size_bytes(size);
    bool open = writer->Write(first);
    for (size_t at = 0; open && at < bytes.size(); at += 1 << 20) {
      v1::UploadCodeChunk piece;
      piece.set_data(bytes.substr(at, 1 << 20));
      open = writer->Write(piece);
    }
    writer->WritesDone();
    return writer->Finish();
  }
  grpc::Status Upload(const std::string& bytes, v1::UploadCodeResponse* resp) {
    return Upload(admin_, Digest(bytes), static_cast<int64_t>(bytes.size()), bytes, resp);
  }

  grpc::Status Fetch(const std::shared_ptr<grpc::Channel>& ch, const std::string& job_id,
                     const std::string& digest, std::string* bytes,
                     std::vector<v1::CodeChunk>* pieces = nullptr) {
    auto stub = v1::WorkerService::NewStub(ch);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::FetchCodeRequest req;
    req.set_job_id(job_id);
    req.set_digest(digest);
    auto reader = stub->FetchCode(&ctx, req);
    v1::CodeChunk c;
    while (reader->Read(&c)) {
      bytes->append(c.data());
      if (pieces != nullptr) pieces->push_back(c);
    }
    return reader->Finish();
  }

  static v1::JobSpec ScriptSpec(const std::string& digest, const std::string& working_dir = "") {
    ParsedJobSpec p = ParseJobSpecYaml("name: c\ncommand: {argv: [python3, train.py]}\n", "c.yaml",
                                       {"world_size=1"});
    EXPECT_TRUE(p.ok()) << p.errors[0].ToString();
    p.spec.mutable_command()->mutable_code()->set_digest(digest);
    p.spec.mutable_command()->set_working_dir(working_dir);
    return p.spec;
  }
  grpc::Status Submit(const v1::JobSpec& spec, v1::Job* job = nullptr, bool dry_run = false) {
    auto stub = v1::JobService::NewStub(admin_);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::SubmitJobRequest req;
    *req.mutable_spec() = spec;
    req.set_dry_run(dry_run);
    v1::SubmitJobResponse resp;
    grpc::Status s = stub->SubmitJob(&ctx, req, &resp);
    if (job != nullptr) *job = resp.job();
    return s;
  }

  FakeWorker& AddWorker(const std::string& id, const std::string& token, bool commands) {
    auto ch = *auth::MakeChannel(address_, auth::ChannelSecurity{}, grpc::ChannelArguments());
    workers_.push_back(std::make_unique<FakeWorker>(ch, id, 1, absl::Milliseconds(100), token));
    workers_.back()->set_allow_commands(commands);
    EXPECT_TRUE(workers_.back()->Connect()) << "worker " << id << " did not register";
    return *workers_.back();
  }

  std::string dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::string address_;
  std::shared_ptr<grpc::Channel> admin_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
};

TEST_F(CodeServiceTest, AnUploadIsStoredOnceThenAlreadyStored) {
  const std::string code = Archive((5 << 19) + 3, 'a');  // 2.5 MiB and a bit: three pieces
  v1::UploadCodeResponse first;
  grpc::Status s = Upload(code, &first);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(first.already_stored());
  EXPECT_EQ(first.digest(), Digest(code));
  EXPECT_EQ(first.size_bytes(), static_cast<int64_t>(code.size()));
  // The second time, the first message is enough.
  v1::UploadCodeResponse again;
  s = Upload(admin_, Digest(code), static_cast<int64_t>(code.size()), "", &again);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(again.already_stored());
  // A submitter may upload too.
  v1::UploadCodeResponse by_submitter;
  s = Upload(Channel(Token(v1::ROLE_SUBMITTER, "sub")), Digest(code),
             static_cast<int64_t>(code.size()), "", &by_submitter);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(by_submitter.already_stored());
}

TEST_F(CodeServiceTest, BytesThatDoNotMatchTheDigestOrSizeAreDataLossAndNothingIsStored) {
  const std::string code = Archive(1000, 'b');
  const std::string other = Archive(1000, 'c');
  v1::UploadCodeResponse resp;
  grpc::Status s = Upload(admin_, Digest(other), 1000, code, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  EXPECT_NE(s.error_message().find("not the declared digest"), std::string::npos)
      << s.error_message();
  s = Upload(admin_, Digest(code), 999, code, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  s = Upload(admin_, Digest(code), 1001, code, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  // Neither digest is stored: a job naming either is refused.
  for (const std::string& d : {Digest(code), Digest(other)}) {
    s = Submit(ScriptSpec(d));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  }
}

TEST_F(CodeServiceTest, BadFirstMessagesAreRefusedNamingTheField) {
  v1::UploadCodeResponse resp;
  grpc::Status s = Upload(admin_, "sha256:ABC", 10, "", &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("digest:", 0), 0u) << s.error_message();
  s = Upload(admin_, Digest("x"), 0, "", &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("size_bytes:", 0), 0u) << s.error_message();
  s = Upload(admin_, Digest("x"), kMaxCode + 1, "", &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find(absl::StrCat(kMaxCode)), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("--max-code-bytes"), std::string::npos) << s.error_message();
}

TEST_F(CodeServiceTest, AViewerMayNotUpload) {
  const std::string code = Archive(100, 'd');
  v1::UploadCodeResponse resp;
  grpc::Status s = Upload(Channel(Token(v1::ROLE_VIEWER, "v")), Digest(code), 100, code, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  s = Submit(ScriptSpec(Digest(code)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << "the viewer's upload stored nothing";
}

TEST_F(CodeServiceTest, SubmitChecksTheCodeItNames) {
  const std::string code = Archive(4096, 'e');
  v1::UploadCodeResponse resp;
  ASSERT_TRUE(Upload(code, &resp).ok());
  grpc::Status s = Submit(ScriptSpec(Digest("never uploaded")));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("is not stored; upload it first (JobService.UploadCode)"),
            std::string::npos)
      << s.error_message();
  s = Submit(ScriptSpec("sha256:nothex"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("command.code.digest:", 0), 0u) << s.error_message();
  for (const std::string dir : {"/srv/code", "src/../../etc", ".."}) {
    s = Submit(ScriptSpec(Digest(code), dir));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << dir;
    EXPECT_EQ(s.error_message().rfind("command.working_dir:", 0), 0u) << s.error_message();
  }
  v1::Job job;
  s = Submit(ScriptSpec(Digest(code), "src"), &job);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(job.spec().command().code().size_bytes(), 4096) << "the size comes from the store";
}

TEST_F(CodeServiceTest, OnlyAWorkerWithRanksOfTheJobFetchesItsCode) {
  const std::string code = Archive((2 << 20) + 17, 'f');
  v1::UploadCodeResponse resp;
  ASSERT_TRUE(Upload(code, &resp).ok());
  const std::string runner_token = Token(v1::ROLE_WORKER, "runner");
  const std::string other_token = Token(v1::ROLE_WORKER, "other");
  FakeWorker& runner = AddWorker("w-runner", runner_token, /*commands=*/true);
  AddWorker("w-other", other_token, /*commands=*/false);  // runs no scripts: gets no ranks
  v1::Job job;
  grpc::Status s = Submit(ScriptSpec(Digest(code)), &job);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(runner.WaitFor(
      [](const v1::CoordinatorMessage& m) { return m.has_start_ranks() || m.has_preflight(); },
      absl::Seconds(30)))
      << "the job's ranks were never placed";

  std::string got;
  std::vector<v1::CodeChunk> pieces;
  s = Fetch(Channel(runner_token), job.id(), Digest(code), &got, &pieces);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(got == code) << "fetched " << got.size() << " bytes of " << code.size();
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].size_bytes(), static_cast<int64_t>(code.size()));
  EXPECT_EQ(pieces[1].size_bytes(), 0) << "the size comes with the first piece only";
  EXPECT_EQ(pieces[0].data().size(), size_t{1} << 20);

  got.clear();
  s = Fetch(Channel(other_token), job.id(), Digest(code), &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find(job.id()), std::string::npos) << s.error_message();
  EXPECT_TRUE(got.empty());
  // Not a worker at all.
  s = Fetch(admin_, job.id(), Digest(code), &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  // Another digest, or no such job.
  s = Fetch(Channel(runner_token), job.id(), Digest("other"), &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  s = Fetch(Channel(runner_token), "no-such-job", Digest(code), &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_TRUE(got.empty());
}

// The coordinator's sweep, with no grace and a short interval: an archive
// no job names goes; one a stored job names stays.
class CodeSweepTest : public CodeServiceTest {
 protected:
  void Tweak(CoordinatorOptions& o) override {
    o.unreferenced_code_grace = absl::ZeroDuration();
    o.code_gc_interval = absl::Milliseconds(50);
  }
};

TEST_F(CodeSweepTest, ArchivesNoJobNamesAreDeletedAndNamedOnesKept) {
  const std::string named = Archive(300, 'g');
  const std::string orphan = Archive(300, 'h');
  v1::UploadCodeResponse resp;
  ASSERT_TRUE(Upload(orphan, &resp).ok());
  // With no grace the sweep may take an archive between its upload and the
  // submit; the submit's refusal says to upload again, as a client does.
  grpc::Status submitted;
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(Upload(named, &resp).ok());
    submitted = Submit(ScriptSpec(Digest(named)));
    if (submitted.error_code() != grpc::StatusCode::FAILED_PRECONDITION) break;
  }
  ASSERT_TRUE(submitted.ok()) << submitted.error_message();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  grpc::Status probe;
  do {
    probe = Submit(ScriptSpec(Digest(orphan)), nullptr, /*dry_run=*/true);
    if (probe.error_code() == grpc::StatusCode::FAILED_PRECONDITION) break;
    absl::SleepFor(absl::Milliseconds(50));  // the sweep runs on the coordinator's timer
  } while (absl::Now() < deadline);
  EXPECT_EQ(probe.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << "the orphan was never swept";
  v1::UploadCodeResponse again;
  ASSERT_TRUE(Upload(admin_, Digest(named), 300, "", &again).ok());
  EXPECT_TRUE(again.already_stored()) << "a stored job names it";
}

}  // namespace
}  // namespace trainctl::coordinator
