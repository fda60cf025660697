// The whole system with real rank processes: coordinator and two worker
// daemons as processes, trainctl-rank training the classic DDP example with
// Gloo on loopback. The job succeeds, each rank trains on its shard,
// metrics of every epoch reach a watcher, the final model loads in Python;
// a SIGKILLed daemon mid-run costs one restart that resumes from rank 0's
// checkpoint and succeeds.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "worker/dist/rendezvous_store.h"

namespace trainctl {
namespace {

using trainctl::testing::Cluster;

v1::JobSpec Classic(int epochs, const std::string& ckpt_dir, int length = 3000) {
  std::string src = std::getenv("TRAINCTL_SOURCE_DIR") ? std::getenv("TRAINCTL_SOURCE_DIR") : ".";
  ParsedJobSpec p =
      ParseJobSpecFile(src + "/examples/mlp-synthetic.yaml",
                       {absl::StrCat("training.epochs=", epochs), "checkpoint.dir=" + ckpt_dir,
                        "checkpoint.shared=true", absl::StrCat("data.train.length=", length)});
  EXPECT_TRUE(p.ok());
  return p.spec;
}

class TrainE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string build = trainctl::testing::BuildDirOfThisTest();
    cluster_ = std::make_unique<Cluster>(build, build + "/worker/trainer/trainctl-rank");
    ASSERT_TRUE(cluster_->StartCoordinator());
    ASSERT_TRUE(cluster_->StartWorker("w0"));
    ASSERT_TRUE(cluster_->StartWorker("w1"));
    ASSERT_TRUE(cluster_->WaitWorkers(2));
  }
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(TrainE2ETest, ClassicExampleTrainsOnShardsAndExportsTheModel) {
  std::string ckpt = cluster_->dir() + "/ckpt";
  v1::JobSpec spec = Classic(3, ckpt);
  spec.mutable_tensorboard()->set_enabled(true);  // under the checkpoint dir
  std::string id = cluster_->Submit(spec);
  ASSERT_FALSE(id.empty());
  grpc::ClientContext ctx;
  v1::WatchJobRequest req;
  req.set_job_id(id);
  req.set_include_history(true);
  auto reader = cluster_->jobs()->WatchJob(&ctx, req);
  std::map<int, std::set<int>> epochs_per_rank;
  std::map<int, int64_t> samples_per_rank;
  std::map<int64_t, double> rank0_loss;  // global step -> train loss
  std::vector<std::string> timeline;     // rank 0's epoch_end and checkpoint events, in order
  v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
  v1::JobUpdate u;
  while (reader->Read(&u)) {
    if (u.has_event() && u.event().rank() == 0 &&
        (u.event().type() == "epoch_end" || u.event().type() == "checkpoint")) {
      timeline.push_back(u.event().type());
    }
    for (const auto& p : u.metrics().points()) {
      if (p.kind() == v1::MetricPoint::KIND_EPOCH_END) epochs_per_rank[p.rank()].insert(p.epoch());
      if (p.kind() == v1::MetricPoint::KIND_TRAIN) {
        samples_per_rank[p.rank()] = std::max(samples_per_rank[p.rank()], p.samples_seen());
        if (p.rank() == 0) rank0_loss[p.epoch() * p.steps_per_epoch() + p.step()] = p.loss();
      }
    }
    if (u.has_job()) last = u.job().state();
  }
  ASSERT_EQ(last, v1::JOB_STATE_SUCCEEDED) << cluster_->Get(id).state_reason();
  // Issue #27 item 11: each epoch's end comes before the checkpoint after it.
  EXPECT_THAT(timeline, ::testing::ElementsAre("epoch_end", "checkpoint", "epoch_end", "checkpoint",
                                               "epoch_end", "checkpoint"));
  EXPECT_EQ(epochs_per_rank[0], (std::set<int>{0, 1, 2}));
  EXPECT_EQ(epochs_per_rank[1], (std::set<int>{0, 1, 2}));
  // DistributedSampler: each rank sees half of the 3000 samples per epoch.
  EXPECT_EQ(samples_per_rank[0], 3 * 1500);
  EXPECT_EQ(samples_per_rank[1], 3 * 1500);
  v1::Job j = cluster_->Get(id);
  EXPECT_NE(j.attempts(0).ranks(0).worker_id(), j.attempts(0).ranks(1).worker_id());
  std::string py = "/usr/bin/python3 -c \"import torch; m=torch.jit.load('" + ckpt + "/" + id +
                   ".model.pt'); assert tuple(m(torch.randn(3,5)).shape)==(3,2)\"";
  EXPECT_EQ(std::system(py.c_str()), 0) << "the exported model runs in Python";

  // TensorBoard: rank 0's event file, read by an independent reader, holds
  // the same train losses at the same global steps as the metric stream.
  std::string src = std::getenv("TRAINCTL_SOURCE_DIR") ? std::getenv("TRAINCTL_SOURCE_DIR") : ".";
  std::string out = cluster_->dir() + "/tfevents.jsonl";
  std::string read = "/usr/bin/python3 " + src + "/tests/support/read_tfevents.py " + ckpt +
                     "/tensorboard > " + out + " 2>&1";
  ASSERT_EQ(std::system(read.c_str()), 0) << read;
  std::ifstream in(out);
  std::map<int64_t, double> tb_loss;
  std::set<std::string> tags;
  std::regex step_re("\"step\": (\\d+)"), loss_re("\"train/loss\": ([-0-9.eE+]+)"),
      tag_re("\"([a-z_/]+)\": ");
  for (std::string line; std::getline(in, line);) {
    std::smatch m, l;
    for (auto it = std::sregex_iterator(line.begin(), line.end(), tag_re);
         it != std::sregex_iterator(); ++it) {
      tags.insert((*it)[1]);
    }
    if (std::regex_search(line, m, step_re) && std::regex_search(line, l, loss_re)) {
      tb_loss[std::stoll(m[1])] = std::stod(l[1]);
    }
  }
  ASSERT_FALSE(rank0_loss.empty());
  ASSERT_EQ(tb_loss.size(), rank0_loss.size());
  for (const auto& [step, loss] : rank0_loss) {
    ASSERT_EQ(tb_loss.count(step), 1u) << "step " << step;
    EXPECT_NEAR(tb_loss[step], loss, 1e-6 * std::max(1.0, std::abs(loss))) << "step " << step;
  }
  EXPECT_TRUE(tags.count("train/lr") && tags.count("train/samples_per_sec") &&
              tags.count("epoch/loss"))
      << "tags seen: " << tags.size();
  // Rank 0 reported where it put the model; the job says so.
  EXPECT_EQ(j.final_model(), ckpt + "/" + id + ".model.pt");
  EXPECT_EQ(j.final_model_worker(), j.attempts(0).ranks(0).worker_id());
  EXPECT_GT(j.metric_summary().train_points(), 0);
  EXPECT_GT(j.metric_summary().mean_samples_per_sec(), 0);
  EXPECT_GT(j.metric_summary().last_loss(), 0);

  // The metric history outlives the job: every epoch end of rank 1, in pages.
  v1::GetMetricsRequest mreq;
  mreq.set_job_id(id);
  mreq.set_rank(1);
  mreq.set_kind(v1::MetricPoint::KIND_EPOCH_END);
  std::vector<int> epochs;
  do {
    grpc::ClientContext mctx;
    v1::GetMetricsResponse resp;
    ASSERT_TRUE(cluster_->jobs()->GetMetrics(&mctx, mreq, &resp).ok());
    for (const auto& b : resp.batches()) {
      EXPECT_EQ(b.attempt(), 1);
      for (const auto& p : b.points()) {
        EXPECT_EQ(p.rank(), 1);
        epochs.push_back(p.epoch());
      }
    }
    mreq.set_page_token(resp.next_page_token());
  } while (!mreq.page_token().empty());
  EXPECT_THAT(epochs, ::testing::ElementsAre(0, 1, 2));
}

// A raw TCP client on the store's address (which GetJob shows) as an
// attacker would write one: it reads the greeting and sends a request in the
// store's framing, without a proof or with a proof made from a wrong secret.
// The store closes on it with no reply, and the victim job still succeeds.
std::string ReadAllFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int DialStore(const std::string& address) {
  std::string host;
  uint16_t port = 0;
  if (!dist::RendezvousStore::ParseAddress(address, &host, &port).ok()) return -1;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return -1;
  int fd = socket(res->ai_family, SOCK_STREAM, 0);
  if (connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  return fd;
}

// Sends `after_greeting(server nonce)` once the greeting arrived; returns
// what came back before the store closed the connection, or "<open>" when it
// still had not closed after 10 s.
std::string Attack(const std::string& address,
                   const std::function<std::string(const std::string&)>& after_greeting) {
  int fd = DialStore(address);
  for (absl::Time until = absl::Now() + absl::Seconds(10); fd < 0 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(10));  // rank 0 may still be starting
    fd = DialStore(address);
  }
  if (fd < 0) return "<no connection>";
  std::string got;
  bool closed = false;
  bool sent = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!closed && absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[512];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      closed = true;
      break;
    }
    got.append(buf, static_cast<size_t>(n));
    if (!sent && got.size() >= 8 + dist::kRendezvousNonceBytes) {
      const std::string request = after_greeting(got.substr(8, dist::kRendezvousNonceBytes));
      (void)!send(fd, request.data(), request.size(), MSG_NOSIGNAL);
      got.erase(0, 8 + dist::kRendezvousNonceBytes);
      sent = true;
    }
  }
  close(fd);
  return closed && sent ? got : "<open>";
}

