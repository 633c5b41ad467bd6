// shimgen runtime: safetensors files (shimgen_safetensors.h).
#include "shimgen_safetensors.h"

#include <ATen/ops/from_blob.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "shimgen_core.h"

namespace shimgen {

namespace {

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Json document() {
    Json value = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the value");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 64;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(what + " at byte " + std::to_string(pos_));
  }

  void skip_space() {
    auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
    while (pos_ < text_.size() && space(text_[pos_])) ++pos_;
  }

  bool take(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c, const char* what) {
    if (!take(c)) fail(std::string("expected ") + what);
  }

  bool take_word(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  Json parse_value(int depth) {
    if (depth > kMaxDepth) fail("nested too deep");
    skip_space();
    if (pos_ >= text_.size()) fail("unexpected end");
    Json value;
    const char c = text_[pos_];
    if (c == '{') {
      ++pos_;
      value.kind = Json::kObject;
      if (take('}')) return value;
      do {
        skip_space();
        if (pos_ >= text_.size() || text_[pos_] != '"') fail("expected a string key");
        std::string key = parse_string();
        expect(':', "':'");
        value.object.emplace_back(std::move(key), parse_value(depth + 1));
      } while (take(','));
      expect('}', "',' or '}'");
    } else if (c == '[') {
      ++pos_;
      value.kind = Json::kArray;
      if (take(']')) return value;
      do {
        value.array.push_back(parse_value(depth + 1));
      } while (take(','));
      expect(']', "',' or ']'");
    } else if (c == '"') {
      value.kind = Json::kString;
      value.string = parse_string();
    } else if (take_word("true") || take_word("false")) {
      value.kind = Json::kBool;
      value.boolean = c == 't';
    } else if (take_word("null")) {
      value.kind = Json::kNull;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      parse_number(value);
    } else {
      fail("unexpected character");
    }
    return value;
  }

  void parse_number(Json& value) {
    const size_t start = pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      if (pos_ == from) fail("expected a digit");
    };
    bool integral = true;
    if (text_[pos_] == '-') ++pos_;
    digits();
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      digits();
      integral = false;
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      digits();
      integral = false;
    }
    const std::string number(text_.substr(start, pos_ - start));
    errno = 0;
    if (integral) {
      const long long parsed = std::strtoll(number.c_str(), nullptr, 10);
      if (errno == 0) {
        value.kind = Json::kInteger;
        value.integer = parsed;
        value.number = static_cast<double>(parsed);
        return;
      }
      errno = 0;
    }
    value.kind = Json::kNumber;
    value.number = std::strtod(number.c_str(), nullptr);
  }

  uint32_t hex4() {
    if (pos_ + 4 > text_.size()) fail("expected 4 hex digits");
    uint32_t code = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      code <<= 4;
      if (h >= '0' && h <= '9') code |= static_cast<uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f') code |= static_cast<uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') code |= static_cast<uint32_t>(h - 'A' + 10);
      else fail("expected a hex digit");
    }
    return code;
  }

  static void append_utf8(std::string& out, uint32_t code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  // At the opening quote. Python's json.dumps escapes every non-ASCII character (\uXXXX, surrogate pairs beyond the
  // BMP).
  std::string parse_string() {
    ++pos_;
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated string");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t code = hex4();
          if (code >= 0xD800 && code < 0xDC00 && text_.substr(pos_, 2) == "\\u") {
            const size_t at = pos_;
            pos_ += 2;
            const uint32_t low = hex4();
            if (low >= 0xDC00 && low < 0xE000) {
              code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
            } else {
              pos_ = at;
            }
          }
          append_utf8(out, code);
          break;
        }
        default: fail("bad escape in a string");
      }
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
};

size_t itemsize(std::string_view dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
  return 0;
}

}  // namespace

Json Json::parse(std::string_view text) { return Parser(text).document(); }

const Json* Json::get(std::string_view key) const {
  for (const auto& [name, value] : object) {
    if (name == key) return &value;
  }
  return nullptr;
}

std::optional<c10::ScalarType> safetensors_dtype(std::string_view name) {
  if (name == "F64") return c10::ScalarType::Double;
  if (name == "F32") return c10::ScalarType::Float;
  if (name == "F16") return c10::ScalarType::Half;
  if (name == "BF16") return c10::ScalarType::BFloat16;
  if (name == "I64") return c10::ScalarType::Long;
  if (name == "I32") return c10::ScalarType::Int;
  if (name == "I16") return c10::ScalarType::Short;
  if (name == "I8") return c10::ScalarType::Char;
  if (name == "U8") return c10::ScalarType::Byte;
  if (name == "BOOL") return c10::ScalarType::Bool;
  if (name == "F8_E4M3") return c10::ScalarType::Float8_e4m3fn;
  if (name == "F8_E5M2") return c10::ScalarType::Float8_e5m2;
  return std::nullopt;
}

