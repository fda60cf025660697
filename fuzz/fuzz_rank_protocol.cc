// The daemon <-> rank contract: the config file parser and the status-line
// parser (the daemon reads lines a rank process wrote). A config that parses
// must format and parse back to itself.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "worker/protocol/rank_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = trainctl::rankproto::ParseConfig(text);
  if (config.ok()) {
    auto back = trainctl::rankproto::ParseConfig(trainctl::rankproto::FormatConfig(*config));
    if (!back.ok() || *back != *config) std::abort();
    for (const auto& [k, v] : *config) {
      (void)trainctl::rankproto::GetInt(*config, k);
      (void)trainctl::rankproto::GetDouble(*config, k);
      (void)trainctl::rankproto::GetBool(*config, k);
    }
  }
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) nl = text.size();
    (void)trainctl::rankproto::ParseStatusLine(std::string(text.substr(start, nl - start)));
    start = nl + 1;
  }
  return 0;
}
