// Artifacts by record and directories by owner, end to end over TLS (issue
// 25, findings 2 and 3): a real coordinator (`init`, --tls-dir), worker
// daemons joined with join tokens (so each holds a worker.key), one with
// --allow-commands, a rogue worker with a worker token, and the real CLI.
//
//  * A command job's fd-3 reports naming a worker's key (directly, by a
//    job-named symlink, by a job-named hard link) and a rogue worker's
//    forged reports fetch nothing outside the job's own directory: the key
//    never comes back, and a forged record is read only from its reporter.
//  * A checkpoint.dir belongs to its first job's owner: another owner's job
//    is refused at submit (the coordinator knows the directory) or at
//    pre-flight (it does not: a symlinked path), naming the owner; two jobs
//    of one owner in one directory keep both final models.
// Victim jobs run alongside and SUCCEED. See docs/security.md.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/auth/secret.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "tests/support/fake_worker.h"
#include "tests/support/source_dir.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using trainctl::testing::Cluster;
using trainctl::testing::FakeWorker;
using trainctl::testing::SourceDir;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

v1::JobSpec Spec(const std::string& name, int epochs, const std::vector<std::string>& sets = {}) {
  std::vector<std::string> all = {"name=" + name, "world_size=1",
                                  absl::StrCat("training.epochs=", epochs)};
  all.insert(all.end(), sets.begin(), sets.end());
  ParsedJobSpec p = ParseJobSpecYaml(
      "model: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n",
      "artifacts.yaml", all);
  EXPECT_TRUE(p.ok());
  return p.spec;
}

std::shared_ptr<grpc::Channel> Channel(const Cluster& c, const std::string& token) {
  auth::ChannelSecurity security;
  security.token = token;
  security.ca_file = c.ca_file();
  return *auth::MakeChannel(c.address(), security, grpc::ChannelArguments());
}

// FetchArtifact: the status, and every byte received in *data.
grpc::Status Fetch(const Cluster& c, const std::string& token, const std::string& job, int64_t step,
                   std::string* data) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(40));
  v1::FetchArtifactRequest req;
  req.set_job_id(job);
  req.set_checkpoint_step(step);
  auto reader = v1::JobService::NewStub(Channel(c, token))->FetchArtifact(&ctx, req);
  v1::ArtifactChunk chunk;
  while (reader->Read(&chunk)) *data += chunk.data();
  return reader->Finish();
}

