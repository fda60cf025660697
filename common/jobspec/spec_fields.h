// What the job.yaml reader, the validator and the serialisers share about a
// JobSpec's fields: size limits, the oneof messages' discriminator keys,
// enum names and how values are quoted in error messages. Internal to
// common/jobspec.
//
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace trainctl::jobspec {

// The reflection types every file of this library works with.
using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Entries of a list or map field.
inline constexpr int kMaxSequenceLength = 64;
// Bytes of one string value.
inline constexpr size_t kMaxStringBytes = 4096;
// A whole spec as submitted over gRPC.
inline constexpr size_t kMaxSpecBytes = 1 << 20;

// Where a field's value was written: in the file (line/column, 1-based), or
// in a --set override.
struct Position {
  int line = 0;
  int column = 0;
  bool from_override = false;
};

// Well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF), as protobuf requires of a string field.
bool IsValidUtf8(const std::string& s);

// Messages whose YAML form names the chosen oneof member with a key, e.g.
// `model: {name: cnn, classes: 10}` or `train: {format: idx, ...}`; nullptr
// for the others.
const char* DiscriminatorKey(const google::protobuf::Descriptor* d);

// "; did you mean 'x'?" when one candidate is close enough, else "".
std::string DidYouMean(std::string_view got, const std::vector<std::string>& candidates);

// The common prefix of an enum's value names, from its zero value:
// OPTIMIZER_UNSPECIFIED → "OPTIMIZER_".
std::string EnumPrefix(const google::protobuf::EnumDescriptor* e);

// The job.yaml names of an enum's values but the zero one.
std::vector<std::string> EnumChoices(const google::protobuf::EnumDescriptor* e);

// Quotes a scalar for an error message, shortened when long.
std::string Quote(std::string_view s);

// A number as an error message shows it: integers without a fraction.
std::string FormatNumber(double v);

// Fields written as a byte quantity in job.yaml (resources.memory).
bool IsByteQuantityField(const google::protobuf::FieldDescriptor* f);

// A byte quantity as Kubernetes writes it: plain bytes ("1048576"), binary
// suffixes Ki Mi Gi Ti (powers of 1024) or decimal K M G T (powers of 1000;
// lower-case k too), an integer or decimal number before the suffix
// ("1.5Gi"). nullopt for anything else, a negative value, or one past
// INT64_MAX bytes.
std::optional<int64_t> ParseByteQuantity(std::string_view text);

}  // namespace trainctl::jobspec
