#include "worker/engine/distributed_sampler.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <random>
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

// A change of world size mid-epoch (elastic jobs): the samples trained on
// before (k steps of batch b on W ranks) and the rest of the epoch split
// over W' ranks see the epoch's order exactly once, apart from PyTorch's
// padding at the epoch's end; with nothing consumed the rest is the plain
// sampler at W'.
TEST(DistributedSamplerTest, RemainingIndicesSeeEachSampleOnceAcrossAWorldSizeChange) {
  std::mt19937 rng(1234);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t n = pick(0, 300), w = pick(1, 8), w2 = pick(1, 8), b = pick(1, 16);
    const bool drop_last = pick(0, 1) == 1, shuffle = pick(0, 1) == 1;
    const uint64_t seed = static_cast<uint64_t>(pick(0, 1000));
    const int64_t epoch = pick(0, 5);
    SCOPED_TRACE(::testing::Message() << "n=" << n << " W=" << w << " W'=" << w2 << " b=" << b
                                      << " drop_last=" << drop_last << " shuffle=" << shuffle);
    // The epoch's order: one rank, no padding.
    DistributedSampler one = MustCreate({n, 1, 0, shuffle, seed, false});
    one.set_epoch(epoch);
    const std::vector<int64_t> order = one.Indices();
    ASSERT_EQ(static_cast<int64_t>(order.size()), n);

    // Before: k whole steps on every rank at W.
    DistributedSampler first = MustCreate({n, w, 0, shuffle, seed, drop_last});
    const int64_t steps = first.num_samples() / b;
    const int64_t k = steps == 0 ? 0 : pick(0, steps);
    std::multiset<int64_t> seen;
    for (int64_t r = 0; r < w; ++r) {
      DistributedSampler s = MustCreate({n, w, r, shuffle, seed, drop_last});
      s.set_epoch(epoch);
      std::vector<int64_t> idx = s.Indices();
      seen.insert(idx.begin(), idx.begin() + k * b);
    }
    const int64_t consumed = k * b * w;
    // Those are the order's first `consumed` positions (padding repeats the
    // order's start only when the padded tail itself was reached).
    std::multiset<int64_t> expect_before;
    for (int64_t i = 0; i < consumed; ++i) expect_before.insert(order[static_cast<size_t>(i % n)]);
    ASSERT_EQ(seen, expect_before);

    // After: the rest at W'.
    std::multiset<int64_t> after;
    for (int64_t r = 0; r < w2; ++r) {
      DistributedSampler s = MustCreate({n, w2, r, shuffle, seed, drop_last});
      s.set_epoch(epoch);
      std::vector<int64_t> rest = s.RemainingIndices(consumed);
      if (consumed == 0) {
        EXPECT_EQ(rest, s.Indices());
      }
      after.insert(rest.begin(), rest.end());
    }
    const int64_t left = std::max<int64_t>(n - consumed, 0);
    const int64_t total = drop_last ? left / w2 * w2 : (left + w2 - 1) / w2 * w2;
    std::multiset<int64_t> expect_after;
    for (int64_t i = 0; i < total; ++i) {
      expect_after.insert(order[static_cast<size_t>(n - left + i % std::max<int64_t>(left, 1))]);
    }
    ASSERT_EQ(after, expect_after);
    // Exactly once: nothing trained before is trained again after, and
    // without drop_last nothing of the order is skipped.
    for (int64_t i : after) EXPECT_EQ(seen.count(i), 0u) << i;
    if (!drop_last) {
      for (int64_t i : order) EXPECT_GE(seen.count(i) + after.count(i), 1u) << i;
    } else {
      EXPECT_EQ(static_cast<int64_t>(std::set<int64_t>(after.begin(), after.end()).size()), total);
    }
  }
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
