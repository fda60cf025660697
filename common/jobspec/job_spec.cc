#include "common/jobspec/job_spec.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "yaml-cpp/yaml.h"

namespace trainctl {

bool IsCommandContractVariable(std::string_view name) {
  static constexpr std::string_view kSet[] = {
      "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
      "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
      "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
      "CUDA_VISIBLE_DEVICES"};
  for (std::string_view v : kSet) {
    if (name == v) return true;
  }
  return name.substr(0, 9) == "TRAINCTL_";
}

namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

constexpr int kMaxSequenceLength = 64;
constexpr size_t kMaxStringBytes = 4096;

// Well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF), as protobuf requires of a string field.
bool IsValidUtf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
      cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += len;
  }
  return true;
}
// A whole spec as submitted over gRPC.
constexpr size_t kMaxSpecBytes = 1 << 20;

// Where a field's value was written: in the file (line/column, 1-based), or
// in a --set override.
struct Position {
  int line = 0;
  int column = 0;
  bool from_override = false;
};

// Messages whose YAML form names the chosen oneof member with a key, e.g.
// `model: {name: cnn, classes: 10}` or `train: {format: idx, ...}`.
const char* DiscriminatorKey(const Descriptor* d) {
  if (d == v1::ModelSpec::descriptor()) return "name";
  if (d == v1::DatasetSpec::descriptor()) return "format";
  return nullptr;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// "; did you mean 'x'?" when one candidate is close enough, else "".
std::string DidYouMean(std::string_view got, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::string::npos;
  for (const std::string& c : candidates) {
    size_t d = EditDistance(absl::AsciiStrToLower(std::string(got)), c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  bool close = best_distance <= 2 || best_distance * 3 <= got.size() ||
               (!got.empty() && absl::StartsWith(best, absl::AsciiStrToLower(std::string(got))));
  if (best.empty() || !close || best_distance == 0) return "";
  return absl::StrCat("; did you mean '", best, "'?");
}

// The common prefix of an enum's value names, from its zero value:
// OPTIMIZER_UNSPECIFIED → "OPTIMIZER_".
std::string EnumPrefix(const EnumDescriptor* e) {
  std::string zero = e->value(0)->name();
  return zero.substr(0, zero.size() - std::string("UNSPECIFIED").size());
}

std::vector<std::string> EnumChoices(const EnumDescriptor* e) {
  std::vector<std::string> out;
  for (int i = 1; i < e->value_count(); ++i) out.push_back(EnumValueName(e->value(i)));
  return out;
}

// Quotes a scalar for an error message, shortened when long.
std::string Quote(std::string_view s) {
  if (s.size() > 40) return absl::StrCat("'", std::string(s.substr(0, 37)), "...'");
  return absl::StrCat("'", std::string(s), "'");
}

std::string FormatNumber(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrCat(static_cast<int64_t>(v));
  return absl::StrCat(v);
}

const char* NodeKind(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "nothing";
    default:
      return "a scalar";
  }
}

// Reads YAML into a JobSpec by protobuf reflection: a YAML key is a proto
// field name, enum values are the lower-case value names without the prefix.
// Collects every problem, records where each value was written.
class YamlReader {
 public:
  YamlReader(std::string file, absl::flat_hash_set<std::string> override_paths)
      : file_(std::move(file)), override_paths_(std::move(override_paths)) {}

  void ReadRoot(const YAML::Node& root, v1::JobSpec* spec) { ReadMessage(root, "", spec); }

  std::vector<SpecError>& errors() { return errors_; }
  const absl::flat_hash_map<std::string, Position>& positions() const { return positions_; }
  const absl::flat_hash_set<std::string>& error_paths() const { return error_paths_; }

  void Error(const YAML::Mark& mark, const std::string& path, std::string message) {
    error_paths_.insert(path);
    SpecError e;
    Position p = PositionOf(mark, path);
    if (p.from_override) {
      e.file = "--set";
    } else {
      e.file = file_;
      e.line = p.line;
      e.column = p.column;
    }
    e.field = path;
    e.message = std::move(message);
    errors_.push_back(std::move(e));
  }

 private:
  Position PositionOf(const YAML::Mark& mark, const std::string& path) const {
    Position p;
    for (const std::string& o : override_paths_) {
      // The overridden value and what is under it, or a key that only the
      // override created (it has no place in the file).
      if (path == o || absl::StartsWith(path, o + ".") || absl::StartsWith(path, o + "[") ||
          (mark.is_null() && absl::StartsWith(o, path + "."))) {
        p.from_override = true;
        return p;
      }
    }
    p.line = mark.is_null() ? 1 : mark.line + 1;
    p.column = mark.is_null() ? 1 : mark.column + 1;
    return p;
  }

  static std::string Join(const std::string& path, const std::string& key) {
    return path.empty() ? key : absl::StrCat(path, ".", key);
  }

  void ReadMessage(const YAML::Node& node, const std::string& path, Message* msg) {
    if (node.IsNull()) return;  // `training:` with nothing under it: all defaults.
    if (!node.IsMap()) {
      Error(node.Mark(), path, absl::StrCat("must be a mapping, got ", NodeKind(node)));
      return;
    }
    positions_[path] = PositionOf(node.Mark(), path);

    const Descriptor* desc = msg->GetDescriptor();
    Message* target = msg;
    const char* disc = DiscriminatorKey(desc);
    if (disc != nullptr) {
      target = SelectOneofMember(node, path, msg, disc);
      if (target == nullptr) return;
    }
    const Descriptor* target_desc = target->GetDescriptor();

    std::vector<std::string> known;
    if (disc != nullptr) known.push_back(disc);
    for (int i = 0; i < target_desc->field_count(); ++i) known.push_back(target_desc->field(i)->name());

    absl::flat_hash_map<std::string, YAML::Mark> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      // Copies: the iterator yields temporaries (yaml-cpp node handles are cheap).
      const YAML::Node key = it->first;
      const YAML::Node value = it->second;
      if (!key.IsScalar()) {
        Error(key.Mark(), path, absl::StrCat("keys must be plain names, got ", NodeKind(key)));
        continue;
      }
      const std::string& k = key.Scalar();
      std::string child = Join(path, k);
      auto [prev, inserted] = seen.emplace(k, key.Mark());
      if (!inserted) {
        Error(key.Mark(), child,
              absl::StrCat("duplicate key (first at line ", prev->second.line + 1, ")"));
        continue;
      }
      if (disc != nullptr && k == disc) continue;
      const FieldDescriptor* field = target_desc->FindFieldByName(k);
      if (field == nullptr) {
        std::string what = path.empty() ? "" : absl::StrCat(" in ", path);
        std::string hint = DidYouMean(k, known);
        if (hint.empty()) hint = NestedHint(target_desc, k);
        Error(key.Mark(), child, absl::StrCat("unknown key", what, hint));
        continue;
      }
      ReadField(value, child, target, field);
    }
  }

  // "; did you mean 'optimizer.lr'?" when `key` is a field one level down.
  static std::string NestedHint(const Descriptor* desc, const std::string& key) {
    for (int i = 0; i < desc->field_count(); ++i) {
      const Descriptor* sub = desc->field(i)->message_type();
      if (sub == nullptr || DiscriminatorKey(sub) != nullptr) continue;
      if (sub->FindFieldByName(key) != nullptr) {
        return absl::StrCat("; did you mean '", desc->field(i)->name(), ".", key, "'?");
      }
    }
    return "";
  }

  // Sets and returns the oneof member `node[disc]` names; nullptr on error.
  Message* SelectOneofMember(const YAML::Node& node, const std::string& path, Message* msg,
                             const char* disc) {
    const Descriptor* desc = msg->GetDescriptor();
    std::vector<std::string> choices;
    for (int i = 0; i < desc->field_count(); ++i) choices.push_back(desc->field(i)->name());
    std::string disc_path = Join(path, disc);
    YAML::Node value = node[disc];
    if (!value) {
      Error(node.Mark(), disc_path,
            absl::StrCat("required: one of ", absl::StrJoin(choices, ", ")));
      return nullptr;
    }
    if (!value.IsScalar()) {
      Error(value.Mark(), disc_path, absl::StrCat("must be one of ", absl::StrJoin(choices, ", "),
                                                  ", got ", NodeKind(value)));
      return nullptr;
    }
    const FieldDescriptor* member = desc->FindFieldByName(value.Scalar());
    if (member == nullptr || member->message_type() == nullptr) {
      Error(value.Mark(), disc_path,
            absl::StrCat("must be one of ", absl::StrJoin(choices, ", "), ", got ",
                         Quote(value.Scalar()), DidYouMean(value.Scalar(), choices)));
      return nullptr;
    }
    positions_[disc_path] = PositionOf(value.Mark(), disc_path);
    return msg->GetReflection()->MutableMessage(msg, member);
  }

  void ReadField(const YAML::Node& value, const std::string& path, Message* msg,
                 const FieldDescriptor* field) {
    if (field->is_map()) {
      ReadStringMap(value, path, msg, field);
      return;
    }
    if (field->is_repeated()) {
      if (value.IsNull()) {
        positions_[path] = PositionOf(value.Mark(), path);
        return;
      }
      if (!value.IsSequence()) {
        Error(value.Mark(), path, absl::StrCat("must be a list, got ", NodeKind(value)));
        return;
      }
      if (value.size() > kMaxSequenceLength) {
        Error(value.Mark(), path,
              absl::StrCat("at most ", kMaxSequenceLength, " entries, got ", value.size()));
        return;
      }
      positions_[path] = PositionOf(value.Mark(), path);
      for (size_t i = 0; i < value.size(); ++i) {
        std::string element = absl::StrCat(path, "[", i, "]");
        if (ReadScalar(value[i], element, msg, field)) {
          positions_[element] = PositionOf(value[i].Mark(), element);
        }
      }
      return;
    }
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      ReadMessage(value, path, msg->GetReflection()->MutableMessage(msg, field));
      return;
    }
    if (ReadScalar(value, path, msg, field)) positions_[path] = PositionOf(value.Mark(), path);
  }

  // A map<string, string> field (command.env) from a mapping of scalars.
  void ReadStringMap(const YAML::Node& value, const std::string& path, Message* msg,
                     const FieldDescriptor* field) {
    const Descriptor* entry = field->message_type();
    if (entry->map_key()->cpp_type() != FieldDescriptor::CPPTYPE_STRING ||
        entry->map_value()->cpp_type() != FieldDescriptor::CPPTYPE_STRING) {
      Error(value.Mark(), path, "not supported in job.yaml");
      return;
    }
    if (value.IsNull()) {
      positions_[path] = PositionOf(value.Mark(), path);
      return;
    }
    if (!value.IsMap()) {
      Error(value.Mark(), path, absl::StrCat("must be a mapping of NAME: value, got ", NodeKind(value)));
      return;
    }
    if (value.size() > kMaxSequenceLength) {
      Error(value.Mark(), path, absl::StrCat("at most ", kMaxSequenceLength, " entries, got ", value.size()));
      return;
    }
    positions_[path] = PositionOf(value.Mark(), path);
    absl::flat_hash_set<std::string> seen;
    for (auto it = value.begin(); it != value.end(); ++it) {
      const YAML::Node k = it->first;
      const YAML::Node v = it->second;
      if (!k.IsScalar()) {
        Error(k.Mark(), path, absl::StrCat("keys must be plain names, got ", NodeKind(k)));
        continue;
      }
      std::string child = absl::StrCat(path, ".", k.Scalar());
      if (!seen.insert(k.Scalar()).second) {
        Error(k.Mark(), child, "duplicate key");
        continue;
      }
      if (!v.IsScalar()) {
        Error(v.Mark(), child, absl::StrCat("must be a string, got ", NodeKind(v)));
        continue;
      }
      if (v.Scalar().size() > kMaxStringBytes || k.Scalar().size() > kMaxStringBytes) {
        Error(v.Mark(), child, absl::StrCat("at most ", kMaxStringBytes, " bytes"));
        continue;
      }
      Message* e = msg->GetReflection()->AddMessage(msg, field);
      e->GetReflection()->SetString(e, entry->map_key(), k.Scalar());
      e->GetReflection()->SetString(e, entry->map_value(), v.Scalar());
      positions_[child] = PositionOf(k.Mark(), child);
    }
  }

  // Converts one scalar into `field` (appending when repeated). False on error.
  bool ReadScalar(const YAML::Node& value, const std::string& path, Message* msg,
                  const FieldDescriptor* field) {
    const Reflection* r = msg->GetReflection();
    const bool rep = field->is_repeated();
    const char* expected = "a value";
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64:
      case FieldDescriptor::CPPTYPE_UINT64:
        expected = "an integer";
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        expected = "a number";
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        expected = "true or false";
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        expected = "one of";
        break;
      default:
        expected = "a string";
    }
    if (value.IsNull()) {
      Error(value.Mark(), path, "missing value");
      return false;
    }
    if (!value.IsScalar()) {
      std::string what = field->cpp_type() == FieldDescriptor::CPPTYPE_ENUM
                             ? absl::StrCat("one of ", absl::StrJoin(EnumChoices(field->enum_type()), ", "))
                             : std::string(expected);
      Error(value.Mark(), path, absl::StrCat("must be ", what, ", got ", NodeKind(value)));
      return false;
    }
    const std::string& s = value.Scalar();
    const bool quoted = value.Tag() == "!";
    auto type_error = [&](std::string extra = "") {
      Error(value.Mark(), path,
            absl::StrCat("must be ", expected, ", got ", quoted ? "the string " : "", Quote(s), extra));
      return false;
    };

    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64: {
        int64_t v;
        if (quoted || !absl::SimpleAtoi(s, &v)) {
          double d;
          if (!quoted && absl::SimpleAtod(s, &d) && std::isfinite(d) && d == std::floor(d)) {
            return type_error(" (out of range)");
          }
          return type_error();
        }
        if (field->cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
          if (v < INT32_MIN || v > INT32_MAX) return type_error(" (out of range)");
          rep ? r->AddInt32(msg, field, static_cast<int32_t>(v))
              : r->SetInt32(msg, field, static_cast<int32_t>(v));
        } else {
          rep ? r->AddInt64(msg, field, v) : r->SetInt64(msg, field, v);
        }
        return true;
      }
      case FieldDescriptor::CPPTYPE_UINT64: {
        uint64_t v;
        if (quoted || absl::StartsWith(s, "-") || !absl::SimpleAtoi(s, &v)) {
          return type_error(absl::StartsWith(s, "-") ? " (must not be negative)" : "");
        }
        rep ? r->AddUInt64(msg, field, v) : r->SetUInt64(msg, field, v);
        return true;
      }
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        double v;
        if (quoted || !absl::SimpleAtod(s, &v)) return type_error();
        if (!std::isfinite(v)) return type_error(" (must be finite)");
        rep ? r->AddDouble(msg, field, v) : r->SetDouble(msg, field, v);
        return true;
      }
      case FieldDescriptor::CPPTYPE_BOOL: {
        bool v;
        if (!quoted && (s == "true" || s == "True" || s == "TRUE")) {
          v = true;
        } else if (!quoted && (s == "false" || s == "False" || s == "FALSE")) {
          v = false;
        } else {
          return type_error();
        }
        rep ? r->AddBool(msg, field, v) : r->SetBool(msg, field, v);
        return true;
      }
      case FieldDescriptor::CPPTYPE_ENUM: {
        const EnumDescriptor* e = field->enum_type();
        std::vector<std::string> choices = EnumChoices(e);
        const EnumValueDescriptor* ev =
            e->FindValueByName(EnumPrefix(e) + absl::AsciiStrToUpper(s));
        if (ev == nullptr || ev->number() == 0) {
          Error(value.Mark(), path,
                absl::StrCat("must be one of ", absl::StrJoin(choices, ", "), ", got ", Quote(s),
                             DidYouMean(s, choices)));
          return false;
        }
        rep ? r->AddEnum(msg, field, ev) : r->SetEnum(msg, field, ev);
        return true;
      }
      case FieldDescriptor::CPPTYPE_STRING: {
        if (s.size() > kMaxStringBytes) {
          Error(value.Mark(), path,
                absl::StrCat("at most ", kMaxStringBytes, " bytes, got ", s.size()));
          return false;
        }
        rep ? r->AddString(msg, field, s) : r->SetString(msg, field, s);
        return true;
      }
      default:
        Error(value.Mark(), path, "not supported in job.yaml");
        return false;
    }
  }

  std::string file_;
  absl::flat_hash_set<std::string> override_paths_;
  std::vector<SpecError> errors_;
  absl::flat_hash_map<std::string, Position> positions_;
  absl::flat_hash_set<std::string> error_paths_;
};

