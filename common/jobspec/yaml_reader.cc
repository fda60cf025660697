#include "common/jobspec/yaml_reader.h"

#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainctl::jobspec {
namespace {

// The reader's state for one document (see yaml_reader.h).
class YamlReader {
 public:
  YamlReader(std::string file, absl::flat_hash_set<std::string> override_paths)
      : file_(std::move(file)), override_paths_(std::move(override_paths)) {}

  void ReadRoot(const YAML::Node& root, v1::JobSpec* spec) { ReadMessage(root, "", spec); }

  YamlReadResult Take() && {
    return {std::move(errors_), std::move(positions_), std::move(error_paths_)};
  }

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
    for (int i = 0; i < target_desc->field_count(); ++i)
      known.push_back(target_desc->field(i)->name());

    absl::flat_hash_map<std::string, YAML::Mark> seen;
    ForEachNamedEntry(node, path, [&](const YAML::Node& key, const YAML::Node& value) {
      const std::string& k = key.Scalar();
      std::string child = Join(path, k);
      auto [prev, inserted] = seen.emplace(k, key.Mark());
      if (!inserted) {
        Error(key.Mark(), child,
              absl::StrCat("duplicate key (first at line ", prev->second.line + 1, ")"));
        return;
      }
      if (disc != nullptr && k == disc) return;
      const FieldDescriptor* field = target_desc->FindFieldByName(k);
      if (field == nullptr) {
        std::string what = path.empty() ? "" : absl::StrCat(" in ", path);
        std::string hint = DidYouMean(k, known);
        if (hint.empty()) hint = NestedHint(target_desc, k);
        Error(key.Mark(), child, absl::StrCat("unknown key", what, hint));
        return;
      }
      ReadField(value, child, target, field);
    });
  }

