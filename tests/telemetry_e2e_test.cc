// At-least-once telemetry and worker daemon hygiene, with real processes:
// the trainctl-coordinator and trainctl-worker binaries on loopback and a
// stand-in rank (tests/support/fake_rank.py) whose metrics and logs
// depend only on the job.
//
//  * A coordinator SIGKILLed for 5 s mid-job and restarted on the same
//    database and port: what a watcher and `trainctl logs` (GetLogs) get
//    afterwards equals a clean run of the same job — every metric point,
//    every log line, once — and the events are in order.
//  * The coordinator's database disk filling mid-job and freed again: the
//    workers stay connected and the same holds (issue #30 item 4).
//  * A rank printing 100 MB in a tight loop: the daemon's memory stays
//    within 100 MB of its baseline and it keeps heartbeating (ALIVE).
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "common/time_util.h"
#include "tests/support/cluster.h"
#include "tests/support/source_dir.h"

namespace trainctl {
namespace {

using trainctl::testing::Cluster;
using trainctl::testing::SourceDir;

v1::JobSpec Spec(const std::string& name, int world_size, int epochs) {
  ParsedJobSpec p = ParseJobSpecYaml(
      "model: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n",
      "telemetry.yaml",
      {"name=" + name, absl::StrCat("world_size=", world_size),
       absl::StrCat("training.epochs=", epochs), "restart.max_restarts=0"});
  EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
  return p.spec;
}

std::unique_ptr<Cluster> NewCluster() {
  return std::make_unique<Cluster>(trainctl::testing::BuildDirOfThisTest(),
                                   SourceDir() + "/tests/support/fake_rank.py");
}

// Everything a client can get about a finished job.
struct Telemetry {
  // (rank, epoch, step, kind) -> how many times the point was stored.
  std::map<std::tuple<int, int, int64_t, int>, int> points;
  // When the worker took each point from its rank.
  std::vector<absl::Time> point_times;
  // Per rank, the log lines in order.
  std::map<int, std::vector<std::string>> logs;
  // Event types and messages in seq order.
  std::vector<std::string> events;
  std::vector<int64_t> event_seqs;
  v1::Job job;
};

Telemetry Collect(Cluster& cluster, const std::string& id) {
  Telemetry t;
  // Bounded: a job that never ends (lost end statuses) fails the test, not hangs it.
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(30);
  EXPECT_TRUE(
      cluster
          .Follow(id, absl::Seconds(30),
                  [&](const v1::JobUpdate& u) {
                    for (const v1::MetricPoint& p : u.metrics().points()) {
                      ++t.points[{p.rank(), p.epoch(), p.step(), static_cast<int>(p.kind())}];
                      t.point_times.push_back(FromTimestamp(p.time()));
                    }
                    if (u.has_event()) {
                      t.events.push_back(absl::StrCat(u.event().type(), ": ", u.event().message()));
                      t.event_seqs.push_back(u.event().seq());
                    }
                    if (u.has_job()) t.job = u.job();
                  })
          .ok());
  grpc::ClientContext lctx;
  lctx.set_deadline(deadline);
  v1::GetLogsRequest lreq;
  lreq.set_job_id(id);
  auto logs = cluster.jobs()->GetLogs(&lctx, lreq);
  v1::LogChunk c;
  while (logs->Read(&c)) {
    for (const v1::LogLine& l : c.lines()) t.logs[c.rank()].push_back(l.text());
  }
  EXPECT_TRUE(logs->Finish().ok());
  return t;
}

constexpr int kWorld = 2;
constexpr int kEpochs = 8;
constexpr int kSteps = 20;  // fake_rank.py CHATTY_STEPS

// Runs the chatty job on a fresh cluster; `fault` runs once the job is past
// its first epoch.
Telemetry RunChattyJob(const std::function<void(Cluster&)>& fault,
                       const std::vector<std::string>& coordinator_flags = {}) {
  std::unique_ptr<Cluster> cluster = NewCluster();
  EXPECT_TRUE(cluster->StartCoordinator(coordinator_flags));
  for (int i = 0; i < kWorld; ++i) EXPECT_TRUE(cluster->StartWorker(absl::StrCat("w", i)));
  EXPECT_TRUE(cluster->WaitWorkers(kWorld));
  std::string id = cluster->Submit(Spec("chatty", kWorld, kEpochs));
  EXPECT_FALSE(id.empty());
  if (fault) {
    absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      v1::Job j = cluster->Get(id);
      if (j.state() == v1::JOB_STATE_RUNNING && j.progress().epoch() >= 1) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    v1::Job j = cluster->Get(id);
    EXPECT_GE(j.progress().epoch(), 1);
    EXPECT_LT(j.progress().epoch(), kEpochs - 2) << "the fault comes mid-job";
    fault(*cluster);
  }
  v1::Job j = cluster->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(90));
  EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  return Collect(*cluster, id);
}

TEST(TelemetryE2ETest, CoordinatorKilledForFiveSecondsMidJobLosesNoTelemetry) {
  Telemetry clean = RunChattyJob(nullptr);
  absl::Time down_from, down_to;
  Telemetry faulted = RunChattyJob([&](Cluster& c) {
    c.KillCoordinator(SIGKILL);
    down_from = absl::Now();
    // The fault itself: the coordinator is away for 5 s while the ranks
    // train (and the workers hold what they produce).
    absl::SleepFor(absl::Seconds(5));
    ASSERT_TRUE(c.StartCoordinator());
    down_to = absl::Now();
  });
  // The outage overlapped the job: points were produced while nobody could
  // take them.
  int64_t during = std::count_if(faulted.point_times.begin(), faulted.point_times.end(),
                                 [&](absl::Time t) { return t >= down_from && t <= down_to; });
  EXPECT_GT(during, 0);
  std::cerr << during << " of " << faulted.point_times.size()
            << " metric points were produced while the coordinator was down\n";

  // The clean run is what the job produces: every point once.
  ASSERT_EQ(clean.points.size(), static_cast<size_t>(kWorld * kEpochs * (kSteps + 1)));
  for (const auto& [key, n] : clean.points) EXPECT_EQ(n, 1);
  // The faulted run: the same points, each exactly once (nothing lost,
  // nothing duplicated by the resend).
  EXPECT_EQ(faulted.points, clean.points);

  // Log lines: per rank the same lines in the same order.
  ASSERT_EQ(clean.logs.size(), static_cast<size_t>(kWorld));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(clean.logs[r].size(), static_cast<size_t>(1 + kEpochs * (kSteps + 1)))
        << "rank " << r;
    EXPECT_EQ(faulted.logs[r], clean.logs[r]) << "rank " << r;
  }