// Semantic checks on a JobSpec, shared by job.yaml and gRPC submissions.
// For YAML it knows which fields were written (a written 0 is an error where
// an absent one means "default") and where.
class Validator {
 public:
  Validator(std::string file, const absl::flat_hash_map<std::string, Position>* positions,
            const absl::flat_hash_set<std::string>* error_paths)
      : file_(std::move(file)), positions_(positions), error_paths_(error_paths) {}

  std::vector<SpecError> Run(const v1::JobSpec& raw) {
    // A gRPC client is not held to the YAML parser's limits: bound the whole
    // spec, every string, list and enum here, before anything else reads it.
    const size_t bytes = raw.ByteSizeLong();
    if (bytes > kMaxSpecBytes) {
      Error("spec", absl::StrCat("is ", bytes, " bytes; at most ", kMaxSpecBytes, " (1 MiB)"));
      return std::move(errors_);
    }
    CheckBounds(raw, "");
    if (!errors_.empty()) return std::move(errors_);
    v1::JobSpec s = raw;
    ResolveJobSpecDefaults(&s);
    CheckName(raw.name());
    Range("world_size", raw.world_size(), 1, 65536, /*zero_is_default=*/true);
    Range("priority", raw.priority(), -1000, 1000, true);
    if (raw.has_command()) {
      CheckCommand(raw);
    } else {
      CheckModel(raw);
      CheckData(raw, s);
      CheckTraining(raw, s);
    }
    CheckDevice(s);
    CheckDdp(raw);
    Range("checkpoint.every_epochs", raw.checkpoint().every_epochs(), 0, 1000000, false);
    Range("checkpoint.keep", raw.checkpoint().keep(), 1, 1000, true);
    Range("checkpoint.every_steps", raw.checkpoint().every_steps(), 0, 1000000000, false);
    Range("restart.max_restarts", raw.restart().max_restarts(), 0, 1000, false);
    Range("restart.progress_timeout_s", raw.restart().progress_timeout_s(), 0, 7 * 24 * 3600, false);
    Range("metrics.every_steps", raw.metrics().every_steps(), 1, 1000000, true);
    CheckHealth(raw);
    if (const double t = raw.stragglers().threshold(); (t != 0 || Written("stragglers.threshold")) &&
                                                       (!std::isfinite(t) || t <= 0 || t > 100)) {
      Error("stragglers.threshold",
            absl::StrCat("must be in (0, 100] (a fraction: 0.3 = 30% slower than the median), got ",
                         FormatNumber(t)));
    }
    CheckResumeFrom(raw.resume_from().job());
    CheckElastic(raw, s);
    return std::move(errors_);
  }

