// Gloo engine and rendezvous store, across real rank processes on loopback.
#include "worker/dist/gloo_collectives.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "worker/dist/multiprocess_test_support.h"
#include "worker/dist/rendezvous_store.h"

namespace trainctl::dist {
namespace {

// Keeps the ranks' scratch directory only when the test failed.
void Cleanup(const testing::RankRun& run) {
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(run.dir);
}

using testing::RankRun;
using testing::RunRanks;

std::string Logs(const RankRun& run) {
  std::string s;
  for (size_t r = 0; r < run.logs.size(); ++r) {
    s += "---- rank " + std::to_string(r) + " (exit " + std::to_string(run.exit_codes[r]) +
         ") ----\n" + run.logs[r];
  }
  return s;
}

TEST(GlooCollectivesTest, InvalidOptions) {
  auto store = RendezvousStore::Host("127.0.0.1", 0, absl::Seconds(5), NewRendezvousSecret());
  ASSERT_TRUE(store.ok());
  GlooOptions o;
  o.world_size = 2;
  o.rank = 2;
  EXPECT_EQ(CreateGlooCollectives(o, *store).status().code(), absl::StatusCode::kInvalidArgument);
  o.rank = 0;
  EXPECT_EQ(CreateGlooCollectives(o, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GlooCollectivesTest, PeerThatNeverJoinsFailsRendezvousWithinTimeout) {
  auto store = RendezvousStore::Host("127.0.0.1", 0, absl::Seconds(1), NewRendezvousSecret());
  ASSERT_TRUE(store.ok());
  GlooOptions o;
  o.world_size = 2;
  o.rank = 0;
  o.timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  auto comm = CreateGlooCollectives(o, *store);
  EXPECT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(GlooCollectivesTest, SingleRank) {
  auto run = RunRanks("collectives", 1, {}, absl::Seconds(30));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_codes[0], 0) << Logs(*run);
  Cleanup(*run);
}

// Every multi-rank scenario over both transports: shared memory (all ranks on
// this host; 64 KiB slots so that larger buffers go in several chunks) and
// Gloo's TCP meshes alone (ranks on different hosts).
class GlooTransportTest : public ::testing::TestWithParam<bool> {
 protected:
  std::map<std::string, std::string> Args(std::map<std::string, std::string> a) const {
    a["shm"] = GetParam() ? "1" : "0";
    a["shm_slot_bytes"] = "65536";
    return a;
  }
};

TEST_P(GlooTransportTest, AllReduceBroadcastBarrierAcrossThreeRanks) {
  auto run = RunRanks("collectives", 3, Args({{"timeout_ms", "20000"}}), absl::Seconds(40));
  ASSERT_TRUE(run.ok()) << run.status();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(run->exit_codes[r], 0) << Logs(*run);
  Cleanup(*run);
}

TEST_P(GlooTransportTest, DeadPeerYieldsErrorNotHang) {
  auto run = RunRanks("peer_exit", 2, Args({{"timeout_ms", "5000"}}), absl::Seconds(30));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_codes[1], 3) << Logs(*run);
  EXPECT_EQ(run->exit_codes[0], 0) << Logs(*run);
  Cleanup(*run);
}

TEST_P(GlooTransportTest, StalledPeerTimesOut) {
  auto run = RunRanks("peer_stall", 2, Args({{"timeout_ms", "2000"}}), absl::Seconds(30));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_codes[0], 0) << Logs(*run);
  auto result = testing::ReadFile(run->dir + "/result");
  ASSERT_TRUE(result.ok());
  std::vector<std::string> parts = absl::StrSplit(*result, ' ');
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], "DEADLINE_EXCEEDED");
  double ms = 0;
  ASSERT_TRUE(absl::SimpleAtod(parts[1], &ms));
  EXPECT_GE(ms, 1500);  // it waited for the timeout, not less
  EXPECT_LT(ms, 5000);
  Cleanup(*run);
}

TEST_P(GlooTransportTest, AbortEndsPendingWork) {
  auto run = RunRanks("abort", 2, Args({{"timeout_ms", "20000"}}), absl::Seconds(40));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_codes[0], 0) << Logs(*run);
  std::cout << run->logs[0];
  Cleanup(*run);
}

INSTANTIATE_TEST_SUITE_P(Transports, GlooTransportTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "SharedMemory" : "Tcp";
                         });

// Replicas stay bit-identical (issue #47): every rank's all-reduce result
// has the same bytes, at world sizes where the order of a float sum differs
// by rank in a ring (3 and 4; at 2 ranks a + b == b + a), over every path an
// all-reduce can take: shared memory, the small-message mesh, Gloo's ring.
// The inputs mix magnitudes (1e8, -1e8, 1, 3e-5, ...) so that another
// summation order rounds differently.
// The paths a float all-reduce takes: Gloo's TCP ring; shared memory, copied
// through the slots; shared memory, in place in shared blocks (where the
// GradientBucketer keeps its buckets).
enum class Path { kTcp, kSlots, kBlocks };

