#include "worker/engine/engine_errors.h"

#include <gtest/gtest.h>

namespace trainctl::engine {
namespace {

TEST(EngineErrorsTest, CheckAtLeastNamesTheFieldTheBoundAndTheValue) {
  EXPECT_TRUE(CheckAtLeast("batch_size", 1, 1).ok());
  EXPECT_TRUE(CheckAtLeast("csv label_column_index", -1, -1).ok());
  const absl::Status s = CheckAtLeast("batch_size", 0, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_EQ(s.message(), "batch_size must be >= 1, got 0");
  EXPECT_EQ(CheckAtLeast("csv label_column_index", -2, -1).message(),
            "csv label_column_index must be >= -1, got -2");
}

TEST(EngineErrorsTest, FirstLineDropsABacktrace) {
  EXPECT_EQ(FirstLine("shape mismatch\nException raised from ..."), "shape mismatch");
  EXPECT_EQ(FirstLine("one line"), "one line");
  EXPECT_EQ(FirstLine(""), "");
}

}  // namespace
}  // namespace trainctl::engine
