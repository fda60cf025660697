// torchrun's environment for a command rank, and the exception line a
// failed Python rank's reason quotes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "worker/daemon/worker_daemon.h"

namespace trainctl::worker {
namespace {

using ::testing::ElementsAre;

TEST(CommandEnvironmentTest, TorchrunsContract) {
  v1::RankAssignment ra;
  ra.set_rank(3);
  ra.set_local_rank(1);
  ra.set_world_size(4);
  ra.set_local_world_size(2);
  ra.set_node_rank(1);
  ra.set_num_nodes(2);
  EXPECT_THAT(
      CommandEnvironment("job-1", 3, ra, 5, "10.0.0.1", "29400", "/ck/job-1"),
      ElementsAre("RANK=3", "LOCAL_RANK=1", "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=2", "GROUP_RANK=1",
                  "GROUP_WORLD_SIZE=2", "ROLE_RANK=3", "ROLE_WORLD_SIZE=4", "ROLE_NAME=default",
                  "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29400", "TORCHELASTIC_RESTART_COUNT=2",
                  "TORCHELASTIC_MAX_RESTARTS=5", "TORCHELASTIC_RUN_ID=job-1",
                  "TRAINCTL_JOB_ID=job-1", "TRAINCTL_ATTEMPT=3",
                  "TRAINCTL_CHECKPOINT_DIR=/ck/job-1", "TRAINCTL_STATUS_FD=3"));
}

TEST(CommandEnvironmentTest, ExceptionLineIsTheLastOneThatReadsLikeAnException) {
  std::deque<std::string> lines = {
      "Traceback (most recent call last):", "  File \"t.py\", line 3, in <module>",
      "    raise ValueError('x')", "ValueError: x", "epoch 3 done"};
  EXPECT_EQ(ExceptionLine(lines), "ValueError: x");
  lines.push_back("torch.distributed.DistBackendError: NCCL error");
  EXPECT_EQ(ExceptionLine(lines), "torch.distributed.DistBackendError: NCCL error");
  EXPECT_EQ(ExceptionLine({"KeyboardInterrupt"}), "KeyboardInterrupt");
  EXPECT_EQ(ExceptionLine({"SystemExit: 3"}), "SystemExit: 3");
  EXPECT_EQ(ExceptionLine({"loss: 0.5", "Errors were found", "  ValueError: indented"}), "");
  EXPECT_EQ(ExceptionLine({}), "");
}

TEST(CommandEnvironmentTest, ErrorsARestartWouldRepeatAreNamed) {
  EXPECT_TRUE(CommandCannotHeal(
      2, 0, {"/usr/bin/python3: can't open file '/x/nothere.py': [Errno 2] No such file"}));
  EXPECT_TRUE(CommandCannotHeal(
      1, 0, {"Traceback (most recent call last):", "ModuleNotFoundError: No module named 'x'"}));
  EXPECT_TRUE(CommandCannotHeal(1, 0, {"  File \"t.py\", line 3", "SyntaxError: invalid syntax"}));
  EXPECT_FALSE(CommandCannotHeal(1, 0, {"RuntimeError: Connection reset by peer"}));
  EXPECT_FALSE(CommandCannotHeal(0, 9, {})) << "a signal may heal";
  EXPECT_FALSE(CommandCannotHeal(1, 0, {}));
}

// torch.distributed.elastic's @record writes the exception to
// TORCHELASTIC_ERROR_FILE; its message is the failure's reason.
TEST(CommandEnvironmentTest, TorchelasticErrorFileMessage) {
  std::string stack;
  EXPECT_EQ(TorchelasticErrorMessage(
                R"({"message": {"message": "ValueError: lr must be positive\nsecond line",
      "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File x\nValueError: lr", "timestamp": "1700000000"}}})",
                &stack),
            "ValueError: lr must be positive");
  EXPECT_EQ(stack, "Traceback (most recent call last):\n  File x\nValueError: lr");
  EXPECT_EQ(TorchelasticErrorMessage(R"({"message": "RuntimeError: plain form", "timestamp": 1})"),
            "RuntimeError: plain form");
  EXPECT_EQ(TorchelasticErrorMessage(
                absl::StrCat(R"({"message": {"message": ")", std::string(400, 'x'), R"("}})"))
                ->size(),
            300u);
  EXPECT_EQ(TorchelasticErrorMessage(""), std::nullopt);
  EXPECT_EQ(TorchelasticErrorMessage("not json"), std::nullopt);
  EXPECT_EQ(TorchelasticErrorMessage(R"({"message": {"other": 1}})"), std::nullopt);
  EXPECT_EQ(TorchelasticErrorMessage(R"({"message": "  \n "})"), std::nullopt);
  EXPECT_EQ(TorchelasticErrorMessage(R"([1, 2])"), std::nullopt);
}

TEST(CommandEnvironmentTest, AnImportFailureNamesTheInterpreter) {
  EXPECT_EQ(
      NameInterpreter("ModuleNotFoundError: No module named 'torch'", "/usr/local/bin/python3"),
      "ModuleNotFoundError: No module named 'torch' (interpreter: /usr/local/bin/python3)");
  EXPECT_EQ(NameInterpreter("ImportError: libx.so", "/opt/venv/bin/python3.11"),
            "ImportError: libx.so (interpreter: /opt/venv/bin/python3.11)");
  EXPECT_EQ(NameInterpreter("ValueError: x", "/usr/bin/python3"), "ValueError: x");
  EXPECT_EQ(NameInterpreter("ModuleNotFoundError: No module named 'torch'", "/work/train.sh"),
            "ModuleNotFoundError: No module named 'torch'")
      << "not an interpreter";
}

}  // namespace
}  // namespace trainctl::worker