  // Events in order: one epoch_end per epoch, ascending, and succeeded last.
  for (const Telemetry* t : {&clean, &faulted}) {
    std::vector<std::string> epoch_ends;
    for (const std::string& e : t->events) {
      if (absl::StartsWith(e, "epoch_end")) epoch_ends.push_back(e);
    }
    ASSERT_EQ(epoch_ends.size(), static_cast<size_t>(kEpochs))
        << ::testing::PrintToString(t->events);
    for (int e = 0; e < kEpochs; ++e) {
      EXPECT_THAT(epoch_ends[e],
                  ::testing::HasSubstr(absl::StrCat("epoch ", e + 1, "/", kEpochs, " done")));
    }
    ASSERT_FALSE(t->events.empty());
    EXPECT_TRUE(absl::StartsWith(t->events.back(), "succeeded"))
        << ::testing::PrintToString(t->events);
    EXPECT_TRUE(std::is_sorted(t->event_seqs.begin(), t->event_seqs.end()));
  }
  // Progress follows the data: the final status is the clean run's.
  EXPECT_EQ(faulted.job.progress().epoch(), clean.job.progress().epoch());
  EXPECT_EQ(faulted.job.progress().step(), clean.job.progress().step());
  EXPECT_EQ(faulted.job.progress().samples_seen(), clean.job.progress().samples_seen());
  EXPECT_DOUBLE_EQ(faulted.job.progress().last_eval().accuracy(), 0.75);
}

// A tmpfs of `mb` MiB mounted on a new directory, or "" when this host does
// not let the test mount one (not root); unmounted and removed at the end.
struct SmallDisk {
  std::string dir;
  explicit SmallDisk(int mb) {
    char tmpl[] = "/tmp/trainctl-small-disk-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return;
    const std::string cmd =
        absl::StrCat("mount -t tmpfs -o size=", mb, "m tmpfs ", tmpl, " 2>/dev/null");
    if (std::system(cmd.c_str()) != 0) {
      ::rmdir(tmpl);
      return;
    }
    dir = tmpl;
  }
  ~SmallDisk() {
    if (dir.empty()) return;
    if (std::system(absl::StrCat("umount -l ", dir).c_str()) != 0)
      std::cerr << "could not unmount " << dir << "\n";
    ::rmdir(dir.c_str());
  }
  // Writes `path` until the disk is full (ENOSPC); the bytes written.
  int64_t Fill(const std::string& path) const {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return 0;
    std::vector<char> block(64 << 10, 'x');
    int64_t total = 0;
    while (std::fwrite(block.data(), 1, block.size(), f) == block.size())
      total += static_cast<int64_t>(block.size());
    std::fclose(f);
    return total;
  }
};