 private:
  bool Written(const std::string& path) const {
    return positions_ != nullptr && positions_->contains(path);
  }

  // Skips fields that already failed to parse, and their parents/children.
  bool Suppressed(const std::string& path) const {
    if (error_paths_ == nullptr) return false;
    for (const std::string& e : *error_paths_) {
      if (e == path || absl::StartsWith(path, e + ".") || absl::StartsWith(e, path + ".")) return true;
    }
    return false;
  }

  void Error(const std::string& path, std::string message) {
    if (Suppressed(path)) return;
    SpecError e;
    e.field = path;
    e.message = std::move(message);
    if (positions_ != nullptr) {
      // The field's own position, else its nearest written ancestor's, else 1:1.
      std::string p = path;
      e.file = file_;
      e.line = 1;
      e.column = 1;
      while (true) {
        auto it = positions_->find(p);
        if (it != positions_->end()) {
          if (it->second.from_override) {
            e.file = "--set";
            e.line = e.column = 0;
          } else {
            e.line = it->second.line;
            e.column = it->second.column;
          }
          break;
        }
        size_t dot = p.find_last_of('.');
        if (dot == std::string::npos) break;
        p = p.substr(0, dot);
      }
    }
    errors_.push_back(std::move(e));
  }

  // lo <= v <= hi. A zero that means "default" is fine unless it was written.
  void Range(const std::string& path, int64_t v, int64_t lo, int64_t hi, bool zero_is_default) {
    if (v == 0 && zero_is_default && !Written(path)) return;
    if (v < lo || v > hi) {
      if (lo == 1 && v < lo) {
        Error(path, absl::StrCat("must be > 0, got ", v));
      } else if (lo == 0 && v < lo) {
        Error(path, absl::StrCat("must be >= 0, got ", v));
      } else {
        Error(path, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
      }
    }
  }

  void PositiveNumber(const std::string& path, double v, bool zero_is_default) {
    if (v == 0 && zero_is_default && !Written(path)) return;
    if (!std::isfinite(v) || v <= 0) Error(path, absl::StrCat("must be > 0, got ", FormatNumber(v)));
  }

  void NonNegativeNumber(const std::string& path, double v) {
    if (!std::isfinite(v) || v < 0) Error(path, absl::StrCat("must be >= 0, got ", FormatNumber(v)));
  }

  void UnitInterval(const std::string& path, double v) {
    if (!std::isfinite(v) || v < 0 || v >= 1) {
      Error(path, absl::StrCat("must be in [0, 1), got ", FormatNumber(v)));
    }
  }

  void Required(const std::string& path, const std::string& v) {
    if (v.empty()) Error(path, "required");
  }

  // Strings at most kMaxStringBytes and without NUL (they become paths and
  // config lines), lists at most kMaxSequenceLength, enums known values.
  void CheckBounds(const Message& m, const std::string& prefix) {
    const Reflection* r = m.GetReflection();
    std::vector<const FieldDescriptor*> fields;
    r->ListFields(m, &fields);
    for (const FieldDescriptor* f : fields) {
      const std::string path = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
      if (f->is_map()) {
        const int n = r->FieldSize(m, f);
        if (n > kMaxSequenceLength) {
          Error(path, absl::StrCat("at most ", kMaxSequenceLength, " entries, got ", n));
          continue;
        }
        for (int i = 0; i < n; ++i) {
          const Message& e = r->GetRepeatedMessage(m, f, i);
          const Descriptor* ed = e.GetDescriptor();
          std::string key = e.GetReflection()->GetString(e, ed->map_key());
          std::string entry_path = absl::StrCat(path, ".", key.size() > 64 ? key.substr(0, 64) : key);
          CheckBoundsValue(e, ed->map_key(), -1, entry_path);
          CheckBoundsValue(e, ed->map_value(), -1, entry_path);
        }
        continue;
      }
      if (f->is_repeated()) {
        const int n = r->FieldSize(m, f);
        if (n > kMaxSequenceLength) {
          Error(path, absl::StrCat("at most ", kMaxSequenceLength, " items, got ", n));
          continue;
        }
        for (int i = 0; i < n; ++i) CheckBoundsValue(m, f, i, absl::StrCat(path, "[", i, "]"));
      } else {
        CheckBoundsValue(m, f, -1, path);
      }
    }
  }

  void CheckBoundsValue(const Message& m, const FieldDescriptor* f, int index, const std::string& path) {
    const Reflection* r = m.GetReflection();
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING: {
        std::string scratch;
        const std::string& v = index < 0 ? r->GetStringReference(m, f, &scratch)
                                         : r->GetRepeatedStringReference(m, f, index, &scratch);
        if (v.size() > kMaxStringBytes) {
          Error(path, absl::StrCat("at most ", kMaxStringBytes, " bytes, got ", v.size()));
        } else if (v.find('\0') != std::string::npos) {
          Error(path, "contains a NUL byte");
        } else if (!IsValidUtf8(v)) {
          // protobuf refuses to parse such a string field: the spec would
          // pass here and fail on the wire (or in the rank's config).
          Error(path, "is not valid UTF-8");
        } else if (auto c = std::find_if(v.begin(), v.end(),
                                         [](char ch) {
                                           // Tabs and line breaks may be meant (a script);
                                           // other C0 controls and DEL never are.
                                           return ((ch >= 0 && ch < 0x20) || ch == 0x7f) &&
                                                  ch != '\t' && ch != '\n' && ch != '\r';
                                         });
                   c != v.end()) {
          Error(path, absl::StrCat("contains a control character (0x", absl::Hex(static_cast<unsigned char>(*c), absl::kZeroPad2), ")"));
        }
        break;
      }
      case FieldDescriptor::CPPTYPE_ENUM: {
        const int v = index < 0 ? r->GetEnumValue(m, f) : r->GetRepeatedEnumValue(m, f, index);
        if (f->enum_type()->FindValueByNumber(v) == nullptr) {
          Error(path, absl::StrCat("unknown value ", v, "; expected one of ",
                                   absl::StrJoin(EnumChoices(f->enum_type()), ", ")));
        }
        break;
      }
      case FieldDescriptor::CPPTYPE_MESSAGE:
        CheckBounds(index < 0 ? r->GetMessage(m, f) : r->GetRepeatedMessage(m, f, index), path);
        break;
      default:
        break;
    }
  }

