// The Gloo engine's small-message all-reduce (gloo_collectives.h,
// GlooOptions::small_allreduce_max_bytes): an all-gather over a mesh of
// sync pairs, then a sum in rank order.
//
// Rank r's buffer lands at gathered[r * count] on every rank, and every rank
// computes gathered[0] + gathered[1] + ... + gathered[W-1], element by
// element. Every rank thus adds the same numbers in the same order and gets
// the same bytes (the bytes shared memory gives too), where a ring all-reduce
// has rank r add in the order r, r-1, ..., so that at 3 ranks and more the
// replicas drift apart (issue #47). The cost is that of the ring it replaces:
// W - 1 rounds of `count` elements each way, plus one more addition per
// element.
//
// One all-gather per (type, count), with its own buffers: Gloo's buffer-based
// algorithms bind their memory and slots when built, so they are built once
// per shape and reused. Every rank issues the same sequence of shapes, so
// every rank builds (and evicts) the same ones in the same order and their
// slots agree.
//
// Threading: not thread-safe; the engine runs one collective at a time.
#pragma once

#include <gloo/algorithm.h>
#include <gloo/context.h>

#include <cstddef>
#include <list>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "worker/dist/collectives.h"

namespace trainctl::dist {

class SmallAllReducer {
 public:
  // `context`: the small-message mesh (sync pairs) of `world` ranks;
  // buffers of up to `max_bytes` take this path.
  SmallAllReducer(std::shared_ptr<gloo::Context> context, int world, size_t max_bytes);

  // Whether an all-reduce of `buffer` takes this path (float32/float64 up to
  // max_bytes).
  bool Takes(const CommBuffer& buffer) const;

  // Sums `buffer` over the ranks in rank order, in place. Throws Gloo's
  // exceptions.
  void AllReduceSum(const CommBuffer& buffer);

 private:
  struct Gather {
    std::vector<char> input;     // this rank's buffer
    std::vector<char> gathered;  // world buffers, rank order
    std::unique_ptr<gloo::Algorithm> allgather;
  };
  using Key = std::pair<int, size_t>;  // (CommDataType, count)
  static constexpr size_t kMaxGathers = 32;
  // Bounds the buffers they hold together ((W + 1) x the shape's bytes each).
  static constexpr size_t kMaxGatherBytes = 8 << 20;

  Gather& GatherFor(const CommBuffer& buffer);

  const std::shared_ptr<gloo::Context> context_;
  const int world_;
  const size_t max_bytes_;
  std::map<Key, Gather> gathers_;
  std::list<Key> lru_;       // keys of gathers_, most recent first
  size_t gather_bytes_ = 0;  // their input + gathered bytes
};

}  // namespace trainctl::dist