v1::ListWorkersResponse ListWorkers(Cluster& c) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListWorkersRequest req;
  req.set_include_gone(true);
  v1::ListWorkersResponse resp;
  grpc::Status s = c.workers_stub()->ListWorkers(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

// Issue #30 item 4: the coordinator's database fills its disk mid-job. The
// workers stay connected (ALIVE, never LOST) past several leases, the store
// reports itself failing (ListWorkers' store), the telemetry waits in the
// workers' buffers; once space returns, the job SUCCEEDS with one attempt
// and every metric point and log line is stored exactly once — the same as
// a clean run.
TEST(TelemetryE2ETest, AFullStoreDiskKeepsWorkersConnectedAndLosesNoTelemetry) {
  SmallDisk disk(24);
  if (disk.dir.empty()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  Telemetry clean = RunChattyJob(nullptr);
  bool saw_failing = false;
  int lost_seen = 0;
  Telemetry faulted = RunChattyJob(
      [&](Cluster& c) {
        const std::string filler = disk.dir + "/filler";
        EXPECT_GT(disk.Fill(filler), 0);
        // The next writes that need new space fail (the WAL grows with each
        // batch of metrics); wait for the store to say so.
        absl::Time deadline = absl::Now() + absl::Seconds(20);
        while (absl::Now() < deadline && !saw_failing) {
          v1::ListWorkersResponse r = ListWorkers(c);
          saw_failing = r.store().failing();
          if (!saw_failing) absl::SleepFor(absl::Milliseconds(50));
        }
        ASSERT_TRUE(saw_failing) << "the store never failed with its disk full";
        v1::ListWorkersResponse r = ListWorkers(c);
        EXPECT_GT(r.store().failed_writes(), 0);
        EXPECT_FALSE(r.store().last_error().empty());
        EXPECT_TRUE(r.store().has_failing_since());
        // Three leases (1.5 s each) with the disk full: nobody is LOST.
        absl::Time until = absl::Now() + absl::Milliseconds(4500);
        while (absl::Now() < until) {
          const v1::ListWorkersResponse now = ListWorkers(c);
          for (const v1::Worker& w : now.workers())
            lost_seen += w.state() != v1::WORKER_STATE_ALIVE;
          absl::SleepFor(absl::Milliseconds(100));
        }
        std::remove(filler.c_str());
        deadline = absl::Now() + absl::Seconds(30);
        while (absl::Now() < deadline && ListWorkers(c).store().failing())
          absl::SleepFor(absl::Milliseconds(50));
        EXPECT_FALSE(ListWorkers(c).store().failing()) << "the store recovers once there is room";
      },
      {"--db=" + disk.dir + "/state.db"});
  EXPECT_TRUE(saw_failing);
  EXPECT_EQ(lost_seen, 0) << "a worker left ALIVE while the store was failing";
  EXPECT_EQ(faulted.job.state(), v1::JOB_STATE_SUCCEEDED) << faulted.job.state_reason();
  EXPECT_EQ(faulted.job.restarts(), 0) << "no attempt failed over the store";
  for (const std::string& e : faulted.events) {
    EXPECT_FALSE(absl::StartsWith(e, "attempt_failed") || absl::StartsWith(e, "restarting")) << e;
  }
  ASSERT_EQ(clean.points.size(), static_cast<size_t>(kWorld * kEpochs * (kSteps + 1)));
  EXPECT_EQ(faulted.points, clean.points);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(faulted.logs[r], clean.logs[r]) << "rank " << r;
}

// VmRSS of a process in bytes (0 when it is gone).
int64_t RssBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      int64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

TEST(TelemetryE2ETest, RankPrinting100MBKeepsTheDaemonBoundedAndAlive) {
  std::unique_ptr<Cluster> cluster = NewCluster();
  ASSERT_TRUE(cluster->StartCoordinator());
  ASSERT_TRUE(cluster->StartWorker("w0"));
  ASSERT_TRUE(cluster->WaitWorkers(1));
  const pid_t daemon = cluster->worker("w0")->pid();
  const int64_t baseline = RssBytes(daemon);
  ASSERT_GT(baseline, 0);

  std::string id = cluster->Submit(Spec("flood", 1, 1));
  ASSERT_FALSE(id.empty());
  int64_t peak = baseline;
  int polls = 0;
  v1::Job j;
  absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (absl::Now() < deadline) {
    peak = std::max(peak, RssBytes(daemon));
    // The worker keeps heartbeating: never LOST while its rank floods.
    grpc::ClientContext ctx;
    v1::ListWorkersRequest req;
    req.set_include_gone(true);
    v1::ListWorkersResponse resp;
    ASSERT_TRUE(cluster->workers_stub()->ListWorkers(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.workers_size(), 1);
    ASSERT_EQ(resp.workers(0).state(), v1::WORKER_STATE_ALIVE) << "poll " << polls;
    ++polls;
    j = cluster->Get(id);
    if (j.state() == v1::JOB_STATE_SUCCEEDED || j.state() == v1::JOB_STATE_FAILED) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  EXPECT_LT(peak - baseline, int64_t{100} << 20)
      << "baseline " << (baseline >> 20) << " MiB, peak " << (peak >> 20) << " MiB";
  std::cerr << "daemon RSS: baseline " << (baseline >> 20) << " MiB, peak " << (peak >> 20)
            << " MiB over " << polls << " polls\n";

  // The flood was cut to the rate, and the cut is said in the logs.
  Telemetry t = Collect(*cluster, id);
  int64_t dropped_note = 0, flood_lines = 0;
  for (const std::string& l : t.logs[0]) {
    dropped_note += absl::StrContains(l, "log lines dropped");
    flood_lines += absl::StartsWith(l, "flood line");
  }
  EXPECT_GT(dropped_note, 0);
  EXPECT_LT(flood_lines, 100000) << "1,176,000 lines printed; the rest dropped by the rate limit";
  EXPECT_EQ(t.logs[0].back(), "epoch 0 done");
}

}  // namespace
}  // namespace trainctl