  // The user's program: argv, and an environment that leaves torchrun's
  // contract to the worker. The built-in engine's blocks are not allowed with it.
  void CheckCommand(const v1::JobSpec& raw) {
    const v1::CommandSpec& c = raw.command();
    for (const char* other : {"model", "data", "training"}) {
      const FieldDescriptor* f = v1::JobSpec::descriptor()->FindFieldByName(other);
      if (raw.GetReflection()->HasField(raw, f)) {
        Error(other, "not allowed with command: a job runs either trainctl's engine "
                     "(model, data, training) or its own command, not both");
      }
    }
    if (!raw.resume_from().job().empty()) {
      Error("resume_from.job", "only for trainctl's engine; a command job resumes from its own files in "
                               "TRAINCTL_CHECKPOINT_DIR");
    }
    if (c.argv_size() == 0) {
      Error("command.argv", "required: the program and its arguments, e.g. [python3, train.py]");
    } else if (c.argv(0).empty()) {
      Error("command.argv[0]", "must name the program, got an empty string");
    }
    for (const auto& [name, value] : c.env()) {
      std::string path = absl::StrCat("command.env.", name);
      bool ok = !name.empty() && !(name[0] >= '0' && name[0] <= '9') &&
                std::all_of(name.begin(), name.end(), [](char ch) {
                  return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
                         ch == '_';
                });
      if (!ok) {
        Error(path, "not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)");
      } else if (IsCommandContractVariable(name)) {
        Error(path, "set by the worker for every rank (torchrun's contract); it cannot be overridden");
      }
    }
  }

  // A job id: the name's characters plus the "-xxxxxx" the coordinator adds.
  void CheckHealth(const v1::JobSpec& raw) {
    const v1::HealthSpec& h = raw.health();
    if (!raw.has_health()) return;
    if (raw.has_command()) {
      Error("health", "only for trainctl's engine (a command job's NaNs are its own)");
      return;
    }
    if (h.has_max_rollbacks()) Range("health.max_rollbacks", h.max_rollbacks(), 0, 1000, false);
    if (h.has_min_loss_scale()) NonNegativeNumber("health.min_loss_scale", h.min_loss_scale());
    if (h.has_max_skipped_steps()) Range("health.max_skipped_steps", h.max_skipped_steps(), 0, 1 << 30, false);
    if (h.debug_nan_at_step() < 0) {
      Error("health.debug_nan_at_step", absl::StrCat("must be >= 0, got ", h.debug_nan_at_step()));
    }
  }

