// Serialisations of a JobSpec: back to job.yaml (JobSpecToYaml), the flat
// key=value form a rank process reads (JobSpecToFlat), and the checkpoint
// compatibility hash and check. Declared in job_spec.h.
//
// Pure functions; thread-safe.
#include <charconv>
#include <cstdio>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/jobspec/job_spec.h"
#include "common/jobspec/spec_fields.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "yaml-cpp/yaml.h"

namespace trainctl {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using jobspec::DiscriminatorKey;

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
      entries[e.GetReflection()->GetString(e, ed->map_key())] =
          e.GetReflection()->GetString(e, ed->map_value());
    }
    out << YAML::BeginMap;
    for (const auto& [k, v] : entries)
      out << YAML::Key << k << YAML::Value << YAML::DoubleQuoted << v;
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
      if (!f->is_repeated() && f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE &&
          !r->HasField(msg, f))
        continue;
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
        items.push_back(f->cpp_type() == FieldDescriptor::CPPTYPE_STRING
                            ? r->GetRepeatedString(msg, f, j)
                            : absl::StrCat(r->GetRepeatedInt32(msg, f, j)));
      }
      (*out)[k] = absl::StrJoin(items, ",");
      continue;
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (r->HasField(msg, f)) FlattenMessage(r->GetMessage(msg, f), k, out);
        break;
      case FieldDescriptor::CPPTYPE_INT32:
        (*out)[k] = absl::StrCat(r->GetInt32(msg, f));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        (*out)[k] = absl::StrCat(r->GetInt64(msg, f));
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        (*out)[k] = absl::StrCat(r->GetUInt64(msg, f));
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        char buf[64];
        auto res = std::to_chars(buf, buf + sizeof buf, r->GetDouble(msg, f));
        (*out)[k] = std::string(buf, res.ptr);
        break;
      }
      case FieldDescriptor::CPPTYPE_BOOL:
        (*out)[k] = r->GetBool(msg, f) ? "true" : "false";
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        (*out)[k] = EnumValueName(r->GetEnum(msg, f));
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        (*out)[k] = r->GetString(msg, f);
        break;
      default:
        break;
    }
  }
}

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

std::map<std::string, std::string> JobSpecToFlat(const v1::JobSpec& spec) {
  v1::JobSpec resolved = spec;
  ResolveJobSpecDefaults(
      &resolved);  // idempotent; a spec stored before a default was added gets it here
  std::map<std::string, std::string> out;
  FlattenMessage(resolved, "", &out);
  return out;
}

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
        absl::StrCat(EnumValueName(d->FindValueByNumber(to.training().optimizer().name())),
                     ", but job ", from_id, " trained with ",
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
