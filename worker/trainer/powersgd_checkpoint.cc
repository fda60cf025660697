#include "worker/trainer/powersgd_checkpoint.h"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <exception>

#include "absl/strings/str_cat.h"

namespace trainctl::trainer {
namespace {

constexpr char kKey[] = "powersgd";
constexpr int64_t kVersion = 1;

std::string ErrorKey(size_t rank, size_t bucket) { return absl::StrCat("e", rank, "_", bucket); }

}  // namespace

void WritePowerSgdState(torch::serialize::OutputArchive& archive,
                        const dist::PowerSgdState& state) {
  torch::serialize::OutputArchive sub;
  sub.write("version", c10::IValue(kVersion));
  sub.write("iter", c10::IValue(state.iter));
  sub.write("rng", c10::IValue(state.rng));
  sub.write("layout", c10::IValue(state.layout));
  sub.write("world_size", c10::IValue(state.world_size));
  sub.write("has_q", c10::IValue(state.has_q));
  sub.write("buckets", c10::IValue(static_cast<int64_t>(state.q.size())));
  for (size_t b = 0; b < state.q.size(); ++b) {
    sub.write(absl::StrCat("q", b), state.q[b].detach().cpu());
  }
  // Whether every rank's error feedback follows (all world_size rows).
  const bool errors = !state.errors.empty();
  sub.write("errors", c10::IValue(errors));
  for (size_t r = 0; errors && r < state.errors.size(); ++r) {
    for (size_t b = 0; b < state.errors[r].size(); ++b) {
      sub.write(ErrorKey(r, b), state.errors[r][b].detach().cpu());
    }
  }
  archive.write(kKey, sub);
}

void ReadPowerSgdState(torch::serialize::InputArchive& archive, PowerSgdCheckpointRead* read) {
  read->state.reset();
  read->unreadable.clear();
  try {
    torch::serialize::InputArchive sub;
    if (!archive.try_read(kKey, sub)) return;  // an older checkpoint, or no PowerSGD
    c10::IValue v;
    sub.read("version", v);
    if (v.toInt() != kVersion) {
      read->unreadable =
          absl::StrCat("version ", v.toInt(), " (this trainctl reads ", kVersion, ")");
      return;
    }
    dist::PowerSgdState s;
    sub.read("iter", v);
    s.iter = v.toInt();
    sub.read("rng", v);
    s.rng = v.toStringRef();
    sub.read("layout", v);
    s.layout = v.toStringRef();
    sub.read("world_size", v);
    s.world_size = v.toInt();
    sub.read("has_q", v);
    s.has_q = v.toBool();
    sub.read("buckets", v);
    const int64_t buckets = v.toInt();
    if (s.iter < 0 || s.world_size < 1 || buckets < 0) {
      read->unreadable = "a negative step count, world size or bucket count";
      return;
    }
    for (int64_t b = 0; b < buckets; ++b) {
      at::Tensor q;
      sub.read(absl::StrCat("q", b), q);
      s.q.push_back(q.cpu());
    }
    sub.read("errors", v);
    if (v.toBool() && read->rank >= 0 && read->rank < s.world_size) {
      // Only this rank's row: a resume at another world size restores none.
      s.errors.resize(static_cast<size_t>(s.world_size));
      auto& mine = s.errors[static_cast<size_t>(read->rank)];
      for (int64_t b = 0; b < buckets; ++b) {
        at::Tensor e;
        sub.read(ErrorKey(static_cast<size_t>(read->rank), static_cast<size_t>(b)), e);
        mine.push_back(e.cpu());
      }
    } else if (v.toBool()) {
      // This rank is outside the saving world: the rows are there, none is ours.
      s.errors.resize(static_cast<size_t>(s.world_size));
    }
    read->state = std::move(s);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    read->unreadable = absl::StrCat("unreadable (", what.substr(0, what.find('\n')), ")");
    read->state.reset();
  }
}

}  // namespace trainctl::trainer