  void CheckResumeFrom(const std::string& id) {
    if (id.empty()) return;
    bool ok = id.size() <= 128 && std::all_of(id.begin(), id.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
    });
    if (!ok) Error("resume_from.job", "not a job id ([a-z0-9-], at most 128 characters)");
  }

  void CheckName(const std::string& name) {
    if (name.empty()) {
      Error("name", "required");
      return;
    }
    bool chars_ok = std::all_of(name.begin(), name.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
    });
    if (!chars_ok || name.front() == '-' || name.back() == '-') {
      Error("name", absl::StrCat("must be lower-case letters, digits and '-', starting and ending "
                                 "with a letter or digit, got ",
                                 Quote(name)));
    } else if (name.size() > 63) {
      Error("name", absl::StrCat("at most 63 characters, got ", name.size()));
    }
  }

  void CheckModel(const v1::JobSpec& raw) {
    const v1::ModelSpec& m = raw.model();
    switch (m.kind_case()) {
      case v1::ModelSpec::KIND_NOT_SET:
        Error("model", "required (name: mlp, cnn or torchscript), or a command: block");
        break;
      case v1::ModelSpec::kMlp:
        Range("model.input_dim", m.mlp().input_dim(), 1, 1 << 24, false);
        Range("model.classes", m.mlp().classes(), 1, 1 << 24, false);
        for (int i = 0; i < m.mlp().hidden_size(); ++i) {
          Range(absl::StrCat("model.hidden[", i, "]"), m.mlp().hidden(i), 1, 1 << 20, false);
        }
        break;
      case v1::ModelSpec::kCnn: {
        const v1::CnnModel& c = m.cnn();
        Range("model.classes", c.classes(), 1, 1 << 24, false);
        Range("model.conv1_channels", c.conv1_channels(), 1, 4096, true);
        Range("model.conv2_channels", c.conv2_channels(), 1, 4096, true);
        Range("model.hidden", c.hidden(), 1, 1 << 20, true);
        Range("model.image_size", c.image_size(), 8, 4096, true);
        if (c.image_size() != 0 && c.image_size() % 4 != 0) {
          Error("model.image_size",
                absl::StrCat("must be a multiple of 4 (two 2x2 poolings), got ", c.image_size()));
        }
        break;
      }
      case v1::ModelSpec::kTorchscript:
        Required("model.path", m.torchscript().path());
        break;
    }
  }

  void CheckDataset(const std::string& path, const v1::DatasetSpec& d) {
    switch (d.format_case()) {
      case v1::DatasetSpec::FORMAT_NOT_SET:
        Error(path, "required (format: synthetic, idx, csv or tensors)");
        break;
      case v1::DatasetSpec::kSynthetic: {
        const v1::SyntheticData& s = d.synthetic();
        if (s.length() <= 0 || s.length() > (int64_t{1} << 40)) {
          Error(path + ".length", absl::StrCat("must be in [1, 2^40], got ", s.length()));
        }
        Range(path + ".size", s.size(), 1, 1 << 24, false);
        Range(path + ".classes", s.classes(), 0, 1 << 24, false);
        Range(path + ".target_dim", s.target_dim(), 1, 1 << 24, true);
        if (s.classes() > 0 && s.target_dim() != 0) {
          Error(path + ".target_dim", "only for regression targets (classes: 0)");
        }
        break;
      }
      case v1::DatasetSpec::kIdx:
        Required(path + ".images", d.idx().images());
        Required(path + ".labels", d.idx().labels());
        break;
      case v1::DatasetSpec::kCsv:
        Required(path + ".path", d.csv().path());
        break;
      case v1::DatasetSpec::kTensors:
        Required(path + ".path", d.tensors().path());
        break;
    }
  }

  void CheckData(const v1::JobSpec& raw, const v1::JobSpec& s) {
    const v1::DataSpec& d = raw.data();
    CheckDataset("data.train", d.train());
    if (d.has_eval()) CheckDataset("data.eval", d.eval());
    Range("data.batch_size", d.batch_size(), 1, 1 << 20, true);
    Range("data.num_workers", d.num_workers(), 0, 64, false);

    // The classic example's shapes must fit the model.
    const v1::ModelSpec& m = s.model();
    for (const char* which : {"train", "eval"}) {
      const v1::DatasetSpec& ds = std::string(which) == "train" ? d.train() : d.eval();
      if (!ds.has_synthetic()) continue;
      std::string path = absl::StrCat("data.", which);
      if (m.has_mlp() && ds.synthetic().size() > 0 && m.mlp().input_dim() > 0 &&
          ds.synthetic().size() != m.mlp().input_dim()) {
        Error(path + ".size", absl::StrCat("must equal model.input_dim (", m.mlp().input_dim(),
                                           "), got ", ds.synthetic().size()));
      }
      int32_t model_out = m.has_mlp() ? m.mlp().classes() : m.has_cnn() ? m.cnn().classes() : 0;
      if (s.training().loss() == v1::LOSS_CROSS_ENTROPY && ds.synthetic().classes() == 0 &&
          ds.synthetic().size() > 0) {
        Error(path + ".classes", "cross_entropy needs class targets: set classes > 0 or loss: mse");
      } else if (model_out > 0 && ds.synthetic().classes() > model_out) {
        Error(path + ".classes", absl::StrCat("must be <= model.classes (", model_out, "), got ",
                                              ds.synthetic().classes()));
      }
    }
  }

  void CheckTraining(const v1::JobSpec& raw, const v1::JobSpec& s) {
    const v1::TrainingSpec& t = raw.training();
    Range("training.epochs", t.epochs(), 1, 1000000, true);
    Range("training.grad_accumulation", t.grad_accumulation(), 1, 1 << 20, true);
    NonNegativeNumber("training.max_grad_norm", t.max_grad_norm());

    const v1::OptimizerSpec& o = t.optimizer();
    PositiveNumber("training.optimizer.lr", o.lr(), true);
    NonNegativeNumber("training.optimizer.weight_decay", o.weight_decay());
    UnitInterval("training.optimizer.momentum", o.momentum());
    if (o.momentum() != 0 && s.training().optimizer().name() != v1::OPTIMIZER_SGD) {
      Error("training.optimizer.momentum", "only for name: sgd (Adam uses beta1)");
    }
    if (o.has_beta1()) UnitInterval("training.optimizer.beta1", o.beta1());
    if (o.has_beta2()) UnitInterval("training.optimizer.beta2", o.beta2());
    if (o.has_eps()) PositiveNumber("training.optimizer.eps", o.eps(), false);

    const v1::LrScheduleSpec& l = t.lr_schedule();
    Range("training.lr_schedule.warmup_steps", l.warmup_steps(), 0, 1 << 30, false);
    Range("training.lr_schedule.step_size", l.step_size(), 1, 1 << 30, true);
    if (s.training().lr_schedule().name() == v1::LR_SCHEDULE_STEP && l.step_size() == 0) {
      Error("training.lr_schedule.step_size", "required for name: step");
    }
    if (l.has_gamma() && (!std::isfinite(l.gamma()) || l.gamma() <= 0 || l.gamma() > 1)) {
      Error("training.lr_schedule.gamma",
            absl::StrCat("must be in (0, 1], got ", FormatNumber(l.gamma())));
    }
    NonNegativeNumber("training.lr_schedule.min_lr", l.min_lr());
    if (s.training().optimizer().lr() > 0 && l.min_lr() > s.training().optimizer().lr()) {
      Error("training.lr_schedule.min_lr",
            absl::StrCat("must be <= training.optimizer.lr (",
                         FormatNumber(s.training().optimizer().lr()), "), got ",
                         FormatNumber(l.min_lr())));
    }

    if (s.training().loss() == v1::LOSS_MSE && s.data().train().has_idx()) {
      Error("training.loss", "mse needs float targets; idx data has class labels (use cross_entropy)");
    }
  }

  void CheckDevice(const v1::JobSpec& s) {
    if (s.backend() == v1::BACKEND_NCCL && s.device() == v1::DEVICE_CPU) {
      Error("backend", "nccl needs device: cuda (use gloo or auto on cpu)");
    }
    if (s.backend() == v1::BACKEND_GLOO && s.device() == v1::DEVICE_CUDA) {
      Error("backend", "gloo runs on CPU tensors; use nccl (or auto) with device: cuda");
    }
    if (s.training().amp().enabled() && s.training().amp().dtype() == v1::AMP_DTYPE_FP16 &&
        s.device() == v1::DEVICE_CPU) {
      Error("training.amp.dtype", "fp16 autocast needs device: cuda; use bf16 on cpu");
    }
  }

  void CheckElastic(const v1::JobSpec& raw, const v1::JobSpec& s) {
    if (!raw.has_elastic()) return;
    const v1::ElasticSpec& e = raw.elastic();
    if (e.min_ranks() < 0 || e.min_ranks() > s.world_size()) {
      Error("elastic.min_ranks", absl::StrCat("must be in [1, world_size = ", s.world_size(), "], got ",
                                              e.min_ranks()));
    }
    Range("elastic.replace_timeout_s", e.replace_timeout_s(), 0, 7 * 24 * 3600, false);
  }

  void CheckDdp(const v1::JobSpec& raw) {
    const v1::DdpSpec& d = raw.ddp();
    if (!(d.bucket_cap_mb() == 0 && !Written("ddp.bucket_cap_mb")) &&
        (!std::isfinite(d.bucket_cap_mb()) || d.bucket_cap_mb() <= 0 || d.bucket_cap_mb() > 4096)) {
      Error("ddp.bucket_cap_mb",
            absl::StrCat("must be in (0, 4096], got ", FormatNumber(d.bucket_cap_mb())));
    }
  }

  std::string file_;
  const absl::flat_hash_map<std::string, Position>* positions_;
  const absl::flat_hash_set<std::string>* error_paths_;
  std::vector<SpecError> errors_;
};

// Applies "a.b.c=value" on top of the document; returns the paths set.
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

bool LessByPosition(const SpecError& a, const SpecError& b) {
  auto key = [](const SpecError& e) {
    // File errors in document order, then --set errors, then unpositioned.
    int group = e.line > 0 ? 0 : e.file == "--set" ? 1 : 2;
    return std::make_tuple(group, e.line, e.column);
  };
  return key(a) < key(b);
}

void EmitMessage(YAML::Emitter& out, const Message& msg);