struct Safetensors::Mapping {
  void* address = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (address) munmap(address, size);
  }
};

std::shared_ptr<const Safetensors> Safetensors::open(const std::string& path) {
  auto bad = [&](const std::string& why) { return Error(path + " is not a safetensors file (" + why + ")"); };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    throw Error(path + ": " + (error == ENOENT ? std::string("no such file") : std::strerror(error)));
  }
  struct stat st = {};
  auto mapping = std::make_shared<Mapping>();
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw bad("not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    throw bad("it holds " + std::to_string(size) + " bytes");
  }
  // Copy on write: the pages are the file's, shared between processes, until something writes to them.
  void* address = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int map_error = errno;
  ::close(fd);
  if (address == MAP_FAILED) throw Error(path + ": cannot map it: " + std::strerror(map_error));
  mapping->address = address;
  mapping->size = size;

  const auto* bytes = static_cast<const uint8_t*>(address);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | bytes[i];
  if (length > size - 8) throw bad("its header's length, " + std::to_string(length) + " bytes, is past its end");
  Json header;
  try {
    header = Json::parse(std::string_view(reinterpret_cast<const char*>(bytes + 8), static_cast<size_t>(length)));
  } catch (const std::exception& e) {
    throw bad(std::string("its header is no JSON: ") + e.what());
  }
  if (header.kind != Json::kObject) throw bad("its header is no JSON object");

  auto result = std::shared_ptr<Safetensors>(new Safetensors);
  result->path_ = path;
  result->mapping_ = mapping;
  result->data_ = bytes + 8 + length;
  const size_t data_size = size - 8 - static_cast<size_t>(length);
  for (const auto& [name, value] : header.object) {
    if (name == "__metadata__") {
      if (value.kind != Json::kObject) throw bad("__metadata__ is no object");
      for (const auto& [key, text] : value.object) {
        if (text.kind != Json::kString) throw bad("__metadata__['" + key + "'] is no string");
        result->metadata_[key] = text.string;
      }
      continue;
    }
    const Json* dtype = value.get("dtype");
    const Json* shape = value.get("shape");
    const Json* offsets = value.get("data_offsets");
    auto bad_entry = [&](const std::string& why) { return bad("tensor '" + name + "' " + why); };
    if (value.kind != Json::kObject || !dtype || dtype->kind != Json::kString || !shape ||
        shape->kind != Json::kArray || !offsets || offsets->kind != Json::kArray || offsets->array.size() != 2) {
      throw bad_entry("needs a dtype, a shape and two data_offsets");
    }
    SafetensorsEntry entry;
    entry.dtype = dtype->string;
    uint64_t numel = 1;
    for (const Json& d : shape->array) {
      if (d.kind != Json::kInteger || d.integer < 0) throw bad_entry("has a shape of other than sizes");
      entry.shape.push_back(d.integer);
      numel = d.integer == 0 || numel <= std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d.integer)
                  ? numel * static_cast<uint64_t>(d.integer)
                  : std::numeric_limits<uint64_t>::max();
    }
    const Json& begin = offsets->array[0];
    const Json& end = offsets->array[1];
    if (begin.kind != Json::kInteger || end.kind != Json::kInteger || begin.integer < 0 ||
        end.integer < begin.integer || static_cast<uint64_t>(end.integer) > data_size) {
      throw bad_entry("has data_offsets outside the file's " + std::to_string(data_size) + " bytes of data");
    }
    entry.begin = static_cast<size_t>(begin.integer);
    entry.end = static_cast<size_t>(end.integer);
    const size_t item = itemsize(entry.dtype);
    if (item && (numel > std::numeric_limits<uint64_t>::max() / item || entry.nbytes() != numel * item)) {
      throw bad_entry("holds " + std::to_string(entry.nbytes()) + " bytes, not those of its dtype and shape");
    }
    result->entries_[name] = std::move(entry);
  }
  return result;
}

const SafetensorsEntry* Safetensors::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

const std::string* Safetensors::metadata(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

at::Tensor Safetensors::bytes(const SafetensorsEntry& entry) const {
  std::shared_ptr<Mapping> keep = mapping_;
  return at::from_blob(const_cast<uint8_t*>(data(entry)), {static_cast<int64_t>(entry.nbytes())},
                       [keep](void*) mutable { keep.reset(); }, at::TensorOptions().dtype(at::kByte));
}

}  // namespace shimgen
