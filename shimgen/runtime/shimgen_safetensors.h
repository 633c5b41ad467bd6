// shimgen runtime: safetensors files read without Python (torch ships no JSON library): the header's JSON, the
// entries, and their bytes as tensors over the file, mapped copy on write as torch.from_file(shared=False) maps it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace shimgen {

// A JSON value: all of JSON, numbers kept as integers where they are ones.
struct Json {
  enum Kind { kNull, kBool, kInteger, kNumber, kString, kArray, kObject };
  Kind kind = kNull;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;  // in the text's order

  // Throws std::runtime_error: "expected ',' or '}' at byte 12".
  static Json parse(std::string_view text);
  // The member `key` of an object, or nullptr.
  const Json* get(std::string_view key) const;
};

// A tensor of a safetensors file: where its bytes are, from the start of the data (after the header).
struct SafetensorsEntry {
  std::string dtype;  // safetensors' name: "F32"
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;
  size_t nbytes() const { return end - begin; }
};

// torch's dtype of a safetensors dtype name, where torch has one.
std::optional<c10::ScalarType> safetensors_dtype(std::string_view name);

class Safetensors {
 public:
  // Maps `path` and reads its header. Throws Error: "<path>: no such file", "<path> is not a safetensors file (...)".
  static std::shared_ptr<const Safetensors> open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::unordered_map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;
  // The header's "__metadata__" (strings by key).
  const std::unordered_map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string* metadata(const std::string& key) const;

  const uint8_t* data(const SafetensorsEntry& entry) const { return data_ + entry.begin; }
  // The entry's bytes: a 1-d uint8 tensor over the mapping, which it keeps mapped.
  at::Tensor bytes(const SafetensorsEntry& entry) const;

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  const uint8_t* data_ = nullptr;  // the first byte after the header
  std::unordered_map<std::string, SafetensorsEntry> entries_;
  std::unordered_map<std::string, std::string> metadata_;
};

}  // namespace shimgen
