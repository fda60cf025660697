// The dashboard's files (coordinator/web/: page, script, style, and the
// vendored Chart.js), embedded in the binary at build time by
// coordinator/web/embed.cmake: the coordinator serves its dashboard offline,
// with nothing installed beside it.
#pragma once

#include <cstddef>
#include <string_view>

namespace trainctl::coordinator::web {

struct Asset {
  // URL path it is served at ("/static/chart.min.js").
  const char* path;
  const unsigned char* data;
  size_t size;
  const char* content_type;

  std::string_view bytes() const { return {reinterpret_cast<const char*>(data), size}; }
};

// Every embedded file; ends with an entry whose path is nullptr.
extern const Asset kAssets[];

// The asset served at `path`; nullptr when none.
inline const Asset* FindAsset(std::string_view path) {
  for (const Asset* a = kAssets; a->path != nullptr; ++a) {
    if (path == a->path) return a;
  }
  return nullptr;
}

}  // namespace trainctl::coordinator::web
