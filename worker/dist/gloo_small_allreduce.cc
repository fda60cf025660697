#include "worker/dist/gloo_small_allreduce.h"

#include <gloo/allgather_ring.h>

#include <cstring>

namespace trainctl::dist {
namespace {

template <typename T>
std::unique_ptr<gloo::Algorithm> NewAllgather(const std::shared_ptr<gloo::Context>& context,
                                              std::vector<char>& input, std::vector<char>& gathered,
                                              int count) {
  return std::make_unique<gloo::AllgatherRing<T>>(
      context, std::vector<const T*>{reinterpret_cast<const T*>(input.data())},
      reinterpret_cast<T*>(gathered.data()), count);
}

// out[i] = gathered[0][i] + gathered[1][i] + ... in rank order (the additions
// of one element never reorder: no -ffast-math, and a vectorised loop adds
// lanes of different elements).
template <typename T>
void SumInRankOrder(const std::vector<char>& gathered, size_t count, int world, void* out) {
  T* o = static_cast<T*>(out);
  const T* g = reinterpret_cast<const T*>(gathered.data());
  std::memcpy(o, g, count * sizeof(T));
  for (int r = 1; r < world; ++r) {
    const T* x = g + static_cast<size_t>(r) * count;
    for (size_t i = 0; i < count; ++i) o[i] += x[i];
  }
}

}  // namespace

SmallAllReducer::SmallAllReducer(std::shared_ptr<gloo::Context> context, int world,
                                 size_t max_bytes)
    : context_(std::move(context)), world_(world), max_bytes_(max_bytes) {}

bool SmallAllReducer::Takes(const CommBuffer& buffer) const {
  return buffer.bytes() <= max_bytes_ &&
         (buffer.type == CommDataType::kFloat32 || buffer.type == CommDataType::kFloat64);
}

SmallAllReducer::Gather& SmallAllReducer::GatherFor(const CommBuffer& buffer) {
  const Key key{static_cast<int>(buffer.type), buffer.count};
  auto it = gathers_.find(key);
  if (it == gathers_.end()) {
    const size_t world = static_cast<size_t>(world_);
    const size_t need = (world + 1) * buffer.bytes();
    while (!lru_.empty() &&
           (gathers_.size() >= kMaxGathers || gather_bytes_ + need > kMaxGatherBytes)) {
      auto victim = gathers_.find(lru_.back());
      gather_bytes_ -= victim->second.input.size() + victim->second.gathered.size();
      gathers_.erase(victim);
      lru_.pop_back();
    }
    Gather g;
    g.input.resize(buffer.bytes());
    g.gathered.resize(world * buffer.bytes());
    const int count = static_cast<int>(buffer.count);
    g.allgather = buffer.type == CommDataType::kFloat32
                      ? NewAllgather<float>(context_, g.input, g.gathered, count)
                      : NewAllgather<double>(context_, g.input, g.gathered, count);
    gather_bytes_ += need;
    it = gathers_.emplace(key, std::move(g)).first;
  } else {
    lru_.remove(key);
  }
  lru_.push_front(key);
  return it->second;
}

void SmallAllReducer::AllReduceSum(const CommBuffer& buffer) {
  Gather& g = GatherFor(buffer);
  std::memcpy(g.input.data(), buffer.data, buffer.bytes());
  g.allgather->run();
  if (buffer.type == CommDataType::kFloat32) {
    SumInRankOrder<float>(g.gathered, buffer.count, world_, buffer.data);
  } else {
    SumInRankOrder<double>(g.gathered, buffer.count, world_, buffer.data);
  }
}

}  // namespace trainctl::dist