  // Calls visit(key, value) for each entry of a mapping whose key is a plain
  // name; any other key is an error.
  template <typename Visit>
  void ForEachNamedEntry(const YAML::Node& map, const std::string& path, Visit visit) {
    for (auto it = map.begin(); it != map.end(); ++it) {
      // Copies: the iterator yields temporaries (yaml-cpp node handles are cheap).
      const YAML::Node key = it->first;
      const YAML::Node value = it->second;
      if (!key.IsScalar()) {
        Error(key.Mark(), path, absl::StrCat("keys must be plain names, got ", NodeKind(key)));
        continue;
      }
      visit(key, value);
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
      Error(
          value.Mark(), disc_path,
          absl::StrCat("must be one of ", absl::StrJoin(choices, ", "), ", got ", NodeKind(value)));
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
      if (!OpenCollection(value, path, YAML::NodeType::Sequence, "a list")) return;
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

  // A list or mapping (`type`, named `shape` in the error) of at most
  // kMaxSequenceLength entries; records where it was written. False when
  // there is nothing to read: null (no entries) or an error.
  bool OpenCollection(const YAML::Node& value, const std::string& path, YAML::NodeType::value type,
                      const char* shape) {
    if (value.IsNull()) {
      positions_[path] = PositionOf(value.Mark(), path);
      return false;
    }
    if (value.Type() != type) {
      Error(value.Mark(), path, absl::StrCat("must be ", shape, ", got ", NodeKind(value)));
      return false;
    }
    if (value.size() > kMaxSequenceLength) {
      Error(value.Mark(), path,
            absl::StrCat("at most ", kMaxSequenceLength, " entries, got ", value.size()));
      return false;
    }
    positions_[path] = PositionOf(value.Mark(), path);
    return true;
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
    if (!OpenCollection(value, path, YAML::NodeType::Map, "a mapping of NAME: value")) return;
    absl::flat_hash_set<std::string> seen;
    ForEachNamedEntry(value, path, [&](const YAML::Node& k, const YAML::Node& v) {
      std::string child = absl::StrCat(path, ".", k.Scalar());
      if (!seen.insert(k.Scalar()).second) {
        Error(k.Mark(), child, "duplicate key");
        return;
      }
      if (!v.IsScalar()) {
        Error(v.Mark(), child, absl::StrCat("must be a string, got ", NodeKind(v)));
        return;
      }
      if (v.Scalar().size() > kMaxStringBytes || k.Scalar().size() > kMaxStringBytes) {
        Error(v.Mark(), child, absl::StrCat("at most ", kMaxStringBytes, " bytes"));
        return;
      }
      Message* e = msg->GetReflection()->AddMessage(msg, field);
      e->GetReflection()->SetString(e, entry->map_key(), k.Scalar());
      e->GetReflection()->SetString(e, entry->map_value(), v.Scalar());
      positions_[child] = PositionOf(k.Mark(), child);
    });
  }

  // What a scalar for `field` must be, for error messages.
  static const char* Expected(const FieldDescriptor* field) {
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64:
      case FieldDescriptor::CPPTYPE_UINT64:
        return "an integer";
      case FieldDescriptor::CPPTYPE_DOUBLE:
        return "a number";
      case FieldDescriptor::CPPTYPE_BOOL:
        return "true or false";
      case FieldDescriptor::CPPTYPE_ENUM:
        return "one of";
      default:
        return "a string";
    }
  }

  // Converts one scalar into `field` (appending when repeated). False on error.
  bool ReadScalar(const YAML::Node& value, const std::string& path, Message* msg,
                  const FieldDescriptor* field) {
    if (value.IsNull()) {
      Error(value.Mark(), path, "missing value");
      return false;
    }
    if (!value.IsScalar()) {
      std::string what =
          field->cpp_type() == FieldDescriptor::CPPTYPE_ENUM
              ? absl::StrCat("one of ", absl::StrJoin(EnumChoices(field->enum_type()), ", "))
              : std::string(Expected(field));
      Error(value.Mark(), path, absl::StrCat("must be ", what, ", got ", NodeKind(value)));
      return false;
    }
    Scalar s{value, path, value.Scalar(), value.Tag() == "!"};
    Target t{msg, field, msg->GetReflection(), field->is_repeated()};
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64:
      case FieldDescriptor::CPPTYPE_UINT64:
        return StoreInteger(s, t);
      case FieldDescriptor::CPPTYPE_ENUM:
        return StoreEnum(s, t);
      case FieldDescriptor::CPPTYPE_STRING:
        if (s.text.size() > kMaxStringBytes) {
          Error(value.Mark(), path,
                absl::StrCat("at most ", kMaxStringBytes, " bytes, got ", s.text.size()));
          return false;
        }
        t.rep ? t.r->AddString(msg, field, s.text) : t.r->SetString(msg, field, s.text);
        return true;
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_BOOL:
        return StoreNumberOrBool(s, t);
      default:
        Error(value.Mark(), path, "not supported in job.yaml");
        return false;
    }
  }

  // One scalar being read: its node, path and text; `quoted` ("5" rather
  // than 5) makes it a string whatever it looks like.
  struct Scalar {
    const YAML::Node& node;
    const std::string& path;
    const std::string& text;
    bool quoted;
  };

  // Where a converted scalar goes: set, or appended to a repeated field.
  struct Target {
    Message* msg;
    const FieldDescriptor* field;
    const Reflection* r;
    bool rep;
  };

  bool TypeError(const Scalar& s, const FieldDescriptor* field, const std::string& extra = "") {
    Error(s.node.Mark(), s.path,
          absl::StrCat("must be ", Expected(field), ", got ", s.quoted ? "the string " : "",
                       Quote(s.text), extra));
    return false;
  }

