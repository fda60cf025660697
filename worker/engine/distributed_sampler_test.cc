#include "worker/engine/distributed_sampler.h"

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl::engine {
namespace {

constexpr uint64_t kMod = uint64_t{1} << 61;

std::string GoldenPath() {
  const char* src = std::getenv("TRAINCTL_SOURCE_DIR");
  std::string root = src != nullptr ? src : ".";
  return root + "/worker/engine/testdata/sampler_golden.txt";
}

DistributedSampler MustCreate(const DistributedSamplerOptions& o) {
  auto s = DistributedSampler::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

// Each golden line: n replicas rank shuffle seed epoch drop_last len sum wsum
// head... | tail...  (see testdata/gen_sampler_golden.py).
TEST(DistributedSamplerTest, MatchesPyTorchGoldens) {
  std::ifstream in(GoldenPath());
  ASSERT_TRUE(in) << "cannot open " << GoldenPath() << " (set TRAINCTL_SOURCE_DIR)";
  std::string line;
  int checked = 0;
  std::set<std::string> configs;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line.rfind("synthetic", 0) == 0) continue;
    std::istringstream ss(line);
    DistributedSamplerOptions o;
    int shuffle = 0, drop_last = 0;
    int64_t epoch = 0, len = 0;
    uint64_t sum = 0, wsum = 0;
    ss >> o.dataset_size >> o.num_replicas >> o.rank >> shuffle >> o.seed >> epoch >> drop_last >>
        len >> sum >> wsum;
    o.shuffle = shuffle != 0;
    o.drop_last = drop_last != 0;
    std::vector<int64_t> head, tail;
    std::string tok;
    bool in_tail = false;
    while (ss >> tok) {
      if (tok == "|") {
        in_tail = true;
        continue;
      }
      (in_tail ? tail : head).push_back(std::stoll(tok));
    }
    configs.insert(line.substr(0, line.find(' ', line.find(' ') + 1)) + " " +
                   std::to_string(o.seed) + " " + std::to_string(epoch) + " " +
                   std::to_string(shuffle) + std::to_string(drop_last));
    SCOPED_TRACE(line.substr(0, 60));
    DistributedSampler s = MustCreate(o);
    s.set_epoch(epoch);
    const std::vector<int64_t> idx = s.Indices();
    ASSERT_EQ(static_cast<int64_t>(idx.size()), len);
    ASSERT_EQ(s.num_samples(), len);
    uint64_t got_sum = 0, got_wsum = 0;
    for (size_t i = 0; i < idx.size(); ++i) {
      got_sum = (got_sum + static_cast<uint64_t>(idx[i])) % kMod;
      got_wsum = (got_wsum + static_cast<uint64_t>(i) * static_cast<uint64_t>(idx[i])) % kMod;
    }
    EXPECT_EQ(got_sum, sum);
    EXPECT_EQ(got_wsum, wsum);
    if (tail.empty()) {
      EXPECT_EQ(idx, head);  // small case: the full list
    } else {
      EXPECT_EQ(std::vector<int64_t>(idx.begin(), idx.begin() + head.size()), head);
      EXPECT_EQ(std::vector<int64_t>(idx.end() - tail.size(), idx.end()), tail);
    }
    ++checked;
  }
  EXPECT_GE(configs.size(), 25u);
  EXPECT_GE(checked, 100);
}

TEST(DistributedSamplerTest, NumSamplesFollowsPyTorch) {
  auto num = [](int64_t n, int64_t r, bool drop) {
    return MustCreate({n, r, 0, true, 0, drop}).num_samples();
  };
  EXPECT_EQ(num(10, 3, false), 4);
  EXPECT_EQ(num(10, 3, true), 3);
  EXPECT_EQ(num(12, 3, true), 4);
  EXPECT_EQ(num(3, 8, false), 1);
  EXPECT_EQ(num(5, 8, true), 0);
  EXPECT_EQ(num(0, 4, false), 0);
}

TEST(DistributedSamplerTest, RanksPartitionPaddedEpoch) {
  // Without drop_last every index appears on some rank; padding repeats only
  // total_size - n of them.
  const int64_t n = 1003, r = 7;
  std::multiset<int64_t> all;
  for (int64_t rank = 0; rank < r; ++rank) {
    DistributedSampler s = MustCreate({n, r, rank, true, 17, false});
    s.set_epoch(4);
    for (int64_t i : s.Indices()) all.insert(i);
  }
  EXPECT_EQ(static_cast<int64_t>(all.size()), 1008);
  for (int64_t i = 0; i < n; ++i) EXPECT_GE(all.count(i), 1u) << i;
}

TEST(DistributedSamplerTest, EpochChangesPermutationDeterministically) {
  DistributedSampler a = MustCreate({100, 2, 1, true, 5, false});
  DistributedSampler b = MustCreate({100, 2, 1, true, 5, false});
  a.set_epoch(1);
  b.set_epoch(1);
  EXPECT_EQ(a.Indices(), b.Indices());
  b.set_epoch(2);
  EXPECT_NE(a.Indices(), b.Indices());
  EXPECT_EQ(b.epoch(), 2);
}

TEST(DistributedSamplerTest, RejectsBadOptions) {
  auto bad = [](DistributedSamplerOptions o, const std::string& field) {
    auto s = DistributedSampler::Create(o);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.status().message()), ::testing::HasSubstr(field));
  };
  bad({-1, 1, 0, true, 0, false}, "dataset_size");
  bad({10, 0, 0, true, 0, false}, "num_replicas");
  bad({10, 2, 2, true, 0, false}, "rank");
  bad({10, 2, -1, true, 0, false}, "rank");
}

}  // namespace
}  // namespace trainctl::engine
