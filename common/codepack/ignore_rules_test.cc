#include "common/codepack/ignore_rules.h"

#include <gtest/gtest.h>

namespace trainctl::codepack {
namespace {

TEST(IgnoreRulesTest, ParsesCommentsNegationDirectoriesAndAnchors) {
  std::vector<IgnoreRule> rules =
      ParseIgnore("# comment\n\n*.log\r\n!keep.log\nbuild/\n/data/raw  \n\\#hash\n");
  ASSERT_EQ(rules.size(), 5u);
  EXPECT_EQ(rules[0].components, std::vector<std::string>{"*.log"});
  EXPECT_FALSE(rules[0].anchored);
  EXPECT_TRUE(rules[1].negated);
  EXPECT_TRUE(rules[2].dir_only);
  EXPECT_EQ(rules[3].components, (std::vector<std::string>{"data", "raw"}));
  EXPECT_TRUE(rules[3].anchored);
  EXPECT_EQ(rules[4].components, std::vector<std::string>{"#hash"});
}

TEST(IgnoreRulesTest, TheLastMatchingRuleOfTheDeepestFileDecides) {
  std::vector<IgnoreFile> files = {{"", ParseIgnore("*.log\nbuild/\n/data/**\n")},
                                   {"sub", ParseIgnore("!keep.log\n")}};
  EXPECT_TRUE(Ignored(files, "a.log", false));
  EXPECT_TRUE(Ignored(files, "deep/er/b.log", false));
  EXPECT_FALSE(Ignored(files, "sub/keep.log", false)) << "re-included by the deeper file";
  EXPECT_TRUE(Ignored(files, "sub/other.log", false));
  EXPECT_TRUE(Ignored(files, "x/build", true));
  EXPECT_FALSE(Ignored(files, "x/build", false)) << "build/ names directories only";
  EXPECT_TRUE(Ignored(files, "data/a/b.bin", false));
  EXPECT_FALSE(Ignored(files, "data", true)) << "data/** is what is inside data";
  EXPECT_FALSE(Ignored(files, "src/data/a.bin", false)) << "anchored to the root";
  EXPECT_FALSE(Ignored(files, "train.py", false));
}

TEST(IgnoreRulesTest, GitAndBytecodeAreAlwaysSkipped) {
  EXPECT_TRUE(AlwaysSkipped(".git", true));
  EXPECT_TRUE(AlwaysSkipped(".git", false));
  EXPECT_TRUE(AlwaysSkipped("__pycache__", true));
  EXPECT_TRUE(AlwaysSkipped("m.pyc", false));
  EXPECT_FALSE(AlwaysSkipped("m.py", false));
}

}  // namespace
}  // namespace trainctl::codepack