std::string SetRequest(const std::string& key, const std::string& value) {
  std::string f(1, '\x01');
  auto u32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) f.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  u32(static_cast<uint32_t>(key.size()));
  f += key;
  u32(static_cast<uint32_t>(value.size()));
  f += value;
  return f;
}

TEST_F(TrainE2ETest, RendezvousStoreRefusesStrangersWhileTheJobSucceeds) {
  std::string ckpt = cluster_->dir() + "/ckpt";
  std::string id = cluster_->Submit(Classic(6, ckpt, 60000));
  ASSERT_FALSE(id.empty());
  // Every rank has met at the store (RUNNING): the attack comes while rank 0
  // still hosts it, during training.
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_RUNNING, absl::Seconds(60));
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.state_reason();
  absl::Time deadline;
  const std::string address = j.attempts(0).rendezvous().gloo_store_address();
  ASSERT_FALSE(address.empty());
  // Rank 0's config holds the secret, readable by its owner alone.
  std::string conf;
  deadline = absl::Now() + absl::Seconds(30);
  while (conf.empty() && absl::Now() < deadline) {
    for (const std::string name : {"w0", "w1"}) {
      const std::string path =
          cluster_->dir() + "/worker-" + name + "/jobs/" + id + "/attempt-1/rank-0.conf";
      struct stat st {};
      if (stat(path.c_str(), &st) == 0) {
        EXPECT_EQ(st.st_mode & 0777, 0600u) << path;
        conf = ReadAllFile(path);
      }
    }
    if (conf.empty()) absl::SleepFor(absl::Milliseconds(20));
  }
  const auto at = conf.find("run.store_secret=");
  ASSERT_NE(at, std::string::npos) << conf;
  const std::string secret = conf.substr(at + 17, 64);
  ASSERT_EQ(secret.size(), 64u);

  const std::string key = absl::StrCat("/trainctl/", id, "/1/resume_from");
  // No proof: a request where the proof belongs.
  EXPECT_EQ(Attack(address,
                   [&](const std::string&) {
                     return SetRequest(key, "/evil.ckpt") + std::string(64, 0);
                   }),
            "");
  // A proof made with a wrong secret, then the same request.
  const std::string wrong = dist::NewRendezvousSecret();
  EXPECT_EQ(Attack(address,
                   [&](const std::string& sn) {
                     const std::string cn(dist::kRendezvousNonceBytes, 'c');
                     return cn + dist::RendezvousMac(wrong, "client" + sn + cn) +
                            SetRequest(key, "/evil.ckpt");
                   }),
            "");
  // The store's own client with a wrong secret is refused too.
  auto client = dist::RendezvousStore::Connect(address, absl::Seconds(5), wrong);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kPermissionDenied) << client.status();
  // All of it happened while the victim trained.
  EXPECT_EQ(cluster_->Get(id).state(), v1::JOB_STATE_RUNNING);

  j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(120));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  EXPECT_EQ(j.attempts_size(), 1);
  // The secret is nowhere a client or an operator reads: not in the job,
  // nor in the coordinator's or the workers' logs.
  EXPECT_FALSE(absl::StrContains(j.SerializeAsString(), secret));
  EXPECT_FALSE(absl::StrContains(j.DebugString(), secret));
  for (const std::string log : {"coordinator-0.log", "worker-w0.log", "worker-w1.log"}) {
    EXPECT_FALSE(absl::StrContains(ReadAllFile(cluster_->dir() + "/" + log), secret)) << log;
  }
}