void EmitField(YAML::Emitter& out, const Message& msg, const FieldDescriptor* f) {
  const Reflection* r = msg.GetReflection();
  out << YAML::Key << f->name() << YAML::Value;
  if (f->is_map()) {
    // Sorted by name: the same spec always renders the same text.
    std::map<std::string, std::string> entries;
    for (int i = 0; i < r->FieldSize(msg, f); ++i) {
      const Message& e = r->GetRepeatedMessage(msg, f, i);
      const Descriptor* ed = e.GetDescriptor();
      entries[e.GetReflection()->GetString(e, ed->map_key())] = e.GetReflection()->GetString(e, ed->map_value());
    }
    out << YAML::BeginMap;
    for (const auto& [k, v] : entries) out << YAML::Key << k << YAML::Value << YAML::DoubleQuoted << v;
    out << YAML::EndMap;
    return;
  }
  if (f->is_repeated()) {
    out << YAML::Flow << YAML::BeginSeq;
    for (int i = 0; i < r->FieldSize(msg, f); ++i) {
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
        out << YAML::DoubleQuoted << r->GetRepeatedString(msg, f, i);
      } else {
        out << r->GetRepeatedInt32(msg, f, i);
      }
    }
    out << YAML::EndSeq;
    return;
  }
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      out << r->GetInt32(msg, f);
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      out << r->GetInt64(msg, f);
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      out << r->GetUInt64(msg, f);
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      // Shortest text that reads back as the same double.
      char buf[64];
      auto res = std::to_chars(buf, buf + sizeof buf, r->GetDouble(msg, f));
      out << std::string(buf, res.ptr);
      break;
    }
    case FieldDescriptor::CPPTYPE_BOOL:
      out << (r->GetBool(msg, f) ? "true" : "false");
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      out << EnumValueName(r->GetEnum(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      if (r->GetString(msg, f).empty()) {
        out << YAML::DoubleQuoted << "";
      } else {
        out << r->GetString(msg, f);
      }
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      EmitMessage(out, r->GetMessage(msg, f));
      break;
    default:
      out << YAML::Null;
  }
}

void EmitMessage(YAML::Emitter& out, const Message& msg) {
  const Descriptor* d = msg.GetDescriptor();
  const Reflection* r = msg.GetReflection();
  out << YAML::BeginMap;
  if (const char* disc = DiscriminatorKey(d)) {
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (!r->HasField(msg, f)) continue;
      out << YAML::Key << disc << YAML::Value << f->name();
      const Message& member = r->GetMessage(msg, f);
      const Reflection* mr = member.GetReflection();
      for (int j = 0; j < member.GetDescriptor()->field_count(); ++j) {
        const FieldDescriptor* mf = member.GetDescriptor()->field(j);
        if (!mf->is_repeated() && !mr->HasField(member, mf)) continue;
        EmitField(out, member, mf);
      }
    }
  } else {
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (f->is_map() && r->FieldSize(msg, f) == 0) continue;
      if (!f->is_repeated() && f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !r->HasField(msg, f)) continue;
      // Unset optionals and zero scalars (which mean "default") stay out.
      if (!f->is_repeated() && !r->HasField(msg, f)) continue;
      EmitField(out, msg, f);
    }
  }
  out << YAML::EndMap;
}

void FlattenMessage(const Message& msg, const std::string& prefix,
                    std::map<std::string, std::string>* out) {
  const Descriptor* d = msg.GetDescriptor();
  const Reflection* r = msg.GetReflection();
  auto key = [&](const std::string& name) { return prefix.empty() ? name : prefix + "." + name; };
  if (const char* disc = DiscriminatorKey(d)) {
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (!r->HasField(msg, f)) continue;
      (*out)[key(disc)] = f->name();
      FlattenMessage(r->GetMessage(msg, f), prefix, out);
    }
    return;
  }
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    std::string k = key(f->name());
    if (f->is_map()) continue;  // command.env: not part of a rank config
    if (f->is_repeated()) {
      std::vector<std::string> items;
      for (int j = 0; j < r->FieldSize(msg, f); ++j) {
        items.push_back(f->cpp_type() == FieldDescriptor::CPPTYPE_STRING ? r->GetRepeatedString(msg, f, j)
                                                                         : absl::StrCat(r->GetRepeatedInt32(msg, f, j)));
      }
      (*out)[k] = absl::StrJoin(items, ",");
      continue;
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (r->HasField(msg, f)) FlattenMessage(r->GetMessage(msg, f), k, out);
        break;
      case FieldDescriptor::CPPTYPE_INT32: (*out)[k] = absl::StrCat(r->GetInt32(msg, f)); break;
      case FieldDescriptor::CPPTYPE_INT64: (*out)[k] = absl::StrCat(r->GetInt64(msg, f)); break;
      case FieldDescriptor::CPPTYPE_UINT64: (*out)[k] = absl::StrCat(r->GetUInt64(msg, f)); break;
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        char buf[64];
        auto res = std::to_chars(buf, buf + sizeof buf, r->GetDouble(msg, f));
        (*out)[k] = std::string(buf, res.ptr);
        break;
      }
      case FieldDescriptor::CPPTYPE_BOOL: (*out)[k] = r->GetBool(msg, f) ? "true" : "false"; break;
      case FieldDescriptor::CPPTYPE_ENUM: (*out)[k] = EnumValueName(r->GetEnum(msg, f)); break;
      case FieldDescriptor::CPPTYPE_STRING: (*out)[k] = r->GetString(msg, f); break;
      default: break;
    }
  }
}

}  // namespace

std::map<std::string, std::string> JobSpecToFlat(const v1::JobSpec& spec) {
  v1::JobSpec resolved = spec;
  ResolveJobSpecDefaults(&resolved);  // idempotent; a spec stored before a default was added gets it here
  std::map<std::string, std::string> out;
  FlattenMessage(resolved, "", &out);
  return out;
}

std::string SpecError::ToString() const {
  std::string out;
  if (!file.empty()) {
    absl::StrAppend(&out, file, ":");
    if (line > 0) absl::StrAppend(&out, line, ":", column, ":");
    absl::StrAppend(&out, " ");
  }
  if (!field.empty()) absl::StrAppend(&out, field, ": ");
  absl::StrAppend(&out, message);
  return out;
}

std::string EnumValueName(const EnumValueDescriptor* value) {
  return absl::AsciiStrToLower(value->name().substr(EnumPrefix(value->type()).size()));
}

