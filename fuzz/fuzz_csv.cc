// CSV datasets: the first 4 bytes choose the options (header, label column,
// delimiter, classes), the rest is the file.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "worker/engine/dataset_formats.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  trainctl::engine::CsvDataOptions o;
  o.path = "fuzz.csv";
  o.has_header = data[0] & 1;
  if (data[0] & 2) o.label_column = "label";
  o.label_column_index = static_cast<int8_t>(data[1]);
  static constexpr char kDelims[] = {',', ';', '\t', ' '};
  o.delimiter = kDelims[data[2] & 3];
  o.classes = data[3] & 0x7f;
  const absl::string_view text(reinterpret_cast<const char*>(data) + 4, size - 4);
  auto t = trainctl::engine::ParseCsv(text, o);
  if (!t.ok()) return 0;
  // What the loader relies on when it makes tensors from the table.
  const size_t rows = static_cast<size_t>(t->rows);
  if (t->rows <= 0 || t->columns < 2 ||
      t->features.size() != rows * static_cast<size_t>(t->columns - 1) ||
      (o.classes > 0 ? t->class_labels.size() : t->float_labels.size()) != rows) {
    std::abort();
  }
  return 0;
}