std::string PathName(Path p) {
  return p == Path::kTcp ? "Tcp" : p == Path::kSlots ? "SharedMemory" : "SharedBlocks";
}

std::map<std::string, std::string> PathArgs(Path p) {
  return {{"shm", p == Path::kTcp ? "0" : "1"},
          {"shared", p == Path::kBlocks ? "1" : "0"},
          {"shm_slot_bytes", "65536"},
          {"timeout_ms", "20000"}};
}

const auto kPaths = ::testing::Values(Path::kTcp, Path::kSlots, Path::kBlocks);

class GlooReplicaTest : public ::testing::TestWithParam<std::tuple<Path, int>> {};

// sum over ranks 0, 1, ..., W-1 in that order, in T.
template <typename T>
std::string RankOrderSum(const std::vector<std::string>& inputs) {
  const size_t n = inputs[0].size() / sizeof(T);
  std::vector<T> acc(n);
  std::memcpy(acc.data(), inputs[0].data(), n * sizeof(T));
  for (size_t r = 1; r < inputs.size(); ++r) {
    const T* x = reinterpret_cast<const T*>(inputs[r].data());
    for (size_t i = 0; i < n; ++i) acc[i] += x[i];
  }
  return std::string(reinterpret_cast<const char*>(acc.data()), n * sizeof(T));
}

// "" when every element of `got` is the sum of `inputs` to within the
// rounding of W - 1 additions; else the first element that is not.
template <typename T>
std::string FarFromSum(const std::string& got, const std::vector<std::string>& inputs) {
  const size_t n = got.size() / sizeof(T);
  const T* g = reinterpret_cast<const T*>(got.data());
  for (size_t i = 0; i < n; ++i) {
    long double exact = 0, magnitude = 0;
    for (const std::string& in : inputs) {
      const T x = reinterpret_cast<const T*>(in.data())[i];
      exact += x;
      magnitude += x < 0 ? -x : x;
    }
    const long double bound = inputs.size() * std::numeric_limits<T>::epsilon() * magnitude;
    const long double error = g[i] > exact ? g[i] - exact : exact - g[i];
    if (error > bound) {
      return absl::StrFormat("[%d] = %.17g, exact sum %.17Lg", i, static_cast<double>(g[i]), exact);
    }
  }
  return "";
}

// "" when equal, else where the first differing element is and both values.
template <typename T>
std::string FirstDifference(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return absl::StrCat("sizes ", a.size(), " vs ", b.size());
  const size_t n = a.size() / sizeof(T);
  size_t differing = 0, first = n;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(a.data() + i * sizeof(T), b.data() + i * sizeof(T), sizeof(T)) != 0) {
      ++differing;
      if (first == n) first = i;
    }
  }
  if (differing == 0) return "";
  T x, y;
  std::memcpy(&x, a.data() + first * sizeof(T), sizeof(T));
  std::memcpy(&y, b.data() + first * sizeof(T), sizeof(T));
  return absl::StrCat(differing, " of ", n, " elements differ, first [", first,
                      "]: ", absl::StrFormat("%.17g vs %.17g", x, y));
}

std::string FirstDifference(CommDataType type, const std::string& a, const std::string& b) {
  return type == CommDataType::kFloat32 ? FirstDifference<float>(a, b)
                                        : FirstDifference<double>(a, b);
}

TEST_P(GlooReplicaTest, EveryRankGetsTheSameBytes) {
  const auto [path, world] = GetParam();
  const bool shm = path != Path::kTcp;
  auto run = RunRanks("replicas", world, PathArgs(path), absl::Seconds(60));
  ASSERT_TRUE(run.ok()) << run.status();
  for (int r = 0; r < world; ++r) ASSERT_EQ(run->exit_codes[r], 0) << Logs(*run);
  for (int round = 0; round < testing::kReplicaRounds; ++round) {
    for (const testing::ReplicaCase& c : testing::kReplicaCases) {
      std::vector<std::string> in, out;
      for (int r = 0; r < world; ++r) {
        const std::string tag = absl::StrCat(c.name, "_", round, "_r", r);
        auto i = testing::ReadFile(absl::StrCat(run->dir, "/in_", tag, ".bin"));
        auto o = testing::ReadFile(absl::StrCat(run->dir, "/out_", tag, ".bin"));
        ASSERT_TRUE(i.ok() && o.ok()) << tag;
        ASSERT_EQ(o->size(), static_cast<size_t>(c.count) * CommDataTypeSize(c.type)) << tag;
        in.push_back(*std::move(i));
        out.push_back(*std::move(o));
      }
      for (int r = 1; r < world; ++r) {
        EXPECT_EQ(FirstDifference(c.type, out[0], out[r]), "")
            << c.name << " round " << round << ": rank " << r << " vs rank 0";
      }
      // The inputs make the order matter: another order gives other bytes.
      std::vector<std::string> reversed(in.rbegin(), in.rend());
      const bool f32 = c.type == CommDataType::kFloat32;
      const std::string want = f32 ? RankOrderSum<float>(in) : RankOrderSum<double>(in);
      ASSERT_NE(want, f32 ? RankOrderSum<float>(reversed) : RankOrderSum<double>(reversed))
          << c.name;
      // Shared memory and the small-message path sum in rank order; Gloo's
      // ring sums each chunk in its own ring order (only the bytes' identity
      // across ranks is promised there), so its result is a sum to within
      // rounding.
      if (shm || c.small) {
        EXPECT_EQ(FirstDifference(c.type, out[0], want), "")
            << c.name << " round " << round << ": rank 0 vs the sum in rank order";
      } else {
        EXPECT_EQ(f32 ? FarFromSum<float>(out[0], in) : FarFromSum<double>(out[0], in), "")
            << c.name << " round " << round;
      }
    }
  }
  Cleanup(*run);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooReplicaTest,
                         ::testing::Combine(kPaths, ::testing::Values(3, 4)),
                         [](const ::testing::TestParamInfo<std::tuple<Path, int>>& i) {
                           return absl::StrCat(PathName(std::get<0>(i.param)), std::get<1>(i.param),
                                               "Ranks");
                         });