namespace {

// yaml-cpp 0.7 loops forever, growing its memory, on a ',' (a flow entry)
// that starts a line outside any [] or {}: ",a", "--- !t ,a", or a document
// whose last map line is followed by ", x: 1}" at a lower indentation; found
// by fuzz/fuzz_job_yaml. A plain scalar cannot start with ',', so such a line
// is never part of a job (at most the continuation of a multi-line plain
// scalar, which a job.yaml has no use for): it is refused before yaml-cpp
// reads the text. Returns the 1-based line, or 0. Tracks what changes the
// meaning of a line start: flow depth, quotes spanning lines, comments and
// block scalars (| and >), whose content lines are skipped.
int LineStartingWithStrayComma(std::string_view y) {
  int depth = 0;
  char quote = 0;         // ' or " while inside a quoted scalar
  int block_indent = -1;  // >= 0: inside a block scalar opened on a line with this indent
  int line_no = 0;
  size_t pos = 0;
  while (pos <= y.size()) {
    size_t end = y.find('\n', pos);
    if (end == std::string_view::npos) end = y.size();
    std::string_view line = y.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    size_t i = line.find_first_not_of(" \t\r");
    if (block_indent >= 0) {
      if (i == std::string_view::npos || static_cast<int>(i) > block_indent) continue;
      block_indent = -1;
    }
    if (i == std::string_view::npos) continue;
    const int indent = static_cast<int>(i);
    if (quote == 0 && depth == 0) {
      size_t k = i;
      if (k == 0 && (line.compare(0, 3, "---") == 0 || line.compare(0, 3, "...") == 0)) k = 3;
      while (k < line.size()) {  // blanks and node properties (!tag, &anchor)
        if (line[k] == ' ' || line[k] == '\t') {
          ++k;
        } else if (line[k] == '!' || line[k] == '&') {
          // A property ends at a blank or a flow indicator ("&a,x" is "&a" ",x").
          ++k;
          while (k < line.size() && line[k] != ' ' && line[k] != '\t' && line[k] != ',' &&
                 line[k] != '[' && line[k] != ']' && line[k] != '{' && line[k] != '}') {
            ++k;
          }
        } else {
          break;
        }
      }
      if (k < line.size() && line[k] == ',') return line_no;
    }
    // A node (flow collection or quoted scalar) starts only at the line's
    // first character, after "[", "{" or ",", or after ": " / "- "; a '{'
    // inside a plain scalar ("a{b") is text.
    char prev = 0;            // last non-blank character on this line
    bool blank = false;       // blanks since `prev`
    bool node_ended = false;  // a quoted scalar or [] / {} just closed at depth 0
    for (size_t k = i; k < line.size(); ++k) {
      const char c = line[k];
      if (quote == '"') {
        if (c == '\\') ++k;
        else if (c == '"') quote = 0, node_ended = depth == 0;
        prev = c;
        blank = false;
        continue;
      }
      if (quote == '\'') {
        if (c == '\'' && k + 1 < line.size() && line[k + 1] == '\'') ++k;
        else if (c == '\'') quote = 0, node_ended = depth == 0;
        prev = c;
        blank = false;
        continue;
      }
      if (c == ' ' || c == '\t' || c == '\r') {
        blank = true;
        continue;
      }
      // A ',' right after a quoted scalar or a flow collection outside any
      // [] or {} ("'a',b", "[a],b"): yaml-cpp loops on it as well.
      if (node_ended && c == ',') return line_no;
      node_ended = false;
      if (c == '#' && (k == 0 || blank)) break;
      const bool node_start = k == i || prev == '[' || prev == '{' || prev == ',' ||
                              ((prev == ':' || prev == '-' || prev == '?') && blank);
      if (node_start && (c == '"' || c == '\'')) {
        quote = c;
      } else if (node_start && (c == '[' || c == '{')) {
        ++depth;
      } else if ((c == ']' || c == '}') && depth > 0) {
        --depth;
        node_ended = depth == 0;
      }
      prev = c;
      blank = false;
    }
    // "key: |", "- >-", "|2": the next more-indented lines are scalar text.
    if (quote == 0 && depth == 0) {
      std::string_view t = line.substr(0, line.find(" #") == std::string_view::npos ? line.size() : line.find(" #"));
      while (!t.empty() && (t.back() == ' ' || t.back() == '\t' || t.back() == '\r')) t.remove_suffix(1);
      size_t j = t.size();
      while (j > 0 && (t[j - 1] == '-' || t[j - 1] == '+' || (t[j - 1] >= '0' && t[j - 1] <= '9'))) --j;
      if (j > 0 && (t[j - 1] == '|' || t[j - 1] == '>') &&
          (j == 1 || t[j - 2] == ' ' || t[j - 2] == ':' || t[j - 2] == '-')) {
        block_indent = indent;
      }
    }
  }
  return 0;
}

}  // namespace

ParsedJobSpec ParseJobSpecYaml(std::string_view yaml, std::string_view file,
                               const std::vector<std::string>& overrides) {
  ParsedJobSpec result;
  std::string name(file);
  auto doc_error = [&](int line, int column, std::string msg) {
    result.errors.push_back(SpecError{name, line, column, "", std::move(msg)});
    return result;
  };
  if (yaml.size() > kMaxJobYamlBytes) {
    return doc_error(1, 1, absl::StrCat("the file is ", yaml.size(), " bytes; at most ",
                                        kMaxJobYamlBytes, " are read"));
  }
  if (yaml.find('\0') != std::string_view::npos) {
    return doc_error(1, 1, "not a text file (it contains NUL bytes)");
  }
  if (int line = LineStartingWithStrayComma(yaml); line > 0) {
    return doc_error(line, 1, "not valid YAML: ',' outside [] or {} at the start of a line or after a quoted or [] / {} value");
  }
  YAML::Node root;
  try {
    std::vector<YAML::Node> docs = YAML::LoadAll(std::string(yaml));
    if (docs.size() > 1) return doc_error(1, 1, "holds several YAML documents; a job.yaml holds one");
    if (!docs.empty()) root = docs[0];
  } catch (const YAML::Exception& e) {
    int line = e.mark.is_null() ? 1 : e.mark.line + 1;
    int column = e.mark.is_null() ? 1 : e.mark.column + 1;
    return doc_error(line, column, absl::StrCat("not valid YAML: ", e.msg));
  } catch (const std::exception& e) {
    return doc_error(1, 1, absl::StrCat("not valid YAML: ", e.what()));
  }
  if (!root.IsDefined() || root.IsNull()) {
    if (overrides.empty()) {
      return doc_error(1, 1, "the file is empty; a job needs at least name, model and data.train");
    }
    root = YAML::Node(YAML::NodeType::Map);
  }
  if (!root.IsMap()) {
    YAML::Mark m = root.Mark();
    return doc_error(m.is_null() ? 1 : m.line + 1, m.is_null() ? 1 : m.column + 1,
                     absl::StrCat("must be a mapping of job fields, got ", NodeKind(root)));
  }

  std::vector<SpecError> override_errors;
  absl::flat_hash_set<std::string> override_paths = ApplyOverrides(root, overrides, &override_errors);

  YamlReader reader(name, std::move(override_paths));
  try {
    reader.ReadRoot(root, &result.spec);
  } catch (const YAML::Exception& e) {
    reader.Error(e.mark, "", absl::StrCat("not valid YAML: ", e.msg));
  }
  std::vector<SpecError> errors = std::move(override_errors);
  for (SpecError& e : reader.errors()) errors.push_back(std::move(e));
  Validator validator(name, &reader.positions(), &reader.error_paths());
  for (SpecError& e : validator.Run(result.spec)) errors.push_back(std::move(e));

  std::stable_sort(errors.begin(), errors.end(), LessByPosition);
  if (errors.size() > kMaxReportedErrors) {
    size_t more = errors.size() - kMaxReportedErrors;
    errors.resize(kMaxReportedErrors);
    errors.push_back(SpecError{name, 0, 0, "", absl::StrCat("... and ", more, " more errors")});
  }
  result.errors = std::move(errors);
  if (result.ok()) ResolveJobSpecDefaults(&result.spec);
  return result;
}

ParsedJobSpec ParseJobSpecFile(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ParsedJobSpec r;
    r.errors.push_back(SpecError{path, 0, 0, "", "cannot read the file (no such file or no permission)"});
    return r;
  }
  std::string text;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxJobYamlBytes) break;  // Reported by the parser.
  }
  return ParseJobSpecYaml(text, path, overrides);
}

std::vector<SpecError> ValidateJobSpec(const v1::JobSpec& spec) {
  return Validator("", nullptr, nullptr).Run(spec);
}

