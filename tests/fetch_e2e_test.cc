// trainctl fetch end to end: a real coordinator and worker daemon (fake
// ranks that write checkpoints and a 2.5 MiB final model), the real CLI. The
// model comes back byte for byte in 1 MiB pieces, a checkpoint by its step;
// a damaged file, an unknown step, a missing token and a gone holder are
// refused with the right code and leave no output file. A fetch from an
// offset sends the rest of the file; one past the end is refused.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/auth/secret.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "tests/support/source_dir.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using trainctl::testing::Cluster;
using trainctl::testing::SourceDir;

v1::JobSpec Spec(const std::string& name, int epochs) {
  ParsedJobSpec p = ParseJobSpecYaml(
      "model: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n",
      "fetch.yaml", {"name=" + name, "world_size=1", absl::StrCat("training.epochs=", epochs)});
  EXPECT_TRUE(p.ok());
  return p.spec;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Runs the CLI; its exit code, with stdout+stderr in *out.
int Cli(const Cluster& c, const std::string& token, const std::string& args, std::string* out) {
  const std::string log = c.dir() + "/cli.out";
  const std::string cmd = absl::StrCat(trainctl::testing::BuildDirOfThisTest(),
                                       "/client/trainctl --coordinator=", c.address(),
                                       " --token=", token, " ", args, " > ", log, " 2>&1");
  int rc = std::system(cmd.c_str());
  *out = Slurp(log);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// FetchArtifact over gRPC: the status, and the bytes in *data.
grpc::Status Fetch(const std::string& address, const std::string& token, const std::string& job,
                   int64_t step, std::string* data = nullptr, std::vector<size_t>* pieces = nullptr,
                   int64_t offset = 0, v1::ArtifactChunk* head = nullptr) {
  auth::ChannelSecurity security;
  security.token = token;
  auto stub =
      v1::JobService::NewStub(*auth::MakeChannel(address, security, grpc::ChannelArguments()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::FetchArtifactRequest req;
  req.set_job_id(job);
  req.set_checkpoint_step(step);
  req.set_offset(offset);
  auto reader = stub->FetchArtifact(&ctx, req);
  v1::ArtifactChunk c;
  while (reader->Read(&c)) {
    if (head != nullptr && head->path().empty()) {
      *head = c;
      head->clear_data();
    }
    if (data != nullptr) *data += c.data();
    if (pieces != nullptr) pieces->push_back(c.data().size());
  }
  return reader->Finish();
}

TEST(FetchE2ETest, ModelAndCheckpointComeBackVerifiedAndDamageIsRefused) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.StartWorker("w", 1));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  const std::string id = cluster.Submit(Spec("fake-model", 2));
  ASSERT_FALSE(id.empty());
  v1::Job job = cluster.WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_reason();
  ASSERT_FALSE(job.final_model().empty());
  const std::string model = Slurp(job.final_model());
  ASSERT_EQ(model.size(), 5u * 512 * 1024);

  // The final model, through the CLI: byte for byte, in three 1 MiB pieces.
  std::string out;
  const std::string dest = cluster.dir() + "/model.bin";
  ASSERT_EQ(Cli(cluster, cluster.admin_token(), absl::StrCat("fetch ", id, " -O ", dest), &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("wrote ", dest, " (2621440 bytes, crc32:")));
  EXPECT_EQ(Slurp(dest), model);
  EXPECT_FALSE(std::filesystem::exists(dest + ".part"));
  std::string data;
  std::vector<size_t> pieces;
  ASSERT_TRUE(Fetch(cluster.address(), cluster.admin_token(), id, 0, &data, &pieces).ok());
  EXPECT_EQ(data, model);
  EXPECT_THAT(pieces, ::testing::ElementsAre(1u << 20, 1u << 20, (1u << 19)));
  // From an offset (a resumed fetch): the rest of the file, the first piece
  // still describing the whole of it; the end of the file gives an empty
  // piece; past it or before 0 is refused naming the field.
  data.clear();
  v1::ArtifactChunk head;
  ASSERT_TRUE(
      Fetch(cluster.address(), cluster.admin_token(), id, 0, &data, nullptr, 2000000, &head).ok());
  EXPECT_EQ(data, model.substr(2000000));
  EXPECT_EQ(head.offset(), 2000000);
  EXPECT_EQ(head.size(), static_cast<int64_t>(model.size()));
  EXPECT_EQ(head.checksum().rfind("crc32:", 0), 0u) << head.checksum();
  data = "x";
  EXPECT_TRUE(
      Fetch(cluster.address(), cluster.admin_token(), id, 0, &data, nullptr, model.size()).ok());
  EXPECT_EQ(data, "x");
  grpc::Status past =
      Fetch(cluster.address(), cluster.admin_token(), id, 0, nullptr, nullptr, model.size() + 1);
  EXPECT_EQ(past.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(past.error_message(),
              HasSubstr("offset: 2621441 is outside the file (2621440 bytes)"));
  grpc::Status negative =
      Fetch(cluster.address(), cluster.admin_token(), id, 0, nullptr, nullptr, -1);
  EXPECT_EQ(negative.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(negative.error_message(), HasSubstr("offset: must be >= 0"));

  // A checkpoint by its global step (epoch 2 = step 8), with a viewer token.
  const std::string viewer = cluster.CreateToken(v1::ROLE_VIEWER, "carol");
  const std::string ckpt = cluster.dir() + "/ckpt.txt";
  ASSERT_EQ(Cli(cluster, viewer, absl::StrCat("fetch ", id, " --checkpoint 8 -O ", ckpt), &out), 0)
      << out;
  EXPECT_EQ(Slurp(ckpt), "2");

  // Refusals: an unknown step names the ones there are; no token.
  grpc::Status s = Fetch(cluster.address(), cluster.admin_token(), id, 5);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("no checkpoint at step 5 (it has: 4, 8)"));
  EXPECT_EQ(Fetch(cluster.address(), "", id, 0).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Fetch(cluster.address(), cluster.admin_token(), "no-such-job", 0).error_code(),
            grpc::StatusCode::NOT_FOUND);

  // A damaged checkpoint (same size, other bytes) does not match its record.
  std::string path8;
  for (const v1::CheckpointRecord& r : job.checkpoints()) {
    if (r.global_step() == 8) path8 = r.path();
  }
  ASSERT_FALSE(path8.empty());
  std::ofstream(path8, std::ios::binary | std::ios::trunc) << "7";
  s = Fetch(cluster.address(), cluster.admin_token(), id, 8);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(s.error_message(), HasSubstr("recorded as"));
  const std::string bad = cluster.dir() + "/bad.txt";
  EXPECT_NE(Cli(cluster, cluster.admin_token(),
                absl::StrCat("fetch ", id, " --checkpoint 8 -O ", bad), &out),
            0);
  EXPECT_THAT(out, HasSubstr("recorded as"));
  EXPECT_FALSE(std::filesystem::exists(bad));
  EXPECT_FALSE(std::filesystem::exists(bad + ".part"));

  // The holder is gone: UNAVAILABLE naming it. A fetch that starts before the coordinator has seen
  // the session end fails as "disconnected during the fetch" (also UNAVAILABLE); once the session
  // is gone every fetch is refused up front as "is not connected", which is what this waits for.
  cluster.KillWorker("w", SIGKILL);
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  do {
    s = Fetch(cluster.address(), cluster.admin_token(), id, 0);
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE &&
        absl::StrContains(s.error_message(), "is not connected")) {
      break;
    }
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      EXPECT_THAT(s.error_message(), HasSubstr("disconnected during the fetch"));
    }
    absl::SleepFor(absl::Milliseconds(200));
  } while (absl::Now() < deadline);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("is not connected"));
}

}  // namespace
}  // namespace trainctl