// 16-bit all-reduces (ddp.comm_hook's buffers) at 3 ranks, where the order
// of a sum shows: every rank gets the same bytes; shared memory's are the
// float32 sum in rank order rounded once, Gloo's ring's a sum to within
// 16-bit rounding.
class SixteenBitReplicaTest : public ::testing::TestWithParam<Path> {};

TEST_P(SixteenBitReplicaTest, EveryRankGetsTheSameBytes) {
  const bool shm = GetParam() != Path::kTcp;
  const int world = 3;
  auto run = RunRanks("replicas16", world, PathArgs(GetParam()), absl::Seconds(60));
  ASSERT_TRUE(run.ok()) << run.status();
  for (int r = 0; r < world; ++r) ASSERT_EQ(run->exit_codes[r], 0) << Logs(*run);
  for (auto type : {at::kHalf, at::kBFloat16}) {
    for (int64_t count : {int64_t{100003}, int64_t{1000}}) {
      const std::string name = absl::StrCat(c10::toString(type), "_", count);
      SCOPED_TRACE(name);
      std::vector<at::Tensor> in, out;
      for (int r = 0; r < world; ++r) {
        auto i = testing::ReadFile(absl::StrCat(run->dir, "/in_", name, "_r", r, ".bin"));
        auto o = testing::ReadFile(absl::StrCat(run->dir, "/out_", name, "_r", r, ".bin"));
        ASSERT_TRUE(i.ok() && o.ok());
        ASSERT_EQ(o->size(), static_cast<size_t>(count) * 2);
        in.push_back(at::from_blob(i->data(), {count}, type).clone());
        out.push_back(at::from_blob(o->data(), {count}, type).clone());
      }
      for (int r = 1; r < world; ++r)
        EXPECT_TRUE(at::equal(out[0], out[r])) << "rank " << r << " vs rank 0";
      auto exact = in[0].to(at::kDouble) + in[1].to(at::kDouble) + in[2].to(at::kDouble);
      if (shm) {
        auto want = ((in[0].to(at::kFloat) + in[1].to(at::kFloat)) + in[2].to(at::kFloat)).to(type);
        EXPECT_TRUE(at::equal(out[0], want)) << "shared memory: not the float32 sum rounded once";
      } else {
        // Two roundings to 16 bits of partial sums: within 3 ulps of the magnitude.
        const double eps = type == at::kHalf ? 0x1p-10 : 0x1p-7;
        auto magnitude =
            in[0].to(at::kDouble).abs() + in[1].to(at::kDouble).abs() + in[2].to(at::kDouble).abs();
        auto error = (out[0].to(at::kDouble) - exact).abs();
        EXPECT_TRUE(at::all(error <= 3 * eps * magnitude).item<bool>())
            << "max error " << (error / magnitude).max().item<double>() << " of the magnitude";
      }
    }
  }
  Cleanup(*run);
}

INSTANTIATE_TEST_SUITE_P(Paths, SixteenBitReplicaTest, kPaths,
                         [](const ::testing::TestParamInfo<Path>& i) { return PathName(i.param); });

// A shared block on one rank and private memory on the others is an error
// on every rank (the check each shared-memory all-reduce makes), not a sum
// mixed from the two.
TEST(GlooSharedBlockTest, SharedBlockOnOneRankOnlyFailsEveryRank) {
  auto run = RunRanks("shared_mismatch", 3, {{"timeout_ms", "20000"}}, absl::Seconds(40));
  ASSERT_TRUE(run.ok()) << run.status();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(run->exit_codes[r], 0) << Logs(*run);
  Cleanup(*run);
}

}  // namespace
}  // namespace trainctl::dist
