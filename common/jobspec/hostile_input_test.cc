// Hostile job.yaml text: limits, fuzz findings and yaml-cpp's weak spots
// (hostile_input.h) give errors, never a crash or a hang.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/jobspec/job_spec.h"
#include "common/jobspec/spec_test_util.h"

namespace trainctl {
namespace {

using namespace testing_spec;  // NOLINT: kBase, Errors, Source, matchers

TEST(JobSpecTest, LongListIsRefused) {
  std::string hidden;
  for (int i = 0; i < 65; ++i) hidden += (i ? ", 4" : "4");
  EXPECT_EQ(Errors("name: j\nmodel: {name: mlp, input_dim: 5, classes: 2, hidden: [" + hidden +
                   "]}\ndata: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n"),
            std::vector<std::string>{"job.yaml:2:54: model.hidden: at most 64 entries, got 65"});
}

TEST(JobSpecTest, HostileInputNeverCrashes) {
  // Deep nesting, both flow and block.
  EXPECT_FALSE(Errors(std::string(100000, '[')).empty());
  EXPECT_FALSE(Errors(std::string(50000, '{')).empty());
  std::string block;
  for (int i = 0; i < 2000; ++i) block += std::string(i, ' ') + "a:\n";
  EXPECT_FALSE(Errors(block).empty());
  // Aliases are read through, never expanded beyond the schema.
  std::string laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'k'; ++c) {
    laughs += std::string(1, c) + ": &" + c + " [";
    for (int i = 0; i < 10; ++i) laughs += std::string(i ? ", *" : "*") + static_cast<char>(c - 1);
    laughs += "]\n";
  }
  EXPECT_FALSE(Errors(laughs).empty());
  EXPECT_THAT(
      Errors(std::string(kBase) + "model: {name: mlp, input_dim: 5, classes: 2, hidden: *x}\n"),
      testing::Not(testing::IsEmpty()));
  // Too large.
  EXPECT_THAT(Errors(std::string(kMaxJobYamlBytes + 1, '#')),
              ElementsAre(HasSubstr("at most 1048576 are read")));
  // Random bytes, and random mutations of a valid file.
  std::mt19937 rng(1234);
  for (int i = 0; i < 300; ++i) {
    std::string junk(rng() % 200, '\0');
    for (char& ch : junk) ch = static_cast<char>(rng() % 256);
    (void)Errors(junk);
    std::string mutated = kBase;
    for (int k = 0; k < 4; ++k) mutated[rng() % mutated.size()] = static_cast<char>(rng() % 128);
    (void)Errors(mutated);
  }
  // Lots of errors are capped.
  std::string many = kBase;
  for (int i = 0; i < 200; ++i) many += "unknown" + std::to_string(i) + ": 1\n";
  std::vector<std::string> got = Errors(many);
  ASSERT_EQ(got.size(), static_cast<size_t>(kMaxReportedErrors + 1));
  EXPECT_EQ(got.back(), "job.yaml: ... and 150 more errors");
}

// Found by fuzz/fuzz_job_yaml (fuzz/corpus/fuzz_job_yaml/invalid-utf8-path):
// a path with invalid UTF-8 was accepted, and the spec could not be sent
// (protobuf refuses to parse such a string field: the coordinator answered
// UNIMPLEMENTED with no message) nor printed back to the same YAML. Refused
// now, naming the field, as are control characters other than tab and line
// breaks.
TEST(JobSpecTest, InvalidUtf8AndControlCharactersAreRefused) {
  EXPECT_THAT(Errors(std::string(kBase) + "checkpoint: {dir: \"/tmp/\xff\"}\n"),
              ElementsAre("job.yaml:5:19: checkpoint.dir: is not valid UTF-8"));
  EXPECT_THAT(Errors(std::string(kBase) + "checkpoint: {dir: \"/tmp/a\\x01b\"}\n"),
              ElementsAre("job.yaml:5:19: checkpoint.dir: contains a control character (0x01)"));
  std::ifstream f(Source("fuzz/corpus/fuzz_job_yaml/invalid-utf8-path"));
  std::stringstream crash;
  crash << f.rdbuf();
  ASSERT_FALSE(crash.str().empty());
  EXPECT_THAT(Errors(crash.str()),
              ::testing::Contains(HasSubstr("data.train.idx.labels: is not valid UTF-8")));
}

// Found by fuzz/fuzz_job_yaml (fuzz/corpus/fuzz_job_yaml/yaml-cpp-loop): yaml-cpp
// 0.7 never returns (and grows to gigabytes) on a line that starts with ','
// outside [] or {}. Refused before yaml-cpp reads it; near misses still parse or get
// yaml-cpp's own error.
TEST(JobSpecTest, DocumentStartingWithACommaIsRefusedNotHung) {
  for (const std::string y :
       {",a", ", warmup_steps: 100}", "# c\n  ,a", "--- !t &x ,a", "&a!,b", "'a',b", "\"a\" ,b",
        "[a],b", "{a: 1},b", "name: j\n---\n,a", "name: j\n...\n,}", "%YAML 1.2\n---\n,a"}) {
    std::vector<std::string> got = Errors(y);
    ASSERT_EQ(got.size(), 1u) << y;
    EXPECT_THAT(got[0], HasSubstr("',' outside [] or {}")) << y;
  }
  EXPECT_THAT(Errors("name: j\n---\n,a"), ElementsAre(::testing::StartsWith("job.yaml:3:1: ")));
  EXPECT_THAT(Errors(std::string(kBase) + "x: [1\n  ,2]\n"),
              ElementsAre(::testing::Not(HasSubstr("',' outside"))));
  // Block scalars and quoted text may hold such lines.
  EXPECT_THAT(Errors(std::string(kBase) + "checkpoint:\n  dir: |-\n    ,a\n"),
              ::testing::IsEmpty());
  EXPECT_THAT(Errors(std::string(kBase) + "checkpoint: {dir: \"/tmp/a\n  ,b\"}\n"),
              ::testing::IsEmpty());
  // A '{' inside a plain scalar opens nothing (fuzz/corpus/fuzz_job_yaml/yaml-cpp-loop-2).
  EXPECT_THAT(Errors("  loss: cros{_e\n  optimizer: {name: adam}\n  ,r_schedule: x}\n"),
              ElementsAre(HasSubstr("job.yaml:3:1: not valid YAML: ',' outside [] or {}")));
  // A ',' that starts a line inside a flow map is fine.
  EXPECT_THAT(Errors(std::string(kBase) + "training: {epochs: 2\n  , loss: cross_entropy}\n"),
              ::testing::IsEmpty());
  std::ifstream f(Source("fuzz/corpus/fuzz_job_yaml/yaml-cpp-loop"));
  std::stringstream slow;
  slow << f.rdbuf();
  ASSERT_FALSE(slow.str().empty());
  EXPECT_THAT(Errors(slow.str()),
              ElementsAre(HasSubstr("job.yaml:7:1: not valid YAML: ',' outside [] or {}")));
  std::ifstream f2(Source("fuzz/corpus/fuzz_job_yaml/yaml-cpp-loop-2"));
  std::stringstream slow2;
  slow2 << f2.rdbuf();
  ASSERT_FALSE(slow2.str().empty());
  EXPECT_THAT(Errors(slow2.str()),
              ::testing::Contains(HasSubstr("not valid YAML: ',' outside [] or {}")));
  // Valid YAML with such commas still parses: inside a plain scalar or a flow map.
  EXPECT_THAT(Errors(std::string(kBase) + "checkpoint: {dir: 'a,b', keep: 2}\n"),
              ::testing::IsEmpty());
  EXPECT_THAT(Errors(std::string(kBase) + "checkpoint:\n  dir: /tmp/a,b\n"), ::testing::IsEmpty());
  std::ifstream f4(Source("fuzz/corpus/fuzz_job_yaml/yaml-cpp-loop-4"));
  std::stringstream slow4;
  slow4 << f4.rdbuf();
  ASSERT_FALSE(slow4.str().empty());
  EXPECT_THAT(Errors(slow4.str()),
              ::testing::Contains(HasSubstr("not valid YAML: ',' outside [] or {}")));
  std::ifstream f3(Source("fuzz/corpus/fuzz_job_yaml/yaml-cpp-loop-3"));
  std::stringstream slow3;
  slow3 << f3.rdbuf();
  ASSERT_FALSE(slow3.str().empty());
  EXPECT_THAT(Errors(slow3.str()),
              ::testing::Contains(HasSubstr("not valid YAML: ',' outside [] or {}")));
}

}  // namespace
}  // namespace trainctl
