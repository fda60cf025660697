// Streams that outlive a coordinator restart, end to end: a real
// coordinator and worker daemon as processes, the C++ client in the test.
//
// - A fetch whose stream breaks mid-file (the coordinator SIGKILLed and
//   restarted while the client holds the first piece) resumes at the next
//   byte once the coordinator and the holder are back: the bytes are the
//   file's, none twice, and the client said once that it reconnects.
// - `logs -f` of a command job that prints numbered lines, the coordinator
//   SIGKILLed and restarted mid-job: the follower gets every line once, in
//   order (resumed after each rank's last LogLine.seq), and ends with the
//   job.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <fstream>
#include <random>
#include <streambuf>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "tests/support/source_dir.h"
#include "trainctl/client.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using trainctl::testing::Cluster;
using trainctl::testing::SourceDir;

v1::JobSpec Spec(const std::string& yaml, const std::string& name) {
  ParsedJobSpec p = ParseJobSpecYaml(yaml, "resume.yaml", {"name=" + name});
  EXPECT_TRUE(p.ok());
  return p.spec;
}

// A client of `cluster` that records each break it resumes from.
struct RecordingClient {
  absl::Mutex mu;
  std::vector<std::string> breaks ABSL_GUARDED_BY(mu);
  std::unique_ptr<Client> client;

  bool Connect(const Cluster& cluster) {
    ClientOptions options;
    options.address = cluster.address();
    options.token = cluster.admin_token();
    options.timeout = absl::Seconds(20);  // generous: loaded CI machines
    options.on_watch_broken = [this](const absl::Status& why) {
      absl::MutexLock l(&mu);
      breaks.push_back(why.ToString());
    };
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(options);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return false;
    client = *std::move(c);
    return true;
  }
  std::vector<std::string> Breaks() {
    absl::MutexLock l(&mu);
    return breaks;
  }
};

// An output that keeps what it is given and holds the first write until
// released (the fetch's reading thread waits there).
class GateBuffer : public std::streambuf {
 public:
  absl::Notification first_write;
  absl::Notification release;
  std::string data() {
    absl::MutexLock l(&mu_);
    return data_;
  }

 protected:
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    {
      absl::MutexLock l(&mu_);
      data_.append(s, static_cast<size_t>(n));
    }
    if (!first_write.HasBeenNotified()) {
      first_write.Notify();
      release.WaitForNotification();
    }
    return n;
  }
  int overflow(int c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    const char ch = static_cast<char>(c);
    return xsputn(&ch, 1) == 1 ? c : traits_type::eof();
  }

 private:
  absl::Mutex mu_;
  std::string data_ ABSL_GUARDED_BY(mu_);
};

TEST(StreamResumeE2ETest, AFetchBrokenByACoordinatorRestartResumesAtTheNextByte) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.StartWorker("w", 1));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  const std::string id =
      cluster.Submit(Spec("model: {name: mlp, input_dim: 5, classes: 2}\n"
                          "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n"
                          "world_size: 1\ntraining: {epochs: 1}\n",
                          "fake-model"));
  ASSERT_FALSE(id.empty());
  v1::Job job = cluster.WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_reason();
  ASSERT_FALSE(job.final_model().empty());
  // A 64 MiB model (rewritten in place: the same file of the job): far
  // more than gRPC's flow control lets the coordinator send ahead of a
  // client that holds its first piece, so the restart cuts the file.
  std::string model(64u << 20, '\0');
  std::mt19937_64 rng(7);
  for (size_t i = 0; i < model.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&model[i], &v, 8);
  }
  {
    std::ofstream f(job.final_model(), std::ios::binary | std::ios::trunc);
    f.write(model.data(), static_cast<std::streamsize>(model.size()));
    ASSERT_TRUE(f.good());
  }

  RecordingClient client;
  ASSERT_TRUE(client.Connect(cluster));

  GateBuffer gate;
  std::ostream out(&gate);
  absl::StatusOr<v1::ArtifactChunk> got = absl::UnknownError("not run");
  std::thread fetcher([&] { got = client.client->Fetch(id, 0, out); });
  const bool started = gate.first_write.WaitForNotificationWithTimeout(absl::Seconds(60));
  if (started) {
    cluster.KillCoordinator(SIGKILL);
    EXPECT_TRUE(cluster.StartCoordinator()) << "the coordinator did not come back";
  }
  gate.release.Notify();
  fetcher.join();
  ASSERT_TRUE(started) << "no first piece in 60 s: " << got.status();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), static_cast<int64_t>(model.size()));
  EXPECT_EQ(got->path(), job.final_model());
  const std::string data = gate.data();
  EXPECT_EQ(data.size(), model.size());
  EXPECT_TRUE(data == model) << "the fetched bytes differ from the file";
  const std::vector<std::string> breaks = client.Breaks();
  ASSERT_EQ(breaks.size(), 1u) << "the stream did not break once";
  EXPECT_THAT(breaks[0], HasSubstr(cluster.address()));
}

TEST(StreamResumeE2ETest, LogsFollowOutlivesACoordinatorRestartWithEveryLineOnce) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.StartWorker("w", 1, false, {"--allow_commands"}));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  // 150 numbered lines over ~6 s, then the job ends.
  constexpr int kLines = 150;
  const std::string id = cluster.Submit(
      Spec(absl::StrCat(
               "world_size: 1\ndevice: cpu\ncommand:\n  argv: [/bin/sh, -c, 'i=1; while [ $i -le ",
               kLines, " ]; do echo \"line $i\"; i=$((i+1)); sleep 0.04; done']\n"),
           "logs-resume"));
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(cluster.WaitState(id, v1::JOB_STATE_RUNNING, absl::Seconds(60)).state(),
            v1::JOB_STATE_RUNNING);

  RecordingClient client;
  ASSERT_TRUE(client.Connect(cluster));
  absl::Mutex mu;
  std::vector<std::string> lines;  // stdout lines, in arrival order
  const absl::Time give_up = absl::Now() + absl::Seconds(150);
  absl::Status followed = absl::UnknownError("not run");
  std::thread follower([&] {
    LogsOptions o;
    o.follow = true;
    followed = client.client->Logs(id, o, [&](const v1::LogChunk& c) {
      absl::MutexLock l(&mu);
      for (const v1::LogLine& line : c.lines()) {
        if (line.stream() == v1::LogLine::STREAM_STDOUT) lines.push_back(line.text());
      }
      return absl::Now() < give_up;  // bounded: a stream that never ends fails the test
    });
  });
  auto received = [&] {
    absl::MutexLock l(&mu);
    return lines.size();
  };
  const absl::Time until = absl::Now() + absl::Seconds(60);
  while (received() < 20 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
  const size_t before = received();
  if (before >= 20) {
    cluster.KillCoordinator(SIGKILL);
    EXPECT_TRUE(cluster.StartCoordinator()) << "the coordinator did not come back";
  }
  follower.join();
  ASSERT_GE(before, 20u) << "the follower got " << before << " lines in 60 s";
  ASSERT_TRUE(followed.ok()) << followed;
  std::vector<std::string> want;
  for (int i = 1; i <= kLines; ++i) want.push_back(absl::StrCat("line ", i));
  absl::MutexLock l(&mu);
  EXPECT_EQ(lines, want) << "before the restart: " << before << " lines";
  EXPECT_EQ(client.Breaks().size(), 1u);
  EXPECT_EQ(cluster.WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60)).state(),
            v1::JOB_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace trainctl
