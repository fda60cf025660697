// RefusalLog with a fake clock: a flood from one peer costs one line, then
// one line with the count once the interval is over; other peers get their
// own line; memory stays bounded by max_peers.
#include "coordinator/core/refusal_log.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace trainctl::coordinator {
namespace {

LogFields Why(const std::string& reason) { return {{"reason", reason}}; }

TEST(RefusalLogTest, AFloodFromOnePeerIsOneLineThenACount) {
  FakeClock clock;
  RefusalLog log("coordinator", "rpc_refused_test", absl::Seconds(10), &clock);
  for (int i = 0; i < 300; ++i) log.Note("10.0.0.9", Why("unknown token"));
  EXPECT_EQ(log.lines(), 1) << "the first refusal is logged at once, the rest counted";
  log.Flush();
  EXPECT_EQ(log.lines(), 1) << "the interval is not over";
  clock.Advance(absl::Seconds(10));
  log.Flush();
  EXPECT_EQ(log.lines(), 2) << "one line with the count of 299";
  log.Flush();
  EXPECT_EQ(log.lines(), 2) << "nothing pending: no line";
  // Still flooding: at most two lines per interval.
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < 100; ++i) {
      log.Note("10.0.0.9", Why("unknown token"));
      clock.Advance(absl::Milliseconds(100));
    }
    log.Flush();
  }
  EXPECT_LE(log.lines(), 2 + 5 * 2);
  EXPECT_GE(log.lines(), 2 + 5);
}

TEST(RefusalLogTest, QuietPeersLoseNothingAndAreForgotten) {
  FakeClock clock;
  RefusalLog log("coordinator", "rpc_refused_test", absl::Seconds(10), &clock);
  log.Note("10.0.0.1", Why("a"));
  log.Note("10.0.0.2", Why("b"));
  EXPECT_EQ(log.lines(), 2) << "each peer's first refusal is its own line";
  clock.Advance(absl::Seconds(11));
  log.Flush();  // forgets both: nothing pending
  log.Note("10.0.0.1", Why("a again"));
  EXPECT_EQ(log.lines(), 3) << "a new interval: logged at once";
}

TEST(RefusalLogTest, PeersBeyondTheCapShareOneEntry) {
  FakeClock clock;
  RefusalLog log("coordinator", "rpc_refused_test", absl::Seconds(10), &clock, /*max_peers=*/2);
  for (int p = 0; p < 50; ++p) log.Note(absl::StrCat("10.0.1.", p), Why("x"));
  // Two tracked peers, then "(other peers)": three lines, not fifty.
  EXPECT_EQ(log.lines(), 3);
}

}  // namespace
}  // namespace trainctl::coordinator
