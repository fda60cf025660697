#include "client/test_cluster.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/auth/secret.h"

#include "absl/strings/str_cat.h"
#include "common/temp_dir.h"
#include "common/time_util.h"
#include "trainctl/v1/job_service.grpc.pb.h"

namespace trainctl::testing {

std::string MakeTempDir() { return trainctl::MakeTempDirRemovedAtExit("trainctl_client"); }

std::string WriteFile(const std::string& dir, const std::string& name, const std::string& content) {
  std::string path = dir + "/" + name;
  std::ofstream(path) << content;
  return path;
}

std::string ValidJobYaml(int world_size) {
  return absl::StrCat(
      "name: classic\n"
      "world_size: ",
      world_size,
      "\n"
      "device: cpu\n"
      "model: {name: mlp, input_dim: 5, classes: 2}\n"
      "data:\n"
      "  train: {format: synthetic, length: 600, size: 5, classes: 2}\n"
      "  eval: {format: synthetic, length: 60, size: 5, classes: 2, seed: 1}\n"
      "  batch_size: 30\n"
      "training:\n"
      "  epochs: 2\n"
      "  optimizer: {name: adam, lr: 0.001}\n");
}

cli::CliEnvironment TestEnvironment() {
  cli::CliEnvironment env;
  env.getenv = [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  env.out_is_terminal = false;
  env.progress_interval = absl::Seconds(5);
  env.dry_run_connect_timeout = absl::Seconds(2);
  return env;
}

CliRun RunTrainctl(const std::vector<std::string>& args, const cli::CliEnvironment& env) {
  std::vector<const char*> argv = {"trainctl"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  CliRun run;
  run.code = cli::RunCli(static_cast<int>(argv.size()), argv.data(), out, err, env);
  run.out = out.str();
  run.err = err.str();
  return run;
}

TestCluster::TestCluster() : dir_(MakeTempDir()) {
  coordinator::CoordinatorOptions o;
  o.listen = "127.0.0.1:0";
  o.db_path = dir_ + "/state.db";
  o.registry.heartbeat_interval = absl::Milliseconds(100);
  o.registry.lease_timeout = absl::Seconds(2);
  o.check_interval = absl::Milliseconds(50);
  o.http_listen = "127.0.0.1:0";  // /metrics and the dashboard
  server_ = std::make_unique<coordinator::CoordinatorServer>(o);
  absl::StatusOr<std::string> addr = server_->Start();
  EXPECT_TRUE(addr.ok()) << addr.status();
  if (addr.ok()) address_ = *addr;
  auth::ChannelSecurity security;
  security.token = server_->admin_token();
  channel_ = *auth::MakeChannel(address_, security, grpc::ChannelArguments());
  absl::StatusOr<std::string> wt = server_->IssueToken(v1::ROLE_WORKER, "fake-workers");
  EXPECT_TRUE(wt.ok()) << wt.status();
  if (wt.ok()) worker_token_ = *wt;
  worker_channel_ = *auth::MakeChannel(address_, auth::ChannelSecurity{}, grpc::ChannelArguments());
}

TestCluster::~TestCluster() {
  for (auto& w : workers_) w->Leave();
  workers_.clear();
  server_->Shutdown();
  server_.reset();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

FakeWorker& TestCluster::AddWorker(const std::string& id, int cpu_slots,
                                   std::map<std::string, std::string> labels) {
  workers_.push_back(std::make_unique<FakeWorker>(worker_channel_, id, cpu_slots,
                                                  absl::Milliseconds(100), worker_token_));
  workers_.back()->set_labels(std::move(labels));
  EXPECT_TRUE(workers_.back()->Connect()) << "worker " << id << " did not register";
  return *workers_.back();
}

void TestCluster::RemoveWorker(const std::string& id) {
  for (auto it = workers_.begin(); it != workers_.end(); ++it) {
    if ((*it)->id() != id) continue;
    (*it)->Leave();
    workers_.erase(it);
    return;
  }
}

std::string TestCluster::WaitForStartedJob(const std::string& except, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    for (auto& w : workers_) {
      auto m = w->WaitFor(
          [&](const v1::CoordinatorMessage& m) {
            return m.has_start_ranks() && m.start_ranks().job_id() != except;
          },
          absl::Milliseconds(20));
      if (m) return m->start_ranks().job_id();
    }
  }
  ADD_FAILURE() << "no worker was told to start a job";
  return "";
}

bool TestCluster::StartAttempt(const std::string& job_id, int attempt,
                               std::vector<RankHome>* ranks) {
  auto is_start = [&](const v1::CoordinatorMessage& m) {
    return m.has_start_ranks() && m.start_ranks().job_id() == job_id &&
           m.start_ranks().attempt() == attempt;
  };
  // Which workers got ranks: wait until the starts cover the world size.
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  FakeWorker* producer = nullptr;
  int world = -1;
  while (absl::Now() < deadline) {
    ranks->clear();
    producer = nullptr;
    for (auto& w : workers_) {
      auto m = w->WaitFor(is_start, absl::Milliseconds(1));
      if (!m) continue;
      for (const v1::RankAssignment& r : m->start_ranks().ranks()) {
        ranks->push_back({w.get(), r.rank()});
        world = r.world_size();
      }
      if (m->start_ranks().produce_rendezvous()) producer = w.get();
    }
    if (world > 0 && static_cast<int>(ranks->size()) == world && producer != nullptr) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (world <= 0 || static_cast<int>(ranks->size()) != world || producer == nullptr) {
    ADD_FAILURE() << "attempt " << attempt << " of " << job_id << " was not started";
    return false;
  }
  v1::WorkerMessage rdv;
  rdv.mutable_rendezvous()->set_job_id(job_id);
  rdv.mutable_rendezvous()->set_attempt(attempt);
  rdv.mutable_rendezvous()->mutable_info()->set_gloo_store_address("127.0.0.1:29500");
  if (!producer->Send(rdv)) return false;
  for (const RankHome& h : *ranks) {
    if (!h.worker->WaitFor([&](const v1::CoordinatorMessage& m) {
          return m.has_rendezvous() && m.rendezvous().job_id() == job_id &&
                 m.rendezvous().attempt() == attempt;
        })) {
      ADD_FAILURE() << "no rendezvous delivered";
      return false;
    }
  }
  for (const RankHome& h : *ranks)
    h.worker->SendStatus(job_id, attempt, h.rank, v1::RANK_STATE_RUNNING);
  return WaitState(job_id, v1::JOB_STATE_RUNNING);
}

bool TestCluster::RunAttemptToSuccess(const std::string& job_id, int attempt, int epochs) {
  std::vector<RankHome> ranks;
  if (!StartAttempt(job_id, attempt, &ranks)) return false;
  const int64_t steps = 10;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    for (const RankHome& h : ranks) {
      v1::WorkerMessage m;
      v1::MetricBatch* b = m.mutable_metrics();
      b->set_job_id(job_id);
      b->set_attempt(attempt);
      v1::MetricPoint* train = b->add_points();
      train->set_kind(v1::MetricPoint::KIND_TRAIN);
      train->set_rank(h.rank);
      train->set_epoch(epoch);
      train->set_step(steps);
      train->set_steps_per_epoch(steps);
      train->set_loss(0.5 / (epoch + 1));
      train->set_samples_per_sec(1000);
      train->set_samples_seen((epoch + 1) * steps * 30);
      SetTimestamp(absl::Now(), train->mutable_time());
      v1::MetricPoint* end = b->add_points();
      end->set_kind(v1::MetricPoint::KIND_EPOCH_END);
      end->set_rank(h.rank);
      end->set_epoch(epoch);
      end->set_step(steps);
      end->set_steps_per_epoch(steps);
      end->set_loss(0.5 / (epoch + 1));
      end->mutable_eval()->set_epoch(epoch);
      end->mutable_eval()->set_loss(0.25 / (epoch + 1));
      end->mutable_eval()->set_accuracy(0.75 + 0.1 * epoch);
      end->mutable_eval()->set_samples(60);
      if (!h.worker->Send(m)) return false;
    }
  }
  for (const RankHome& h : ranks) {
    if (!SendLogs(job_id, attempt, h.rank,
                  {absl::StrCat("rank ", h.rank, " trained ", epochs, " epochs")})) {
      return false;
    }
  }
  for (const RankHome& h : ranks)
    h.worker->SendStatus(job_id, attempt, h.rank, v1::RANK_STATE_SUCCEEDED);
  return WaitState(job_id, v1::JOB_STATE_SUCCEEDED);
}

bool TestCluster::FailRank(const std::string& job_id, int attempt, int rank,
                           const std::string& message) {
  std::vector<RankHome> ranks;
  if (!StartAttempt(job_id, attempt, &ranks)) return false;
  for (const RankHome& h : ranks) {
    if (h.rank != rank) continue;
    v1::WorkerMessage m;
    v1::RankStatus* s = m.mutable_rank_status();
    s->set_job_id(job_id);
    s->set_attempt(attempt);
    s->set_rank(rank);
    s->set_state(v1::RANK_STATE_FAILED);
    s->mutable_exit()->set_exit_code(3);
    s->mutable_exit()->set_kind(v1::FAILURE_KIND_EXIT);
    s->mutable_exit()->set_message(message);
    s->mutable_exit()->add_last_log_lines("Traceback: the last words of rank " +
                                          std::to_string(rank));
    return h.worker->Send(m);
  }
  ADD_FAILURE() << "rank " << rank << " not placed";
  return false;
}

FakeWorker* TestCluster::WorkerOf(const std::string& job_id, int attempt, int rank) {
  for (auto& w : workers_) {
    auto m = w->WaitFor(
        [&](const v1::CoordinatorMessage& m) {
          if (!m.has_start_ranks() || m.start_ranks().job_id() != job_id ||
              m.start_ranks().attempt() != attempt) {
            return false;
          }
          for (const auto& r : m.start_ranks().ranks()) {
            if (r.rank() == rank) return true;
          }
          return false;
        },
        absl::Milliseconds(1));
    if (m) return w.get();
  }
  return nullptr;
}

bool TestCluster::SendLogs(const std::string& job_id, int attempt, int rank,
                           const std::vector<std::string>& lines) {
  FakeWorker* w = WorkerOf(job_id, attempt, rank);
  if (w == nullptr) {
    ADD_FAILURE() << "no worker runs rank " << rank;
    return false;
  }
  v1::WorkerMessage m;
  v1::LogChunk* c = m.mutable_logs();
  c->set_job_id(job_id);
  c->set_attempt(attempt);
  c->set_rank(rank);
  for (const std::string& text : lines) {
    v1::LogLine* l = c->add_lines();
    l->set_rank(rank);
    l->set_stream(v1::LogLine::STREAM_STDOUT);
    l->set_text(text);
    SetTimestamp(absl::Now(), l->mutable_time());
  }
  return w->Send(m);
}

bool TestCluster::WaitState(const std::string& job_id, v1::JobState state, absl::Duration timeout) {
  auto stub = v1::JobService::NewStub(channel_);
  absl::Time deadline = absl::Now() + timeout;
  v1::Job job;
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    v1::GetJobRequest req;
    req.set_job_id(job_id);
    if (stub->GetJob(&ctx, req, &job).ok() && job.state() == state) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ADD_FAILURE() << "job " << job_id << " never reached " << v1::JobState_Name(state) << "; last "
                << v1::JobState_Name(job.state()) << " " << job.state_reason();
  return false;
}

}  // namespace trainctl::testing
