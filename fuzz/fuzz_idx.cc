// IDX files (plain or gzip) as the rank reads them before making tensors:
// the first byte picks images (3 dimensions) or labels (1).
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "worker/engine/dataset_formats.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int dims = (data[0] & 1) ? 3 : 1;
  std::vector<char> raw(reinterpret_cast<const char*>(data) + 1,
                        reinterpret_cast<const char*>(data) + size);
  auto a = trainctl::engine::DecodeIdx(std::move(raw), dims, "fuzz.idx", "IDX file");
  if (!a.ok()) return 0;
  // What the loader relies on: the declared elements lie inside the bytes.
  unsigned __int128 elements = 1;
  for (int64_t d : a->dims) elements *= static_cast<uint64_t>(d);
  if (static_cast<int>(a->dims.size()) != dims || a->data_offset > a->bytes.size() ||
      elements > a->bytes.size() - a->data_offset) {
    std::abort();
  }
  return 0;
}
