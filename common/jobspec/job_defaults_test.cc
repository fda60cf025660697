// Every default of a job exists once, in ResolveJobSpecDefaults: the values
// docs/job-yaml.md documents are the ones a resolved spec holds, and what a
// rank reads (JobSpecToFlat) carries all of them. The rank's parser has no
// defaults of its own (worker/trainer/rank_config_test.cc); its tests start
// from testdata/resolved_defaults.conf, which this test keeps equal to the
// minimal job resolved.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/jobspec/job_spec.h"
#include "common/jobspec/spec_test_util.h"
#include "worker/protocol/rank_protocol.h"

namespace trainctl {
namespace {

using Flat = std::map<std::string, std::string>;

// The minimal engine job: what testdata/resolved_defaults.conf resolves.
constexpr const char* kMinimal = testing_spec::kBase;
using testing_spec::Source;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Flat Resolved(const std::string& yaml) {
  ParsedJobSpec p = ParseJobSpecYaml(yaml, "job.yaml");
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.errors[0].ToString());
  return JobSpecToFlat(p.spec);
}

TEST(JobDefaultsTest, FixtureIsTheMinimalJobResolved) {
  const std::string path = Source("common/jobspec/testdata/resolved_defaults.conf");
  const std::string want = rankproto::FormatConfig(Resolved(kMinimal));
  if (std::getenv("TRAINCTL_UPDATE_GOLDEN") != nullptr) {
    std::ofstream(path) << want;
  }
  EXPECT_EQ(ReadFile(path), want) << "regenerate with TRAINCTL_UPDATE_GOLDEN=1";
}

// JobSpecToFlat resolves what it is given: a spec stored before a default
// existed still reaches the rank with every key.
TEST(JobDefaultsTest, FlatFormOfAnUnresolvedSpecIsResolved) {
  ParsedJobSpec p = ParseJobSpecYaml(kMinimal, "job.yaml");
  ASSERT_TRUE(p.ok());
  v1::JobSpec stored = p.spec;
  stored.clear_health();
  stored.mutable_training()->mutable_optimizer()->clear_beta1();
  EXPECT_EQ(JobSpecToFlat(stored), JobSpecToFlat(p.spec));
}

// Numbers compare by value ("1e-8" is "1e-08"), the rest as text.
bool SameValue(const std::string& documented, const std::string& resolved) {
  double a = 0, b = 0;
  if (absl::SimpleAtod(documented, &a) && absl::SimpleAtod(resolved, &b)) return a == b;
  return documented == resolved;
}

std::string Unquote(absl::string_view s) {
  s = absl::StripAsciiWhitespace(s);
  if (s.size() >= 2 && s.front() == '`' && s.back() == '`') s = s.substr(1, s.size() - 2);
  return std::string(s);
}

// A literal default (a number, true/false or one lower-case word); a phrase
// ("worker's work dir", "required", "—") documents no value to compare.
bool IsLiteral(const std::string& v) {
  static const std::regex kLiteral("[-+0-9.e]+|true|false|[a-z_][a-z0-9_]*");
  return std::regex_match(v, kLiteral) && v != "required" && v != "none";
}

struct Documented {
  std::string key;
  std::string value;
};

// The `| key | default | meaning |` rows of docs/job-yaml.md, one entry per
// key ("`training.amp.enabled` / `dtype`" with "false / `bf16`" gives two),
// and the "`name` (default)" pairs of the cnn model row.
std::vector<Documented> DocumentedDefaults() {
  std::vector<Documented> out;
  std::istringstream doc(ReadFile(Source("docs/job-yaml.md")));
  static const std::regex kPair("`(\\w+)` \\(([^)]+)\\)");
  for (std::string line; std::getline(doc, line);) {
    std::vector<std::string> cells = absl::StrSplit(line, '|');
    if (cells.size() < 4 || !absl::StartsWith(absl::StripAsciiWhitespace(cells[1]), "`")) continue;
    if (absl::StrContains(cells[1], "name: cnn")) {
      for (std::sregex_iterator it(cells[2].begin(), cells[2].end(), kPair), end; it != end; ++it) {
        out.push_back({"model." + (*it)[1].str(), (*it)[2].str()});
      }
      continue;
    }
    std::vector<std::string> keys = absl::StrSplit(cells[1], " / ");
    std::vector<std::string> values = absl::StrSplit(cells[2], " / ");
    if (keys.size() != values.size()) continue;
    std::string first = Unquote(keys[0]);
    for (size_t i = 0; i < keys.size(); ++i) {
      std::string key = Unquote(keys[i]);
      if (i > 0) key = first.substr(0, first.rfind('.') + 1) + key;
      out.push_back({key, Unquote(values[i])});
    }
  }
  return out;
}

TEST(JobDefaultsTest, DocumentedDefaultsAreTheResolvedOnes) {
  // Sections a minimal job leaves out (elastic, tensorboard, a cnn model, a
  // command job) are added so that their defaults show.
  Flat flat =
      Resolved(std::string(kMinimal) + "elastic: {min_ranks: 1}\ntensorboard: {enabled: false}\n");
  for (const auto& [k, v] : Resolved("name: j\nmodel: {name: cnn, classes: 10}\n"
                                     "data: {train: {format: idx, images: a, labels: b}}\n")) {
    if (absl::StartsWith(k, "model.")) flat[k] = v;  // model.hidden is the cnn's here
  }
  for (const auto& [k, v] : Resolved("name: j\ncommand: {argv: [true]}\n")) {
    if (absl::StartsWith(k, "command.")) flat.emplace(k, v);
  }
  int checked = 0;
  for (const Documented& d : DocumentedDefaults()) {
    if (!IsLiteral(d.value)) continue;
    ++checked;
    if (std::getenv("TRAINCTL_VERBOSE")) std::cerr << d.key << " = " << d.value << "\n";
    auto it = flat.find(d.key);
    if (it == flat.end()) {
      ADD_FAILURE() << d.key << ": documented default " << d.value
                    << ", but a resolved spec has no such key";
      continue;
    }
    EXPECT_TRUE(SameValue(d.value, it->second))
        << d.key << ": documented default " << d.value << ", resolved " << it->second;
  }
  EXPECT_GE(checked, 45) << "docs/job-yaml.md's tables were not read";
}

}  // namespace
}  // namespace trainctl
