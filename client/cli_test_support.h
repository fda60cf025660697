// The CLI tests' fixture (cli_test, cli_follow_test): the trainctl CLI
// in-process (RunCli with string streams) against a real coordinator on
// 127.0.0.1:0, with fake workers moving jobs along.
#pragma once

#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/cli.h"
#include "client/test_cluster.h"
#include "common/subprocess.h"
#include "trainctl/client.h"
#include "worker/daemon/slot_inventory.h"

namespace trainctl::cli_testing {

using ::testing::AllOf;
using testing::CliRun;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::MatchesRegex;
using ::testing::Not;
using testing::RunTrainctl;
using ::testing::StartsWith;
using testing::TestCluster;

inline std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out = absl::StrSplit(s, '\n');
  if (!out.empty() && out.back().empty()) out.pop_back();
  return out;
}

template <typename M>
M ParseJson(const std::string& json) {
  M msg;
  auto status = google::protobuf::util::JsonStringToMessage(json, &msg);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return msg;
}

inline std::string Unreachable() { return absl::StrCat("127.0.0.1:", testing::UnusedPort()); }

class CliTest : public ::testing::Test {
 protected:
  // The CLI as the admin, its token from a file (never on a command line).
  CliRun Run(std::vector<std::string> args) {
    args.insert(args.begin(),
                {"--coordinator", cluster_.address(), "--token-file", AdminTokenFile()});
    return RunTrainctl(args);
  }
  const std::string& AdminTokenFile() {
    if (admin_token_file_.empty()) {
      admin_token_file_ = testing::WriteFile(dir_, "admin.token", cluster_.admin_token() + "\n");
    }
    return admin_token_file_;
  }
  // Submits the valid job file (with `sets`), returns its id.
  std::string Submit(const std::vector<std::string>& sets = {}) {
    std::vector<std::string> args = {"submit", job_file_, "-o", "json"};
    for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
    CliRun r = Run(args);
    EXPECT_EQ(r.code, 0) << r.err;
    return ParseJson<v1::Job>(r.out).id();
  }

  std::string dir_ = testing::MakeTempDir();
  std::string job_file_ = testing::WriteFile(dir_, "job.yaml", testing::ValidJobYaml(2));
  TestCluster cluster_;
  std::string admin_token_file_;  // written at the first Run
};

}  // namespace trainctl::cli_testing
