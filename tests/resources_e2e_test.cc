// Per-rank resource limits end to end (issue #26): a real coordinator and a
// real worker daemon (loopback, free ports) running command jobs with
// `resources`. A rank over its memory limit is killed by the OOM killer in
// its own cgroup and fails OUT_OF_MEMORY naming the limit, while a second
// job on the same worker keeps running and succeeds; no cgroup is left
// behind. A worker that cannot enforce limits never gets such a job: the
// scheduler keeps it off (refused at submit, or pending with the reason),
// while jobs without resources run there as before.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "worker/daemon/cgroup_limits.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using trainctl::testing::Cluster;

v1::JobSpec Spec(const std::string& yaml) {
  ParsedJobSpec p = ParseJobSpecYaml(yaml, "job.yaml");
  EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
  return p.spec;
}

// Why cgroups cannot be used here ("" when they can): the daemon runs as
// this user, so it can when a probe cgroup can be made and removed.
std::string CgroupsUnusable() {
  if (::geteuid() != 0) return "needs root to create cgroups";
  worker::CgroupLimits cg = worker::CgroupLimits::DetectHere("/sys/fs/cgroup");
  if (!cg.available()) return absl::StrCat("no writable cgroups: ", cg.unavailable_reason());
  v1::ResourceSpec r;
  r.set_memory(64 << 20);
  absl::StatusOr<worker::RankCgroup> g = cg.Create(absl::StrCat("probe-", ::getpid()), r);
  if (!g.ok()) return absl::StrCat("cannot create a memory cgroup: ", g.status().message());
  // And a process can join it, as a rank's child does before exec (v2 has
  // rules of its own about which cgroups may hold processes).
  const pid_t child = ::fork();
  if (child == 0) {
    for (int fd : g->procs_fds()) {
      if (::write(fd, "0", 1) != 1) ::_exit(1);
    }
    ::_exit(0);
  }
  int status = 0;
  const bool joined = child > 0 && ::waitpid(child, &status, 0) == child && WIFEXITED(status) &&
                      WEXITSTATUS(status) == 0;
  g->CloseProcsFds();
  if (absl::Status s = g->Remove(); !s.ok()) return std::string(s.message());
  if (!joined) return "a process cannot join a rank cgroup here";
  return "";
}

// The directories rank cgroups of this host go in (to check none is left).
std::vector<std::string> CgroupBases() {
  worker::CgroupLimits cg = worker::CgroupLimits::DetectHere("/sys/fs/cgroup");
  std::vector<std::string> out;
  if (cg.version() == worker::CgroupLimits::Version::kV2) out.push_back(cg.v2_base());
  for (const char* c : {"memory", "cpu", "pids"}) {
    if (!cg.v1_base(c).empty()) out.push_back(cg.v1_base(c));
  }
  return out;
}

// The one worker's registration, as the coordinator lists it.
v1::Worker OnlyWorker(Cluster& cluster) {
  grpc::ClientContext ctx;
  v1::ListWorkersResponse workers;
  EXPECT_TRUE(cluster.workers_stub()->ListWorkers(&ctx, v1::ListWorkersRequest(), &workers).ok());
  EXPECT_EQ(workers.workers_size(), 1);
  return workers.workers_size() > 0 ? workers.workers(0) : v1::Worker();
}

std::vector<std::string> CgroupsOf(const std::string& job_id) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const std::string& base : CgroupBases()) {
    for (fs::directory_iterator it(base, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->path().filename().string().rfind(job_id + "-", 0) == 0)
        out.push_back(it->path().string());
    }
  }
  return out;
}