// The CLI over TLS; its exit code, stdout+stderr in *out.
int Cli(const Cluster& c, const std::string& token, const std::string& args, std::string* out) {
  const std::string log = c.dir() + "/cli.out";
  const std::string cmd = absl::StrCat(
      trainctl::testing::BuildDirOfThisTest(), "/client/trainctl --coordinator=", c.address(),
      " --ca=", c.ca_file(), " --token=", token, " ", args, " > ", log, " 2>&1");
  int rc = std::system(cmd.c_str());
  *out = Slurp(log);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// Starts worker `name` joined with a fresh join token (it makes worker.key
// in its work dir).
bool StartJoined(Cluster& c, const std::string& name, int slots,
                 std::vector<std::string> flags = {}) {
  const std::string join = c.CreateToken(v1::ROLE_JOIN, "join-" + name);
  const std::string file = absl::StrCat(c.dir(), "/join-", name, ".token");
  if (join.empty() || !auth::WritePrivateFile(file, join + "\n").ok()) return false;
  flags.push_back("--join_token_file=" + file);
  return c.StartWorker(name, slots, false, flags);
}

std::set<int64_t> Steps(const v1::Job& j) {
  std::set<int64_t> out;
  for (const v1::CheckpointRecord& r : j.checkpoints()) out.insert(r.global_step());
  return out;
}

TEST(SecurityArtifactsE2ETest, NoReportFetchesAFileOutsideTheJobsDirectory) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.InitTls());
  ASSERT_TRUE(cluster.StartCoordinator());
  const std::string victim_key = cluster.dir() + "/worker-victim/worker.key";
  const std::string cmd_key = cluster.dir() + "/worker-cmd/worker.key";
  const std::string viewer = cluster.CreateToken(v1::ROLE_VIEWER, "carol");
  ASSERT_FALSE(viewer.empty());

  // A rogue worker (any worker token) takes a shared job's rank and forges
  // its reports before the real workers are there.
  const std::string worker_token = cluster.CreateToken(v1::ROLE_WORKER, "rogue");
  auth::ChannelSecurity tls;
  tls.ca_file = cluster.ca_file();
  FakeWorker rogue(*auth::MakeChannel(cluster.address(), tls, grpc::ChannelArguments()), "rogue", 1,
                   absl::Milliseconds(100), worker_token);
  ASSERT_TRUE(rogue.Connect());
  const std::string shared = cluster.dir() + "/shared";
  std::string rogue_job = cluster.Submit(
      Spec("rogue-hang", 1, {"checkpoint.dir=" + shared + "/{job_id}", "checkpoint.shared=true"}));
  ASSERT_FALSE(rogue_job.empty());
  ASSERT_TRUE(
      rogue.WaitFor([](const v1::CoordinatorMessage& m) { return m.has_preflight(); }).has_value());
  v1::WorkerMessage pre;
  pre.mutable_preflight()->set_job_id(rogue_job);
  pre.mutable_preflight()->set_attempt(1);
  ASSERT_TRUE(rogue.Send(pre));
  ASSERT_TRUE(rogue.WaitFor([](const v1::CoordinatorMessage& m) { return m.has_start_ranks(); })
                  .has_value());
  ASSERT_TRUE(rogue.SendStatus(rogue_job, 1, 0, v1::RANK_STATE_RUNNING));
  auto forge = [&](int64_t step, const std::string& path) {
    v1::WorkerMessage m;
    v1::CheckpointReport* rep = m.mutable_checkpoint();
    rep->set_job_id(rogue_job);
    rep->set_attempt(1);
    rep->set_rank(0);
    rep->mutable_record()->set_epochs_done(1);
    rep->mutable_record()->set_global_step(step);
    rep->mutable_record()->set_size_bytes(1);
    rep->mutable_record()->set_path(path);
    return rogue.Send(m);
  };
  ASSERT_TRUE(forge(7, victim_key));
  ASSERT_TRUE(
      forge(8, absl::StrCat(shared, "/", rogue_job, "/", rogue_job, ".ckpt-epoch-000001.pt")));
  v1::Job rj = cluster.WaitFor(
      rogue_job, [](const v1::Job& j) { return j.checkpoints_size() > 0; }, absl::Seconds(20));
  ASSERT_EQ(Steps(rj), (std::set<int64_t>{8})) << "the key's path is never recorded";
  EXPECT_EQ(rj.checkpoints(0).reported_by(), "rogue");
  EXPECT_THAT(cluster.coordinator()->ReadLog(),
              HasSubstr("'" + victim_key + "' is not a checkpoint of job " + rogue_job));

  // The real workers join (each makes its worker.key); one runs commands.
  ASSERT_TRUE(StartJoined(cluster, "victim", 1));
  ASSERT_TRUE(StartJoined(cluster, "cmd", 1, {"--allow_commands"}));
  ASSERT_TRUE(cluster.WaitWorkers(3));
  ASSERT_TRUE(std::filesystem::exists(victim_key));
  ASSERT_TRUE(std::filesystem::exists(cmd_key));
  const std::string victim_key_bytes = Slurp(victim_key), cmd_key_bytes = Slurp(cmd_key);
  std::string victim_job = cluster.Submit(Spec("slow-victim", 2));
  ASSERT_FALSE(victim_job.empty());

  // The forged shared record is asked of its reporter only, never of a
  // worker that merely sees the same path.
  const size_t before = rogue.received_count();
  std::string data;
  std::thread fetch([&] {
    grpc::Status s = Fetch(cluster, viewer, rogue_job, 8, &data);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("worker 'rogue': no such file here"));
  });
  auto asked = rogue.WaitFor([](const v1::CoordinatorMessage& m) { return m.has_read_file(); },
                             absl::Seconds(20), before);
  ASSERT_TRUE(asked.has_value());
  EXPECT_EQ(asked->read_file().job_id(), rogue_job);
  v1::WorkerMessage answer;
  answer.mutable_file_chunk()->set_request_id(asked->read_file().request_id());
  answer.mutable_file_chunk()->set_error("no such file here");
  ASSERT_TRUE(rogue.Send(answer));
  fetch.join();
  EXPECT_EQ(data, "");

  // A command job's fd 3: the victim's key, its own worker's key by a
  // job-named symlink and hard link, and the key as its final model.
  const std::string script = cluster.dir() + "/fd3.sh";
  std::ofstream(script)
      << "set -e\nck=\"$TRAINCTL_CHECKPOINT_DIR\"; j=\"$TRAINCTL_JOB_ID\"\n"
      << "printf 'checkpoint 1 7 3 - 0 %s\\n' '" << victim_key << "' >&3\n"
      << "printf 'checkpoint 1 6 3 - 0 %s\\n' '" << cmd_key << "' >&3\n"
      << "ln -s '" << cmd_key << "' \"$ck/$j.ckpt-epoch-000002.pt\"\n"
      << "printf 'checkpoint 2 8 3 - 0 %s\\n' \"$ck/$j.ckpt-epoch-000002.pt\" >&3\n"
      << "ln '" << cmd_key << "' \"$ck/$j.ckpt-epoch-000003.pt\"\n"
      << "printf 'checkpoint 3 9 3 - 0 %s\\n' \"$ck/$j.ckpt-epoch-000003.pt\" >&3\n"
      << "printf 'model %s\\n' '" << victim_key << "' >&3\n"
      << "sleep 1\n";
  ParsedJobSpec cmd = ParseJobSpecYaml(
      absl::StrCat("name: fd3\nworld_size: 1\ndevice: cpu\ncommand:\n  argv: [/bin/sh, ", script,
                   "]\ncheckpoint: {dir: '", shared, "/{job_id}', shared: true}\n"),
      "fd3.yaml");
  ASSERT_TRUE(cmd.ok());
  const std::string submitter = cluster.CreateToken(v1::ROLE_SUBMITTER, "mallory");
  std::string trick;
  ASSERT_TRUE(cluster.SubmitAs(submitter, cmd.spec, &trick).ok());
  v1::Job tj = cluster.WaitState(trick, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(tj.state(), v1::JOB_STATE_SUCCEEDED) << tj.state_reason();
  EXPECT_EQ(Steps(tj), (std::set<int64_t>{8, 9}))
      << "only job-named files in its directory are reported";
  EXPECT_EQ(tj.final_model(), "") << "the key is not its final model";
  EXPECT_THAT(cluster.RankLog(trick, 1, 0),
              HasSubstr("ignored status line (not a checkpoint of this job"));

  std::string out;
  const std::string k = cluster.dir() + "/k";
  EXPECT_NE(Cli(cluster, viewer, absl::StrCat("fetch ", trick, " --checkpoint 7 -O ", k), &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("no checkpoint at step 7"));
  EXPECT_FALSE(std::filesystem::exists(k));
  for (const auto& [step, why] : std::vector<std::pair<int64_t, std::string>>{
           {8, "a symbolic link (not served)"}, {9, "has 2 links"}}) {
    data.clear();
    grpc::Status s = Fetch(cluster, viewer, trick, step, &data);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
        << step << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(why)) << step;
    EXPECT_EQ(data, "") << step;
  }
  data.clear();
  EXPECT_EQ(Fetch(cluster, viewer, trick, 0, &data).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(data, "");
  EXPECT_EQ(Slurp(victim_key), victim_key_bytes);
  EXPECT_EQ(Slurp(cmd_key), cmd_key_bytes);

  v1::Job vj = cluster.WaitState(victim_job, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  EXPECT_EQ(vj.state(), v1::JOB_STATE_SUCCEEDED) << vj.state_reason();
}

TEST(SecurityArtifactsE2ETest, ACheckpointDirBelongsToItsFirstOwnerWhoseJobsKeepTheirOwnModels) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.InitTls());
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(StartJoined(cluster, "w", 2));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  const std::string alice = cluster.CreateToken(v1::ROLE_SUBMITTER, "alice");
  const std::string bob = cluster.CreateToken(v1::ROLE_SUBMITTER, "bob");
  const std::string viewer = cluster.CreateToken(v1::ROLE_VIEWER, "carol");
  const std::string team = cluster.dir() + "/team";

  std::string a1, a2;
  ASSERT_TRUE(
      cluster.SubmitAs(alice, Spec("slow-model-a1", 2, {"checkpoint.dir=" + team}), &a1).ok());
  ASSERT_TRUE(cluster.SubmitAs(alice, Spec("model-a2", 1, {"checkpoint.dir=" + team}), &a2).ok());

  // Bob, by the same path: refused at submit, naming the owner.
  std::string b;
  grpc::Status s = cluster.SubmitAs(bob, Spec("model-b", 1, {"checkpoint.dir=" + team + "/"}), &b);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("belongs to 'alice' (job " + a1 + ")"));
  // By a path the coordinator cannot match (a symlink): refused by the
  // worker's pre-flight, which reads the directory's claim.
  v1::Job first =
      cluster.WaitFor(a1, [](const v1::Job& j) { return j.state() >= v1::JOB_STATE_RUNNING; });
  ASSERT_GE(first.state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(std::filesystem::exists(team + "/.trainctl-dir"));
  std::filesystem::create_directory_symlink(team, cluster.dir() + "/team-link");
  ASSERT_TRUE(
      cluster
          .SubmitAs(bob, Spec("model-b", 1, {"checkpoint.dir=" + cluster.dir() + "/team-link"}), &b)
          .ok());
  v1::Job bj = cluster.WaitState(b, v1::JOB_STATE_FAILED, absl::Seconds(60));
  ASSERT_EQ(bj.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(bj.attempts(0).failure_kind(), v1::FAILURE_KIND_PREFLIGHT);
  EXPECT_THAT(bj.state_reason(), HasSubstr("belongs to 'alice'"));
  EXPECT_THAT(bj.state_reason(), HasSubstr("a job of 'bob' may not write there"));
  EXPECT_FALSE(std::filesystem::exists(team + "/" + b + ".model.pt"));

  // Alice's two jobs in one directory: both models kept, each fetched as
  // its own (bytes differ, each matches its file and starts with its id).
  v1::Job j1 = cluster.WaitState(a1, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  v1::Job j2 = cluster.WaitState(a2, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(j1.state(), v1::JOB_STATE_SUCCEEDED) << j1.state_reason();
  ASSERT_EQ(j2.state(), v1::JOB_STATE_SUCCEEDED) << j2.state_reason();
  EXPECT_EQ(j1.final_model(), team + "/" + a1 + ".model.pt");
  EXPECT_EQ(j2.final_model(), team + "/" + a2 + ".model.pt");
  std::string m1, m2;
  ASSERT_TRUE(Fetch(cluster, viewer, a1, 0, &m1).ok());
  ASSERT_TRUE(Fetch(cluster, viewer, a2, 0, &m2).ok());
  EXPECT_NE(m1, m2);
  EXPECT_EQ(m1, Slurp(j1.final_model()));
  EXPECT_EQ(m2, Slurp(j2.final_model()));
  EXPECT_EQ(m1.rfind(a1, 0), 0u);
  EXPECT_EQ(m2.rfind(a2, 0), 0u);
  std::string out;
  const std::string dest = cluster.dir() + "/a1.pt";
  ASSERT_EQ(Cli(cluster, viewer, absl::StrCat("fetch ", a1, " -O ", dest), &out), 0) << out;
  EXPECT_EQ(Slurp(dest), m1);
  EXPECT_THAT(Slurp(team + "/.trainctl-dir"), Not(HasSubstr("bob")));
}

}  // namespace
}  // namespace trainctl