TEST_F(TrainE2ETest, KilledDaemonMidRunRestartsFromTheCheckpoint) {
  std::string ckpt = cluster_->dir() + "/ckpt";
  v1::JobSpec spec = Classic(6, ckpt, 60000);
  std::string id = cluster_->Submit(spec);
  // Wait for the coordinator's record of rank 0's first checkpoint, then
  // kill the worker that holds rank 1.
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  v1::Job j = cluster_->Get(id);
  while (j.checkpoints_size() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(25));
    j = cluster_->Get(id);
  }
  ASSERT_GT(j.checkpoints_size(), 0);
  const int64_t checkpoint_step = j.checkpoints(0).global_step();
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING);
  std::string victim;
  for (const std::string name : {"w0", "w1"}) {
    if (!Cluster::ProcessesMatching("/worker-" + name + "/jobs/" + id + "/attempt-1/rank-1")
             .empty())
      victim = name;
  }
  ASSERT_FALSE(victim.empty());
  cluster_->KillWorker(victim, SIGKILL);
  j = cluster_->WaitState(id, v1::JOB_STATE_RESTARTING, absl::Seconds(20));
  ASSERT_EQ(j.state(), v1::JOB_STATE_RESTARTING) << j.state_reason();
  // The lost worker is the cause, not the survivor whose collective broke
  // ("Connection reset by peer"), whichever report reached the coordinator
  // first: the survivor's error (blamed on the lost worker) or the lease.
  const std::string victim_id = j.attempts(0).ranks(1).worker_id();
  const std::string& reason = j.attempts(0).reason();
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_WORKER_LOST) << reason;
  const bool blamed = absl::StartsWith(reason, "worker " + victim_id + " (host ") &&
                      absl::StrContains(reason, "was lost; rank 0 on ");
  const bool lease_first =
      absl::StartsWith(reason, "rank 1 on ") &&
      absl::StrContains(reason, "(worker " + victim_id + ") was lost with its worker");
  EXPECT_TRUE(blamed || lease_first) << reason;
  ASSERT_TRUE(cluster_->StartWorker(victim));
  j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(120));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  ASSERT_EQ(j.attempts_size(), 2);
  ASSERT_TRUE(j.attempts(1).has_resume());
  EXPECT_GE(j.attempts(1).resume().global_step(), checkpoint_step);
  EXPECT_EQ(j.attempts(1).resume().job_id(), id);
  // Attempt 2 started from a checkpoint: its ranks trained fewer than 6 epochs.
  grpc::ClientContext lctx;
  v1::GetLogsRequest lreq;
  lreq.set_job_id(id);
  lreq.set_attempt(2);
  lreq.set_rank(0);
  auto logs = cluster_->jobs()->GetLogs(&lctx, lreq);
  std::string all;
  v1::LogChunk c;
  while (logs->Read(&c)) {
    for (const auto& l : c.lines()) all += l.text() + "\n";
  }
  EXPECT_THAT(
      all, ::testing::HasSubstr(absl::StrCat("global step ", j.attempts(1).resume().global_step())))
      << all;
}

}  // namespace
}  // namespace trainctl