TEST(ResourcesE2ETest, RankOverItsMemoryLimitFailsOutOfMemoryWhileAJobBesideItRuns) {
  if (std::string why = CgroupsUnusable(); !why.empty()) GTEST_SKIP() << why;
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(), "/bin/false");
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.StartWorker("w0", 2, false, {"--allow_commands"}));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  EXPECT_TRUE(OnlyWorker(cluster).allocatable().enforces_limits());

  // The neighbour: limited too (a cgroup of its own), runs until told.
  const std::string go = cluster.dir() + "/neighbour-may-finish";
  const std::string started = cluster.dir() + "/neighbour-started";
  const std::string neighbour_id = cluster.Submit(Spec(
      absl::StrCat("name: neighbour\ndevice: cpu\nresources: {memory: 256Mi, cpus: 0.5, pids: 64}\n"
                   "restart: {max_restarts: 0}\ncommand:\n  argv: [/bin/sh, -c, 'touch ",
                   started, "; i=0; while [ ! -e ", go,
                   " ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; test -e ", go, "']\n")));
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!fs::exists(started) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(fs::exists(started)) << cluster.Get(neighbour_id).DebugString();
  EXPECT_EQ(CgroupsOf(neighbour_id).size(), 3u) << "memory, cpu and pids (v1) or one (v2)";

  // The hog: 512 MiB touched under a 64 MiB limit (a child of the shell,
  // as a DataLoader worker would be: the limit covers the whole tree).
  const std::string hog_id =
      cluster.Submit(Spec("name: hog\ndevice: cpu\nresources: {memory: 64Mi}\ncommand:\n"
                          "  argv: [/bin/sh, -c, \"/usr/bin/python3 -c 'b = bytearray(512 << 20); "
                          "print(len(b))'\"]\n"));
  v1::Job hog = cluster.WaitState(hog_id, v1::JOB_STATE_FAILED, absl::Seconds(60));
  ASSERT_EQ(hog.state(), v1::JOB_STATE_FAILED) << hog.DebugString();
  ASSERT_GE(hog.attempts_size(), 1);
  EXPECT_EQ(hog.attempts_size(), 1) << "out of memory is not restarted";
  EXPECT_EQ(hog.attempts(0).failure_kind(), v1::FAILURE_KIND_OUT_OF_MEMORY) << hog.DebugString();
  EXPECT_THAT(hog.state_reason(),
              HasSubstr("exceeded its memory limit of 64 MiB (resources.memory)"));
  EXPECT_THAT(hog.state_reason(), HasSubstr("killed by the OOM killer")) << hog.state_reason();

  // The neighbour never noticed: still running, then done.
  EXPECT_EQ(cluster.Get(neighbour_id).state(), v1::JOB_STATE_RUNNING);
  std::ofstream(go) << "go";
  v1::Job neighbour = cluster.WaitState(neighbour_id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  EXPECT_EQ(neighbour.state(), v1::JOB_STATE_SUCCEEDED) << neighbour.DebugString();

  // Every rank's cgroup went with it.
  deadline = absl::Now() + absl::Seconds(10);
  while ((!CgroupsOf(hog_id).empty() || !CgroupsOf(neighbour_id).empty()) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_THAT(CgroupsOf(hog_id), ::testing::IsEmpty());
  EXPECT_THAT(CgroupsOf(neighbour_id), ::testing::IsEmpty());
  for (const std::string& base : CgroupBases()) ::rmdir(base.c_str());  // when nothing else uses it
}

// A rank whose cgroup refuses it a fork at resources.pids fails as
// PROCESS_LIMIT naming the limit (issue 48, item 6), not as its program's
// exit, and is not restarted.
TEST(ResourcesE2ETest, RankAtItsProcessLimitFailsProcessLimit) {
  if (std::string why = CgroupsUnusable(); !why.empty()) GTEST_SKIP() << why;
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(), "/bin/false");
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.StartWorker("w0", 1, false, {"--allow_commands"}));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  // 20 background sleeps under a limit of 8 processes: the shell's fork
  // fails and it exits non-zero (set -e), as a DataLoader would raise.
  const std::string id = cluster.Submit(
      Spec("name: forker\ndevice: cpu\nresources: {pids: 8}\nrestart: {max_restarts: 2}\ncommand:\n"
           "  argv: [/bin/sh, -c, 'set -e; for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 "
           "19 20; do sleep 30 & done; "
           "wait']\n"));
  v1::Job j = cluster.WaitState(id, v1::JOB_STATE_FAILED, absl::Seconds(90));
  ASSERT_EQ(j.state(), v1::JOB_STATE_FAILED) << j.DebugString();
  ASSERT_GE(j.attempts_size(), 1);
  EXPECT_EQ(j.attempts_size(), 1) << "a process limit is not restarted";
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_PROCESS_LIMIT) << j.DebugString();
  EXPECT_THAT(j.state_reason(), HasSubstr("rank 0 hit its process limit of 8 (resources.pids)"));
  EXPECT_THAT(j.state_reason(), HasSubstr("raise resources.pids"));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!CgroupsOf(id).empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_THAT(CgroupsOf(id), ::testing::IsEmpty());
}