  bool StoreInteger(const Scalar& s, const Target& t) {
    auto [msg, field, r, rep] = t;
    if (IsByteQuantityField(field) && field->cpp_type() == FieldDescriptor::CPPTYPE_INT64 && !rep) {
      // `memory: 4Gi` (quoted or not).
      std::optional<int64_t> bytes = ParseByteQuantity(s.text);
      if (!bytes.has_value()) {
        Error(s.node.Mark(), s.path,
              absl::StrCat(
                  "must be a byte quantity (bytes, or a number with Ki, Mi, Gi, Ti, K, M, G or T: "
                  "512Mi, 4Gi), got ",
                  Quote(s.text)));
        return false;
      }
      r->SetInt64(msg, field, *bytes);
      return true;
    }
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_UINT64) {
      uint64_t v;
      if (s.quoted || absl::StartsWith(s.text, "-") || !absl::SimpleAtoi(s.text, &v)) {
        return TypeError(s, field, absl::StartsWith(s.text, "-") ? " (must not be negative)" : "");
      }
      rep ? r->AddUInt64(msg, field, v) : r->SetUInt64(msg, field, v);
      return true;
    }
    int64_t v;
    if (s.quoted || !absl::SimpleAtoi(s.text, &v)) {
      double d;
      if (!s.quoted && absl::SimpleAtod(s.text, &d) && std::isfinite(d) && d == std::floor(d)) {
        return TypeError(s, field, " (out of range)");
      }
      return TypeError(s, field);
    }
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
      if (v < INT32_MIN || v > INT32_MAX) return TypeError(s, field, " (out of range)");
      rep ? r->AddInt32(msg, field, static_cast<int32_t>(v))
          : r->SetInt32(msg, field, static_cast<int32_t>(v));
    } else {
      rep ? r->AddInt64(msg, field, v) : r->SetInt64(msg, field, v);
    }
    return true;
  }

  bool StoreNumberOrBool(const Scalar& s, const Target& t) {
    auto [msg, field, r, rep] = t;
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
      double v;
      if (s.quoted || !absl::SimpleAtod(s.text, &v)) return TypeError(s, field);
      if (!std::isfinite(v)) return TypeError(s, field, " (must be finite)");
      rep ? r->AddDouble(msg, field, v) : r->SetDouble(msg, field, v);
      return true;
    }
    bool v;
    if (!s.quoted && (s.text == "true" || s.text == "True" || s.text == "TRUE")) {
      v = true;
    } else if (!s.quoted && (s.text == "false" || s.text == "False" || s.text == "FALSE")) {
      v = false;
    } else {
      return TypeError(s, field);
    }
    rep ? r->AddBool(msg, field, v) : r->SetBool(msg, field, v);
    return true;
  }

  bool StoreEnum(const Scalar& s, const Target& t) {
    const EnumDescriptor* e = t.field->enum_type();
    std::vector<std::string> choices = EnumChoices(e);
    const EnumValueDescriptor* ev =
        e->FindValueByName(EnumPrefix(e) + absl::AsciiStrToUpper(s.text));
    if (ev == nullptr || ev->number() == 0) {
      Error(s.node.Mark(), s.path,
            absl::StrCat("must be one of ", absl::StrJoin(choices, ", "), ", got ", Quote(s.text),
                         DidYouMean(s.text, choices)));
      return false;
    }
    t.rep ? t.r->AddEnum(t.msg, t.field, ev) : t.r->SetEnum(t.msg, t.field, ev);
    return true;
  }

  std::string file_;
  absl::flat_hash_set<std::string> override_paths_;
  std::vector<SpecError> errors_;
  absl::flat_hash_map<std::string, Position> positions_;
  absl::flat_hash_set<std::string> error_paths_;
};

}  // namespace

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

YamlReadResult ReadJobSpecNode(const YAML::Node& root, const std::string& file,
                               absl::flat_hash_set<std::string> override_paths, v1::JobSpec* spec) {
  YamlReader reader(file, std::move(override_paths));
  try {
    reader.ReadRoot(root, spec);
  } catch (const YAML::Exception& e) {
    reader.Error(e.mark, "", absl::StrCat("not valid YAML: ", e.msg));
  }
  return std::move(reader).Take();
}

}  // namespace trainctl::jobspec
