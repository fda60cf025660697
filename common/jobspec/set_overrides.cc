#include "common/jobspec/set_overrides.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/jobspec/spec_fields.h"

namespace trainctl::jobspec {

absl::flat_hash_set<std::string> ApplyOverrides(YAML::Node& root,
                                                const std::vector<std::string>& overrides,
                                                std::vector<SpecError>* errors) {
  absl::flat_hash_set<std::string> paths;
  for (const std::string& o : overrides) {
    auto fail = [&](std::string field, std::string msg) {
      errors->push_back(SpecError{"--set", 0, 0, std::move(field), std::move(msg)});
    };
    size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      fail("", absl::StrCat("expected key.path=value, got ", Quote(o)));
      continue;
    }
    std::string path = o.substr(0, eq);
    std::vector<std::string> keys = absl::StrSplit(path, '.');
    if (std::any_of(keys.begin(), keys.end(), [](const std::string& k) { return k.empty(); })) {
      fail(path, "empty key in path");
      continue;
    }
    YAML::Node value;
    try {
      value = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      fail(path, absl::StrCat("value is not valid YAML: ", e.msg));
      continue;
    }
    if (!root.IsMap() && !root.IsNull()) continue;  // The document error is reported elsewhere.
    // Walk by copies of node handles: yaml-cpp nodes are references.
    std::vector<YAML::Node> chain{root};
    bool ok = true;
    for (size_t i = 0; i + 1 < keys.size(); ++i) {
      YAML::Node next = chain.back()[keys[i]];
      if (!next.IsDefined() || next.IsNull()) {
        chain.back()[keys[i]] = YAML::Node(YAML::NodeType::Map);
        next = chain.back()[keys[i]];
      } else if (!next.IsMap()) {
        fail(path, absl::StrCat("'", absl::StrJoin(keys.begin(), keys.begin() + i + 1, "."),
                                "' is not a mapping in the file"));
        ok = false;
        break;
      }
      chain.push_back(next);
    }
    if (!ok) continue;
    chain.back()[keys.back()] = value;
    paths.insert(path);
  }
  return paths;
}

}  // namespace trainctl::jobspec