TEST(ResourcesE2ETest, AJobWithLimitsIsNeverSentToAWorkerThatCannotEnforceThem) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(), "/bin/false");
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.StartWorker("w0", 1, false, {"--allow_commands", "--cgroup_root="}));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  // It says so at registration, with what it has.
  const v1::Worker w = OnlyWorker(cluster);
  EXPECT_FALSE(w.allocatable().enforces_limits());
  EXPECT_THAT(w.allocatable().limits_off_reason(),
              HasSubstr("cgroups are off on this worker (--cgroup-root \"\")"));
  EXPECT_GT(w.allocatable().cpus(), 0);
  EXPECT_GT(w.allocatable().memory_bytes(), 0);
  // `trainctl workers` says why under its table.
  const std::string build = trainctl::testing::BuildDirOfThisTest();
  trainctl::testing::Process list({build + "/client/trainctl", "--coordinator", cluster.address(),
                                   "--token-file", cluster.AdminTokenFile(), "workers"},
                                  cluster.dir() + "/workers.log", cluster.dir());
  ASSERT_TRUE(list.Start());
  const int listed = list.Wait(absl::Seconds(60));
  ASSERT_TRUE(WIFEXITED(listed) && WEXITSTATUS(listed) == 0) << listed << "\n" << list.ReadLog();
  EXPECT_THAT(
      list.ReadLog(),
      HasSubstr(absl::StrCat("worker ", w.id(), ": LIMITS no: cgroups are off on this worker")));
  // The scheduler never places a job with limits there (its launch would
  // fail as CONFIG, rank_launch.cc): with no other worker it can never run,
  // so it is refused at submit, saying why.
  const std::string limited =
      "name: limited\ndevice: cpu\nresources: {memory: 1Gi}\ncommand:\n  argv: [/bin/true]\n";
  std::string id;
  grpc::Status refused = cluster.TrySubmit(Spec(limited), &id);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << refused.error_message();
  EXPECT_THAT(
      refused.error_message(),
      HasSubstr(
          "needs 1 GiB memory per rank, and no schedulable cpu worker enforces resource limits"));
  // Told to wait for capacity, it waits with that reason.
  const std::string waiting =
      cluster.Submit(Spec(limited + "scheduling: {wait_for_capacity: true}\n"));
  ASSERT_FALSE(waiting.empty());
  // A job without resources runs there as before, while the other waits.
  const std::string plain =
      cluster.Submit(Spec("name: plain\ndevice: cpu\ncommand:\n  argv: [/bin/true]\n"));
  EXPECT_EQ(cluster.WaitState(plain, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60)).state(),
            v1::JOB_STATE_SUCCEEDED);
  const v1::Job still = cluster.Get(waiting);
  EXPECT_EQ(still.state(), v1::JOB_STATE_PENDING) << still.DebugString();
  EXPECT_EQ(still.attempts_size(), 0);
  EXPECT_THAT(still.state_reason(),
              HasSubstr("no schedulable cpu worker enforces resource limits"));
}

}  // namespace
}  // namespace trainctl
