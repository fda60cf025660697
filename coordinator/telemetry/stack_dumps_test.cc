#include "coordinator/telemetry/stack_dumps.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace trainctl::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(StackDumpsTest, KeepsFaulthandlersLinesOnlyPerRank) {
  StackDumps d;
  for (const char* line :
       {"rank 1 step 30", "Thread 0x00007f2187f626c0 (most recent call first):",
        "  File \"/b/sitecustomize.py\", line 50 in sample", "",
        "Current thread 0x00007f218821d040 (most recent call first):",
        "  File \"/s/train.py\", line 21 in wedged", "  File \"/s/train.py\", line 39 in main", "",
        "Terminated", "  File \"not a frame of a dump\""}) {
    d.OnLine("j", 1, 1, line);
  }
  d.OnLine("j", 1, 0, "just output");
  EXPECT_THAT(d.Take("j", 1, 1),
              ElementsAre("Thread 0x00007f2187f626c0 (most recent call first):",
                          "  File \"/b/sitecustomize.py\", line 50 in sample", "",
                          "Current thread 0x00007f218821d040 (most recent call first):",
                          "  File \"/s/train.py\", line 21 in wedged",
                          "  File \"/s/train.py\", line 39 in main"));
  EXPECT_THAT(d.Take("j", 1, 1), IsEmpty()) << "taken once";
  EXPECT_THAT(d.Take("j", 1, 0), IsEmpty()) << "no dump, nothing kept";
}

TEST(StackDumpsTest, ABigDumpIsBounded) {
  StackDumps d;
  d.OnLine("j", 2, 0, "Current thread 0x1 (most recent call first):");
  for (int i = 0; i < 1000; ++i) d.OnLine("j", 2, 0, "  File \"/s/deep.py\", line 1 in recurse");
  EXPECT_EQ(d.Take("j", 2, 0).size(), StackDumps::kMaxLines);
}

}  // namespace
}  // namespace trainctl::coordinator