void ResolveJobSpecDefaults(v1::JobSpec* s) {
  if (s->world_size() == 0) s->set_world_size(1);
  if (s->has_elastic()) {
    v1::ElasticSpec* e = s->mutable_elastic();
    if (!e->has_replace_timeout_s()) e->set_replace_timeout_s(60);
    if (e->grow() == v1::ELASTIC_GROW_UNSPECIFIED) e->set_grow(v1::ELASTIC_GROW_AT_CHECKPOINT);
  }
  if (s->device() == v1::DEVICE_UNSPECIFIED) s->set_device(v1::DEVICE_AUTO);
  if (s->backend() == v1::BACKEND_UNSPECIFIED) s->set_backend(v1::BACKEND_AUTO);
  v1::RestartSpec* restart = s->mutable_restart();
  if (!restart->has_max_restarts()) restart->set_max_restarts(3);
  if (restart->on_hang() == v1::HANG_POLICY_UNSPECIFIED) restart->set_on_hang(v1::HANG_POLICY_RESTART);
  v1::StragglerSpec* st = s->mutable_stragglers();
  if (st->policy() == v1::STRAGGLER_POLICY_UNSPECIFIED) st->set_policy(v1::STRAGGLER_POLICY_WARN);
  if (st->threshold() == 0) st->set_threshold(0.3);
  if (s->has_command()) {
    // The user's program: no engine settings to fill in.
    v1::CommandSpec* c = s->mutable_command();
    if (c->local_rank() == v1::LOCAL_RANK_MODE_UNSPECIFIED) c->set_local_rank(v1::LOCAL_RANK_MODE_ENV);
    if (c->arg_style() == v1::LOCAL_RANK_ARG_STYLE_UNSPECIFIED) {
      c->set_arg_style(v1::LOCAL_RANK_ARG_STYLE_UNDERSCORE);
    }
    v1::CheckpointSpec* cp = s->mutable_checkpoint();
    if (!cp->has_every_epochs()) cp->set_every_epochs(1);
    if (cp->keep() == 0) cp->set_keep(2);
    return;
  }

  if (s->model().has_cnn()) {
    v1::CnnModel* c = s->mutable_model()->mutable_cnn();
    if (c->conv1_channels() == 0) c->set_conv1_channels(32);
    if (c->conv2_channels() == 0) c->set_conv2_channels(64);
    if (c->hidden() == 0) c->set_hidden(128);
    if (c->image_size() == 0) c->set_image_size(28);
  }

  v1::DataSpec* d = s->mutable_data();
  for (v1::DatasetSpec* ds : {d->mutable_train(), d->has_eval() ? d->mutable_eval() : nullptr}) {
    if (ds == nullptr) continue;
    if (ds->has_synthetic() && ds->synthetic().classes() == 0 && ds->synthetic().target_dim() == 0) {
      ds->mutable_synthetic()->set_target_dim(1);
    }
    if (ds->has_csv() && !ds->csv().has_header()) ds->mutable_csv()->set_header(true);
    if (ds->has_tensors()) {
      if (ds->tensors().inputs_key().empty()) ds->mutable_tensors()->set_inputs_key("inputs");
      if (ds->tensors().targets_key().empty()) ds->mutable_tensors()->set_targets_key("targets");
    }
  }
  if (d->batch_size() == 0) d->set_batch_size(32);
  if (!d->has_shuffle()) d->set_shuffle(true);
  if (!d->has_num_workers()) d->set_num_workers(0);
  if (!d->has_pin_memory()) d->set_pin_memory(true);

  v1::TrainingSpec* t = s->mutable_training();
  if (t->epochs() == 0) t->set_epochs(1);
  if (t->loss() == v1::LOSS_UNSPECIFIED) t->set_loss(v1::LOSS_CROSS_ENTROPY);
  v1::OptimizerSpec* o = t->mutable_optimizer();
  if (o->name() == v1::OPTIMIZER_UNSPECIFIED) o->set_name(v1::OPTIMIZER_ADAM);
  if (o->lr() == 0) o->set_lr(0.001);
  if (!o->has_beta1()) o->set_beta1(0.9);
  if (!o->has_beta2()) o->set_beta2(0.999);
  if (!o->has_eps()) o->set_eps(1e-8);
  v1::LrScheduleSpec* l = t->mutable_lr_schedule();
  if (l->name() == v1::LR_SCHEDULE_UNSPECIFIED) l->set_name(v1::LR_SCHEDULE_CONSTANT);
  if (!l->has_gamma()) l->set_gamma(0.1);
  if (t->grad_accumulation() == 0) t->set_grad_accumulation(1);
  if (t->amp().dtype() == v1::AMP_DTYPE_UNSPECIFIED) t->mutable_amp()->set_dtype(v1::AMP_DTYPE_BF16);

  v1::DdpSpec* p = s->mutable_ddp();
  if (p->bucket_cap_mb() == 0) p->set_bucket_cap_mb(25);
  if (!p->has_broadcast_buffers()) p->set_broadcast_buffers(true);

  v1::CheckpointSpec* c = s->mutable_checkpoint();
  if (!c->has_every_epochs()) c->set_every_epochs(1);
  if (c->keep() == 0) c->set_keep(2);
  if (s->metrics().every_steps() == 0) s->mutable_metrics()->set_every_steps(20);

  // Numerical health: the rank reads min_loss_scale and max_skipped_steps,
  // the coordinator on_nan and max_rollbacks.
  v1::HealthSpec* h = s->mutable_health();
  if (h->on_nan() == v1::HealthSpec::ON_NAN_UNSPECIFIED) h->set_on_nan(v1::HealthSpec::ON_NAN_ROLLBACK);
  if (!h->has_max_rollbacks()) h->set_max_rollbacks(3);
  if (!h->has_min_loss_scale()) h->set_min_loss_scale(1e-4);
  if (!h->has_max_skipped_steps()) h->set_max_skipped_steps(50);
}

absl::Status SpecErrorsToStatus(const std::vector<SpecError>& errors) {
  if (errors.empty()) return absl::OkStatus();
  std::vector<std::string> lines;
  for (const SpecError& e : errors) lines.push_back(e.ToString());
  return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
}

namespace {
// Protobuf bytes with map entries in key order: equal messages give equal bytes.
std::string DeterministicBytes(const google::protobuf::Message& m) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.SetSerializationDeterministic(true);
    m.SerializeToCodedStream(&out);
  }  // the streams give back their unused buffer here
  return bytes;
}
}  // namespace

std::string CheckpointSpecHash(const v1::JobSpec& spec) {
  v1::JobSpec shape;
  *shape.mutable_model() = spec.model();
  shape.mutable_training()->mutable_optimizer()->set_name(spec.training().optimizer().name());
  const std::string bytes = DeterministicBytes(shape);
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[32];
  snprintf(buf, sizeof buf, "fnv64:%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::vector<SpecError> CheckResumeCompatible(const v1::JobSpec& from, const std::string& from_id,
                                             const v1::JobSpec& to) {
  std::vector<SpecError> errors;
  auto add = [&](const std::string& field, const std::string& message) {
    SpecError e;
    e.field = field;
    e.message = message;
    errors.push_back(std::move(e));
  };
  if (DeterministicBytes(from.model()) != DeterministicBytes(to.model())) {
    add("model", absl::StrCat("differs from job ", from_id,
                              "'s model; a checkpoint only loads into the model that wrote it"));
  }
  if (from.training().optimizer().name() != to.training().optimizer().name()) {
    const auto* d = v1::Optimizer_descriptor();
    add("training.optimizer.name",
        absl::StrCat(EnumValueName(d->FindValueByNumber(to.training().optimizer().name())), ", but job ",
                     from_id, " trained with ",
                     EnumValueName(d->FindValueByNumber(from.training().optimizer().name())),
                     "; its optimizer state cannot be loaded"));
  }
  return errors;
}

std::string JobSpecToYaml(const v1::JobSpec& spec) {
  YAML::Emitter out;
  EmitMessage(out, spec);
  return std::string(out.c_str()) + "\n";
}

}  // namespace trainctl
