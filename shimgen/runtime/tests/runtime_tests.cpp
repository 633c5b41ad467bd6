// shimgen runtime core: unit tests (checks and their messages, dims, variant dispatch, the output tree's walk, the C++
// package's pieces). Built and run with `meson test` (tests/unit/test_runtime_cpp.py); no model is compiled: the C++
// package runs a stand-in, this file built with SHIMGEN_FAKE_MODEL as a library of its own (its path: argv[1]).
#ifdef SHIMGEN_FAKE_MODEL

#include <torch/csrc/inductor/aoti_torch/utils.h>

#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "../shimgen_model_api.h"

// A stand-in for a compiled model: y = x * w + s, then s += 1 in place (its state). Its constants are user-managed (the
// tensors of the handles given), as AOTInductor's are with flags.weights = "file".
namespace {

struct Container {
  std::map<std::string, at::Tensor> active, inactive;  // by constant name
};

int g_containers = 0;
const char* const kNames[][2] = {{"w", "model.w"}, {"s", "model.s"}};

Container& of(AOTInductorModelContainerHandle handle) { return *reinterpret_cast<Container*>(handle); }

AOTIRuntimeError create(AOTInductorModelContainerHandle* handle, size_t, const char*, const char*) {
  *handle = reinterpret_cast<AOTInductorModelContainerHandle>(new Container);
  ++g_containers;
  return AOTI_RUNTIME_SUCCESS;
}

AOTIRuntimeError destroy(AOTInductorModelContainerHandle handle) {
  delete &of(handle);
  --g_containers;
  return AOTI_RUNTIME_SUCCESS;
}

AOTIRuntimeError run(AOTInductorModelContainerHandle handle, AtenTensorHandle* inputs, size_t,
                     AtenTensorHandle* outputs, size_t, AOTInductorStreamHandle, AOTIProxyExecutorHandle) {
  Container& c = of(handle);
  at::Tensor x = *torch::aot_inductor::tensor_handle_to_tensor_pointer(inputs[0]);
  aoti_torch_delete_tensor_object(inputs[0]);
  if (!c.active.count("w") || !c.active.count("s")) return AOTI_RUNTIME_FAILURE;
  at::Tensor& s = c.active.at("s");
  at::Tensor y = x.mul(c.active.at("w")).add(s);
  s.add_(1);
  outputs[0] = torch::aot_inductor::new_tensor_handle(std::move(y));
  return AOTI_RUNTIME_SUCCESS;
}

AOTIRuntimeError extract_constants_map(AOTInductorModelContainerHandle handle, AOTInductorConstantMapHandle map, bool) {
  auto& by_fqn = *reinterpret_cast<std::unordered_map<std::string, AtenTensorHandle>*>(map);
  for (const auto& [name, fqn] : kNames) {
    auto it = of(handle).active.find(name);
    if (it != of(handle).active.end()) by_fqn[fqn] = torch::aot_inductor::tensor_pointer_to_tensor_handle(&it->second);
  }
  return AOTI_RUNTIME_SUCCESS;
}

AOTIRuntimeError update_constants(AOTInductorModelContainerHandle handle, AOTInductorConstantMapHandle map,
                                  bool use_inactive, bool) {
  auto& by_name = *reinterpret_cast<std::unordered_map<std::string, AtenTensorHandle>*>(map);
  auto& target = use_inactive ? of(handle).inactive : of(handle).active;
  for (const auto& [name, handle_of] : by_name) {
    target[name] = *torch::aot_inductor::tensor_handle_to_tensor_pointer(handle_of);
  }
  return AOTI_RUNTIME_SUCCESS;
}

AOTIRuntimeError swap_constants(AOTInductorModelContainerHandle handle) {
  std::swap(of(handle).active, of(handle).inactive);
  return AOTI_RUNTIME_SUCCESS;
}

AOTIRuntimeError free_inactive(AOTInductorModelContainerHandle handle) {
  of(handle).inactive.clear();
  return AOTI_RUNTIME_SUCCESS;
}

std::vector<shimgen::Constant> constants(const char*) {
  std::vector<shimgen::Constant> result;
  for (const auto& [name, fqn] : kNames) {
    const int64_t size = std::string(name) == "w" ? 2 : 1;
    result.push_back({name, fqn, aoti_torch_dtype_float32(), aoti_torch_layout_strided(), aoti_torch_device_type_cpu(),
                      {size}, {1}, 0, {}});
  }
  return result;
}

AOTIProxyExecutorHandle ops() { return nullptr; }
std::string last_error() { return "the fake model has no weights"; }

const shimgen::ModelApi kApi = {&create, &destroy, &run, &extract_constants_map, &update_constants,
                                &swap_constants, &free_inactive, &constants, &ops, &last_error};

}  // namespace

extern "C" __attribute__((visibility("default"))) const shimgen::ModelApi* shimgen_model_api() { return &kApi; }
extern "C" __attribute__((visibility("default"))) int fake_model_containers() { return g_containers; }

#else

#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../shimgen_core.h"
#include "../shimgen_package.h"
#include "../shimgen_tree.h"

namespace {

int g_failures = 0;

#define EXPECT(cond)                                                        \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                         \
    }                                                                       \
  } while (0)

void expect_eq(const std::string& got, const std::string& want, int line) {
  if (got != want) {
    std::fprintf(stderr, "line %d:\n  got:  %s\n  want: %s\n", line, got.c_str(), want.c_str());
    ++g_failures;
  }
}
#define EXPECT_EQ(got, want) expect_eq((got), (want), __LINE__)

using shimgen::kStatic;

// f(x: float32[batch, 3], y: float32[batch, seq], *, mask: int64[seq]) with batch in [1, 8], seq in [2, 64] by 2.
const shimgen::DimSpec kDims[] = {{"batch", 1, 8, 1}, {"seq", 2, 64, 2}};
const int64_t kSizesX[] = {kStatic, 3}, kDimsX[] = {0, -1};
const int64_t kSizesY[] = {kStatic, kStatic}, kDimsY[] = {0, 1};
const int64_t kSizesMask[] = {kStatic}, kDimsMask[] = {1};
const shimgen::InputSpec kInputs[] = {
    {"x", c10::ScalarType::Float, c10::MemoryFormat::Contiguous, 2, kSizesX, kDimsX, "float32[batch, 3]"},
    {"y", c10::ScalarType::Float, c10::MemoryFormat::Contiguous, 2, kSizesY, kDimsY, "float32[batch, seq]"},
    {"mask", c10::ScalarType::Long, c10::MemoryFormat::Contiguous, 1, kSizesMask, kDimsMask, "int64[seq]"},
};
// Variants: batch=1; batch=1, seq=16; seq=16 (listed after the one more specific than it).
const int64_t kBatch1[] = {1, -1}, kBatch1Seq16[] = {1, 16}, kSeq16[] = {-1, 16};
const shimgen::VariantInfo kVariants[] = {
    {"v0", "batch=1", "v0.so", kBatch1, false}, {"v1", "batch=1, seq=16", "v1.so", kBatch1Seq16, false}, {"v2", "seq=16", "v2.so", kSeq16, false}};
// Output: (t0, {'a': t1, 3: None}, [t2, Pair(first=t3, second=t4)])
const char* const kPairNames[] = {"first", "second", nullptr};
const shimgen::OutObject kObjects[] = {{"pkg.mod", "Pair", "Pair", shimgen::kKeyword, shimgen::kAsNamedTuple, 2, 0, kPairNames, "", "", ""}};
const shimgen::OutNode kOutNodes[] = {
    {shimgen::kTuple, 3, nullptr, 0, -1},  {shimgen::kTensor, 0, nullptr, 0, -1}, {shimgen::kDict, 2, nullptr, 0, -1},
    {shimgen::kTensor, 0, "a", 0, -1},     {shimgen::kNone, 0, "3", 1, -1},       {shimgen::kList, 2, nullptr, 0, -1},
    {shimgen::kTensor, 0, nullptr, 0, -1}, {shimgen::kObject, 2, nullptr, 0, 0},  {shimgen::kTensor, 0, "first", 0, -1},
    {shimgen::kTensor, 0, "second", 0, -1},
};
const char* const kNoState[] = {nullptr};

shimgen::GraphSpec spec() {
  return {"f", "_f_cpu", "cpu-native", false, kInputs, 3, 2, kDims, 2, 5, kOutNodes, 10, kObjects, 1, kVariants, 3, kNoState,
          false, "no weights are loaded", 2, false, false, 0, nullptr, ""};
}

// The InputError that checking these inputs throws: "TypeError: message", "ValueError: message", or "" for none.
std::string check(const std::vector<at::Tensor>& inputs, std::vector<int64_t>* dims = nullptr) {
  const shimgen::GraphSpec s = spec();
  std::vector<int64_t> dim_values(s.num_dims, -1);
  std::vector<size_t> dim_source(s.num_dims, 0);
  try {
    for (size_t i = 0; i < inputs.size(); ++i) shimgen::check_input(s, i, inputs[i], "Tensor", dim_values.data(), dim_source.data());
  } catch (const shimgen::InputError& e) {
    return std::string(e.type_error() ? "TypeError: " : "ValueError: ") + e.what();
  }
  if (dims) *dims = dim_values;
  return "";
}

at::Tensor f32(std::vector<int64_t> sizes) { return at::ones(sizes, at::kFloat); }
at::Tensor i64(std::vector<int64_t> sizes) { return at::ones(sizes, at::kLong); }

void test_checks() {
  std::vector<int64_t> dims;
  EXPECT_EQ(check({f32({4, 3}), f32({4, 10}), i64({10})}, &dims), "");
  EXPECT(dims.size() == 2 && dims[0] == 4 && dims[1] == 10);
  EXPECT_EQ(check({at::ones({4, 3}, at::kDouble)}), "TypeError: f(): input 'x' has dtype torch.float64, expected torch.float32");
  EXPECT_EQ(check({at::Tensor()}), "TypeError: f(): input 'x' must be a dense (strided) tensor, got an undefined tensor");
  EXPECT_EQ(check({at::empty({4, 3}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta))}),
            "ValueError: f(): input 'x' is on meta; this package was built for cpu-native");
  EXPECT_EQ(check({f32({4})}), "ValueError: f(): input 'x' must have 2 dims float32[batch, 3], got shape (4,)");
  EXPECT_EQ(check({f32({4, 5})}), "ValueError: f(): input 'x' dim 1 must be 3 (float32[batch, 3]), got shape (4, 5)");
  EXPECT_EQ(check({f32({9, 3})}), "ValueError: f(): input 'x' dim 0 ('batch') must be in [1, 8], got 9");
  EXPECT_EQ(check({f32({4, 3}), f32({4, 7})}), "ValueError: f(): input 'y' dim 1 ('seq') must be a multiple of 2, got 7");
  EXPECT_EQ(check({f32({3, 4}).t()}), "ValueError: f(): input 'x' must be contiguous in memory (strides (1, 4)); call .contiguous() first");
}

void test_threads_mismatch() {
  shimgen::GraphSpec s = spec();
  EXPECT_EQ(shimgen::threads_mismatch(s, 3, "at::get_num_threads()"), "");  // no oneDNN weights
  s.packed_threads = 2;
  EXPECT_EQ(shimgen::threads_mismatch(s, 2, "at::get_num_threads()"), "");
  EXPECT_EQ(shimgen::threads_mismatch(s, 3, "at::get_num_threads()"),
            "f(): called at 3 threads (at::get_num_threads()), but its oneDNN weights are packed for 2: where oneDNN's "
            "layout follows the threads (on some CPUs), each call repacks them, much slower. Build for 3 threads "
            "([[target]] threads = 3) or call at 2.");
}

void test_dims_bind_across_inputs() {
  EXPECT_EQ(check({f32({4, 3}), f32({5, 10})}), "ValueError: f(): input 'y' dim 0 ('batch') is 5 but input 'x' has batch = 4");
  EXPECT_EQ(check({f32({4, 3}), f32({4, 10}), i64({12})}),
            "ValueError: f(): input 'mask' dim 0 ('seq') is 12 but input 'y' has seq = 10");
  std::vector<int64_t> dims;
  EXPECT_EQ(check({f32({1, 3}), f32({1, 64}), i64({64})}, &dims), "");
  EXPECT(dims[0] == 1 && dims[1] == 64);
}

void test_dispatch() {
  const shimgen::GraphSpec s = spec();
  auto pick = [&](int64_t batch, int64_t seq) {
    const int64_t dims[] = {batch, seq};
    return shimgen::pick_variant(s, dims);
  };
  EXPECT(pick(4, 10) == 0);  // no variant: the dynamic model
  EXPECT(pick(1, 10) == 1);  // batch=1
  EXPECT(pick(4, 16) == 3);  // seq=16
  EXPECT(pick(1, 16) == 2);  // batch=1, seq=16: the most specific, though batch=1 comes first
  shimgen::GraphSpec none = s;
  none.num_variants = 0;
  const int64_t dims[] = {1, 16};
  EXPECT(shimgen::pick_variant(none, dims) == 0);
}

// Renders the tree as Python would print it, leaves named by their index in the model's outputs.
struct TextBuilder {
  const shimgen::GraphSpec& s;
  std::string leaf(size_t i) { return "t" + std::to_string(i); }
  bool ok(const std::string& value) const { return !value.empty(); }
  void release(std::string&) const {}
  std::string make(size_t node, std::string* children, const size_t* child_nodes) {
    const shimgen::OutNode& n = s.out_nodes[node];
    std::string text;
    for (int c = 0; c < n.arity; ++c) {
      const shimgen::OutNode& child = s.out_nodes[child_nodes[c]];
      if (c) text += ", ";
      if (n.kind == shimgen::kDict) text += child.int_key ? std::string(child.key) + ": " : "'" + std::string(child.key) + "': ";
      if (n.kind == shimgen::kObject) text += std::string(child.key) + "=";
      text += children[c];
    }
    switch (n.kind) {
      case shimgen::kNone: return "None";
      case shimgen::kTuple: return "(" + text + (n.arity == 1 ? ",)" : ")");
      case shimgen::kList: return "[" + text + "]";
      case shimgen::kDict: return "{" + text + "}";
      case shimgen::kObject: return std::string(s.objects[n.object].name) + "(" + text + ")";
      default: return "";
    }
  }
};

void test_output_tree() {
  const shimgen::GraphSpec s = spec();
  TextBuilder builder{s};
  EXPECT_EQ(shimgen::build_tree(s, builder), "(t0, {'a': t1, 3: None}, [t2, Pair(first=t3, second=t4)])");
  // A single tensor: the model's one output as it is.
  const shimgen::OutNode single[] = {{shimgen::kTensor, 0, nullptr, 0, -1}};
  size_t node = 0, leaf = 0;
  EXPECT_EQ(shimgen::build_tree(single, node, leaf, builder), "t0");
  EXPECT(node == 1 && leaf == 1);
}

// A failed child stops the walk: the children built before it are released, nothing after it is built.
void test_output_tree_failure() {
  const shimgen::GraphSpec s = spec();
  struct Failing {
    const shimgen::GraphSpec& s;
    int built = 0, released = 0;
    int leaf(size_t i) { return i == 2 ? 0 : ++built; }
    bool ok(int value) const { return value != 0; }
    void release(int) { ++released; }
    int make(size_t, int*, const size_t*) { return ++built; }
  } builder{s};
  EXPECT(shimgen::build_tree(s, builder) == 0);
  EXPECT(builder.built == builder.released);  // t0, t1, the dict: all released
}

void test_cpp_face_errors() {
  // Graph::run's argument count, before any model is needed.
  shimgen::GraphSpec s = spec();
  s.num_variants = 0;  // no library to load
  shimgen::Graph graph(s, "");
  try {
    graph.run({f32({4, 3})});
    EXPECT(false);
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(e.what(), "f(): takes 3 inputs but 1 were given");
  }
  try {
    graph.run({f32({4, 3}), f32({4, 10}), at::ones({10}, at::kInt)});
    EXPECT(false);
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(e.what(), "f(): input 'mask' has dtype torch.int32, expected torch.int64");
  }
}

// A model's buffer pool: a call's large buffers come back to the next call (also for a request a little smaller),
// smaller ones and those made outside a call never enter it, blocks the last call did not take are freed, and tensors
// may outlive the pool.
void test_buffer_pool() {
  constexpr int64_t kLarge = shimgen::BufferPool::kMinBytes / sizeof(float);
  auto pool = std::make_unique<shimgen::BufferPool>();
  const void* first = nullptr;
  {
    shimgen::BufferPool::Scope call(pool.get());
    at::Tensor a = at::empty({kLarge}, at::kFloat);
    first = a.data_ptr();
    at::empty({16}, at::kFloat);  // small: not pooled
  }
  EXPECT(pool->kept_bytes() == shimgen::BufferPool::kMinBytes);
  at::Tensor outside = at::empty({kLarge}, at::kFloat);  // no call running: torch's allocator
  EXPECT(outside.data_ptr() != first);
  EXPECT(pool->kept_bytes() == shimgen::BufferPool::kMinBytes);
  at::Tensor output;
  {
    shimgen::BufferPool::Scope call(pool.get());
    at::Tensor a = at::empty({kLarge}, at::kFloat);
    EXPECT(a.data_ptr() == first);
    a.fill_(2);
    output = a;  // returned by the call: it stays with the caller
  }
  EXPECT(pool->kept_bytes() == 0);
  output = at::Tensor();  // freed by the caller: back to the pool
  EXPECT(pool->kept_bytes() == shimgen::BufferPool::kMinBytes);
  const void* larger = nullptr;
  {
    shimgen::BufferPool::Scope call(pool.get());
    at::Tensor b = at::empty({2 * kLarge}, at::kFloat);  // another size: the first call's block is not wanted
    larger = b.data_ptr();
  }
  EXPECT(pool->kept_bytes() == 2 * shimgen::BufferPool::kMinBytes);
  {
    shimgen::BufferPool::Scope call(pool.get());
    EXPECT(at::empty({2 * kLarge - kLarge / 4}, at::kFloat).data_ptr() == larger);
  }
  EXPECT(pool->kept_bytes() == 2 * shimgen::BufferPool::kMinBytes);
  {
    shimgen::BufferPool::Scope call(pool.get());
    // torch's raw allocation, through the allocator in front of it
    c10::Allocator* allocator = c10::GetAllocator(c10::DeviceType::CPU);
    void* raw = allocator->raw_allocate(shimgen::BufferPool::kMinBytes);
    std::memset(raw, 1, shimgen::BufferPool::kMinBytes);
    allocator->raw_deallocate(raw);
    output = at::ones({kLarge}, at::kFloat);
  }
  pool.reset();
  EXPECT(output.sum().item<float>() == static_cast<float>(kLarge));  // outlived its pool
  output = at::Tensor();
}

// A process forked while another thread takes and frees pooled buffers can still use a pool in the child.
void test_buffer_pool_fork() {
  constexpr int64_t kLarge = shimgen::BufferPool::kMinBytes / sizeof(float);
  auto pool = std::make_unique<shimgen::BufferPool>();
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    while (!stop) {
      shimgen::BufferPool::Scope call(pool.get());
      at::empty({kLarge}, at::kFloat);
    }
  });
  for (int i = 0; i < 100; ++i) {
    const pid_t child = fork();
    if (child == 0) {
      alarm(10);  // a lock inherited held would hang here
      shimgen::BufferPool::Scope call(pool.get());
      _exit(at::empty({kLarge}, at::kFloat).fill_(1).sum().item<float>() == static_cast<float>(kLarge) ? 0 : 1);
    }
    int status = 0;
    EXPECT(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  stop = true;
  busy.join();
}

// ---- the C++ package's pieces ----

std::string g_fake_model;  // argv[1]: the stand-in model library

// The message of the shimgen::Error `body` throws, or "" where it throws none.
std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool starts_with(const std::string& text, const std::string& start) { return text.rfind(start, 0) == 0; }

std::vector<std::string> g_temp_directories;  // removed at exit

std::string temp_directory() {
  char name[] = "/tmp/shimgen_runtime_XXXXXX";
  const char* made = mkdtemp(name);
  if (made) g_temp_directories.push_back(made);
  return made ? std::string(made) + "/" : std::string();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::string floats(std::vector<float> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

std::vector<float> values(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

struct Entry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string data;
};

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) out += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}

// A safetensors file as shimgen/inductor/weights.py writes one: the data 64-byte aligned.
using Metadata = std::vector<std::pair<std::string, std::string>>;

std::string safetensors(const std::vector<Entry>& entries, const Metadata& metadata) {
  std::string header = "{", data;
  for (const Entry& e : entries) {
    std::string shape;
    for (size_t d = 0; d < e.shape.size(); ++d) shape += (d ? "," : "") + std::to_string(e.shape[d]);
    header += quoted(e.name) + ":{\"dtype\":" + quoted(e.dtype) + ",\"shape\":[" + shape + "],\"data_offsets\":[" +
              std::to_string(data.size()) + "," + std::to_string(data.size() + e.data.size()) + "]},";
    data += e.data;
  }
  header += "\"__metadata__\":{";
  for (size_t i = 0; i < metadata.size(); ++i) {
    header += (i ? "," : "") + quoted(metadata[i].first) + ":" + quoted(metadata[i].second);
  }
  header += "}}";
  while ((8 + header.size()) % 64) header += ' ';
  std::string length(8, '\0');
  for (size_t i = 0; i < 8; ++i) length[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  return length + header + data;
}

// A shimgen weights file: `constants` (entry -> constant) and `variants` (variant -> constant -> entry), as JSON text.
std::string weights_file(const std::vector<Entry>& entries, const std::string& constants,
                         const std::string& variants = "{}") {
  const Metadata metadata = {
      {"format", "shimgen-weights-1"}, {"constants", constants}, {"variants", variants}, {"raw", "{}"}};
  return safetensors(entries, metadata);
}

shimgen::Constant constant(const std::string& name, const std::string& fqn, std::vector<int64_t> shape,
                           std::vector<int64_t> stride = {}) {
  if (stride.empty()) {
    stride.assign(shape.size(), 1);
    for (size_t d = shape.size(); d-- > 1;) stride[d - 1] = stride[d] * shape[d];
  }
  return {name, fqn, aoti_torch_dtype_float32(), aoti_torch_layout_strided(), aoti_torch_device_type_cpu(),
          shape, stride, 0, {}};
}

void test_json() {
  using shimgen::Json;
  const Json j = Json::parse(R"( {"a": [1, -2, 3.5e0, true, null], "b\u00e9\n": "x\"y\ud83d\ude00", "c": {}} )");
  EXPECT(j.kind == Json::kObject && j.object.size() == 3);
  const Json* a = j.get("a");
  EXPECT(a && a->kind == Json::kArray && a->array.size() == 5);
  if (a && a->array.size() == 5) {
    EXPECT(a->array[0].kind == Json::kInteger && a->array[0].integer == 1 && a->array[1].integer == -2);
    EXPECT(a->array[2].kind == Json::kNumber && a->array[2].number == 3.5);
    EXPECT(a->array[3].kind == Json::kBool && a->array[3].boolean && a->array[4].kind == Json::kNull);
  }
  const Json* b = j.get("b\xc3\xa9\n");
  EXPECT(b && b->string == "x\"y\xf0\x9f\x98\x80");
  EXPECT(j.get("c") && j.get("c")->kind == Json::kObject && !j.get("d"));
  EXPECT(Json::parse("9007199254740993").integer == 9007199254740993);
  auto error = [](const char* text) { return error_of([&] { Json::parse(text); }); };
  EXPECT_EQ(error("{\"a\": 1,}"), "expected a string key at byte 8");
  EXPECT_EQ(error("[1 2]"), "expected ',' or ']' at byte 3");
  EXPECT_EQ(error("\"abc"), "unterminated string at byte 4");
  EXPECT_EQ(error("{} x"), "unexpected text after the value at byte 3");
  EXPECT_EQ(error(""), "unexpected end at byte 0");
  EXPECT_EQ(error(std::string(100, '[').c_str()), "nested too deep at byte 65");
}

void test_safetensors() {
  const std::string dir = temp_directory(), path = dir + "t.safetensors";
  write_file(path, safetensors({{"w", "F32", {2}, floats({1, 2})},
                                {"\xc3\xa9", "I64", {}, std::string(8, '\x07')},
                                {"r", "U8", {3}, "abc"}},
                               {{"format", "x"}}));
  std::shared_ptr<const shimgen::Safetensors> file = shimgen::Safetensors::open(path);
  EXPECT(file->entries().size() == 3 && file->metadata().size() == 1);
  EXPECT(*file->metadata("format") == "x" && !file->metadata("y"));
  const shimgen::SafetensorsEntry* w = file->find("w");
  EXPECT(w && w->dtype == "F32" && w->shape == std::vector<int64_t>{2} && w->begin == 0 && w->end == 8);
  EXPECT(reinterpret_cast<uintptr_t>(file->data(*w)) % 64 == 0);
  EXPECT(file->find("\xc3\xa9") && file->find("\xc3\xa9")->shape.empty() && file->find("r")->nbytes() == 3);
  at::Tensor bytes = file->bytes(*w);
  file.reset();  // the tensor keeps the file mapped
  EXPECT(bytes.scalar_type() == at::kByte && bytes.numel() == 8);
  EXPECT(values(bytes.view(at::kFloat)) == std::vector<float>({1, 2}));
  EXPECT(shimgen::safetensors_dtype("BF16") == c10::ScalarType::BFloat16 && !shimgen::safetensors_dtype("C64"));
}

void test_safetensors_errors() {
  const std::string dir = temp_directory();
  auto error = [&](const std::string& name, const std::string& bytes) {
    write_file(dir + name, bytes);
    return error_of([&] { shimgen::Safetensors::open(dir + name); });
  };
  auto open = [&](const std::string& path) { return error_of([&] { shimgen::Safetensors::open(path); }); };
  EXPECT_EQ(open(dir + "absent.safetensors"), dir + "absent.safetensors: no such file");
  EXPECT_EQ(open(dir), dir + " is not a safetensors file (not a regular file)");
  EXPECT_EQ(error("short", "abcd"), dir + "short is not a safetensors file (it holds 4 bytes)");
  EXPECT_EQ(error("long", std::string("\xe8\x03\0\0\0\0\0\0{}", 10)),
            dir + "long is not a safetensors file (its header's length, 1000 bytes, is past its end)");
  EXPECT_EQ(error("json", std::string("\x04\0\0\0\0\0\0\0{\"a}", 12)),
            dir + "json is not a safetensors file (its header is no JSON: unterminated string at byte 4)");
  std::string outside = safetensors({{"w", "F32", {2}, floats({1, 2})}}, {});
  outside.resize(outside.size() - 4);
  EXPECT_EQ(error("outside", outside),
            dir + "outside is not a safetensors file (tensor 'w' has data_offsets outside the file's 4 bytes of data)");
  EXPECT_EQ(error("size", safetensors({{"w", "F32", {3}, floats({1, 2})}}, {})),
            dir + "size is not a safetensors file (tensor 'w' holds 8 bytes, not those of its dtype and shape)");
  EXPECT_EQ(error("entry", safetensors({{"w", "F32", {-1}, ""}}, {})),
            dir + "entry is not a safetensors file (tensor 'w' has a shape of other than sizes)");
}

void test_weights_file() {
  const std::string dir = temp_directory(), path = dir + "f_cpu.safetensors";
  // fc_weight: typed; _frozen_param0: a transposed constant, stored raw (Inductor's padded slice).
  write_file(path, weights_file({{"fc.weight", "F32", {2, 2}, floats({1, 2, 3, 4})},
                                 {"_frozen_param0", "U8", {64}, std::string(64, '\x01')},
                                 {"n1/fc.weight", "F32", {2, 2}, floats({5, 6, 7, 8})}},
                                R"({"_frozen_param0": "_frozen_param0", "fc.weight": "fc_weight"})",
                                R"({"n1": {"_frozen_param0": "_frozen_param0", "fc_weight": "n1/fc.weight"}})"));
  const shimgen::WeightsFile file(shimgen::Safetensors::open(path), "f_cpu");
  EXPECT(shimgen::WeightsFile::is_one(file.file()) && file.holds_unit() && file.layout().empty());
  const std::vector<shimgen::Constant> constants = {constant("fc_weight", "model.fc.weight", {2, 2}),
                                                    constant("_frozen_param0", "_frozen_param0", {2, 2}, {1, 2})};
  const auto dynamic = file.model_weights(nullptr, constants);
  EXPECT(dynamic && dynamic->size() == 2);
  if (dynamic && dynamic->size() == 2) {
    EXPECT(values(at::Tensor((*dynamic)[0]).view(at::kFloat)) == std::vector<float>({1, 2, 3, 4}));
    EXPECT((*dynamic)[1].numel() == 64);
  }
  const int64_t sizes[] = {1};
  const shimgen::VariantInfo n1 = {"n1", "n=1", "f_cpu_n1.so", sizes, false};
  const shimgen::VariantInfo n2 = {"n2", "n=2", "f_cpu_n2.so", sizes, false};
  const auto variant = file.model_weights(&n1, constants);
  EXPECT(variant && variant->size() == 2);
  if (variant && variant->size() == 2) {
    EXPECT(values(at::Tensor((*variant)[0]).view(at::kFloat)) == std::vector<float>({5, 6, 7, 8}));
  }
  EXPECT(!file.model_weights(&n2, constants));  // no such variant in the file
  EXPECT(!file.model_weights(nullptr, {constant("fc_weight", "model.fc.weight", {4, 2})}));  // another size
  EXPECT(!file.model_weights(nullptr, {constant("fc_bias", "model.fc.bias", {2})}));  // not in the file
  // Its strides reach past the entry.
  EXPECT(!file.model_weights(nullptr, {constant("_frozen_param0", "_frozen_param0", {2, 2}, {1, 64})}));
  write_file(dir + "plain.safetensors", safetensors({{"w", "F32", {2}, floats({1, 2})}}, {}));
  EXPECT(!shimgen::WeightsFile::is_one(*shimgen::Safetensors::open(dir + "plain.safetensors")));
  write_file(dir + "bad.safetensors", safetensors({}, {{"format", "shimgen-weights-1"}, {"constants", "[1, 2"}}));
  EXPECT_EQ(error_of([&] { shimgen::WeightsFile(shimgen::Safetensors::open(dir + "bad.safetensors"), "f_cpu"); }),
            dir + "bad.safetensors: its metadata is damaged ('constants' is not JSON)");

  // An "external" package's file: each unit's metadata under "units", its entries named in the file's own terms.
  write_file(dir + "external.safetensors",
             safetensors({{"f_cpu/fc.weight", "F32", {2, 2}, floats({1, 2, 3, 4})},
                          {"f_cpu/n1/fc.weight", "F32", {2, 2}, floats({5, 6, 7, 8})}},
                         {{"format", "shimgen-weights-1"},
                          {"units", R"({"f_cpu": {"constants": {"fc_weight": "f_cpu/fc.weight"}, "layout": "abc",)"
                                    R"( "variants": {"n1": {"fc_weight": "f_cpu/n1/fc.weight"}}}})"}}));
  const auto external = shimgen::Safetensors::open(dir + "external.safetensors");
  const shimgen::WeightsFile f_cpu(external, "f_cpu"), g_cpu(external, "g_cpu");
  EXPECT(f_cpu.holds_unit() && f_cpu.layout() == "abc" && !g_cpu.holds_unit());
  const auto by_unit = f_cpu.model_weights(&n1, {constant("fc_weight", "model.fc.weight", {2, 2})});
  EXPECT(by_unit && by_unit->size() == 1);
  if (by_unit && by_unit->size() == 1) {
    EXPECT(values(at::Tensor((*by_unit)[0]).view(at::kFloat)) == std::vector<float>({5, 6, 7, 8}));
  }
}

void test_weights_by_name() {
  const std::string dir = temp_directory(), path = dir + "state_dict.safetensors";
  write_file(path, safetensors({{"fc.weight", "F32", {2, 2}, floats({1, 2, 3, 4})},
                                {"bias", "F64", {2}, std::string(16, '\0')}},
                               {}));
  const auto file = shimgen::Safetensors::open(path);
  const char* const state[] = {"model.counter", nullptr};
  auto load = [&](const std::vector<shimgen::Constant>& constants) {
    return shimgen::weights_by_name(*file, constants, state, "f", "f_cpu.safetensors");
  };
  const std::vector<at::TensorBase> weights =
      load({constant("fc_weight", "model.fc.weight", {2, 2}), constant("counter", "model.counter", {1})});
  EXPECT(weights.size() == 2 && weights[0].numel() == 16 && !weights[1].defined());  // the state keeps its value
  EXPECT_EQ(error_of([&] { load({constant("bias2", "model.bias2", {2})}); }),
            "graph f: weight 'bias2' is missing from " + path);
  EXPECT_EQ(error_of([&] { load({constant("bias", "model.bias", {2})}); }),
            "graph f: weight 'bias' is float64[2], the compiled model's is float32[2]");
  EXPECT_EQ(error_of([&] { load({constant("fc_weight", "model.fc.weight", {4})}); }),
            "graph f: weight 'fc.weight' is float32[2, 2], the compiled model's is float32[4]");
  const std::string derived = error_of([&] {
    load({constant("_frozen_param0", "_frozen_param0", {2}), constant("fc_weight", "model.fc.weight", {2, 2}, {1, 2})});
  });
  EXPECT(starts_with(derived, "graph f: Inductor computed constants from the weights at build time "
                              "(_frozen_param0, fc.weight; "));
  EXPECT(derived.find("load that build's f_cpu.safetensors") != std::string::npos);
}

void test_torch_version() {
  const std::string dir = temp_directory();
  mkdir((dir + "torch").c_str(), 0755);
  mkdir((dir + "torch/lib").c_str(), 0755);
  write_file(dir + "torch/version.py", "from typing import Optional\n__version__ = '2.14.1+cu126'\ndebug = False\n");
  EXPECT_EQ(shimgen::torch_version_in(dir + "torch/lib/"), "2.14.1+cu126");
  EXPECT_EQ(error_of([&] { shimgen::check_torch("libresnet.so", "2.13.0", dir + "torch/lib/"); }),
            "libresnet.so was built for torch 2.13.0; this process loaded torch 2.14.1+cu126 (" + dir +
                "torch/lib). Rebuild the package with that torch, or run it with torch 2.13.0");
  EXPECT_EQ(error_of([&] { shimgen::check_torch("libresnet.so", "2.14.1", dir + "torch/lib"); }), "");
  mkdir((dir + "libtorch").c_str(), 0755);
  mkdir((dir + "libtorch/lib").c_str(), 0755);
  write_file(dir + "libtorch/build-version", "2.12.0a0+git1234\n");
  EXPECT_EQ(shimgen::torch_version_in(dir + "libtorch/lib/"), "2.12.0a0+git1234");
  EXPECT_EQ(error_of([&] { shimgen::check_torch("libresnet.so", "2.12.0", dir + "libtorch/lib/"); }), "");
  EXPECT_EQ(shimgen::torch_version_in(dir), "");  // none recorded: go on
  EXPECT_EQ(error_of([&] { shimgen::check_torch("libresnet.so", "2.13.0", dir); }), "");
  const std::string loaded = shimgen::loaded_torch_directory();
  EXPECT(loaded.size() > 5 && loaded.compare(loaded.size() - 5, 5, "/lib/") == 0);
  EXPECT(!shimgen::torch_version_in(loaded).empty());
}

void test_pick_unit() {
  shimgen::GraphSpec cpu = spec(), cuda = spec();
  cuda.cuda = true;
  const char* const graphs[] = {"f", "g"};
  const shimgen::UnitInfo units[] = {
      {&cuda, 0, "f_cuda.so", "", "", ""}, {&cpu, 0, "f_cpu.so", "", "", ""}, {&cuda, 1, "g_cuda.so", "", "", ""}};
  const shimgen::PackageInfo info = {"p", "1.0", "2.13.0", graphs, 2, units, 3, nullptr, 0, ""};
  EXPECT(shimgen::pick_unit(info, 0, false) == 1);
  EXPECT(shimgen::pick_unit(info, 0, true) == 0);
  EXPECT(shimgen::pick_unit(info, 1, true) == 2);
  EXPECT(shimgen::pick_unit(info, 1, false) == 2);  // its only target: its checks say the input is on the wrong device
  EXPECT_EQ(error_of([&] { shimgen::pick_unit(info, 2, false); }), "package p has no graph 2 (it has 2)");
}

void test_package_paths() {
  const std::string dir = temp_directory();
  const char* const graphs[] = {"f"};
  const shimgen::PackageInfo info = {"fake", "1.0", "2.13.0", graphs, 1, nullptr, 0, nullptr, 0, ""};
  mkdir((dir + "lib").c_str(), 0755);
  mkdir((dir + "lib/fake").c_str(), 0755);
  write_file(dir + "w.safetensors", "");
  auto paths = [&](const std::string& path) {
    const shimgen::PackagePaths p = shimgen::resolve_package(info, path, "/usr/lib/fake/");
    return p.directory + "|" + p.weights;
  };
  EXPECT_EQ(paths(""), "/usr/lib/fake/|");
  EXPECT_EQ(paths(dir), dir + "lib/fake/|");
  EXPECT_EQ(paths(dir.substr(0, dir.size() - 1)), dir + "lib/fake/|");
  EXPECT_EQ(paths(dir + "lib/fake"), dir + "lib/fake/|");
  EXPECT_EQ(paths(dir + "w.safetensors"), "/usr/lib/fake/|" + dir + "w.safetensors");
  const std::string takes = "(fake::load() takes a weights file, or the prefix the package is installed under)";
  EXPECT_EQ(error_of([&] { paths(dir + "absent"); }), dir + "absent: no such file or directory " + takes);
  EXPECT_EQ(error_of([&] { paths(dir + "lib"); }), dir + "lib holds no lib/fake/ " + takes);
}

// The stand-in's package: graphs f (a variant for n=1) and g, both mutating the state s of one owner.
const shimgen::DimSpec kFakeDims[] = {{"n", 1, 8, 1}};
const int64_t kFakeSizes[] = {kStatic, 2}, kFakeDimsOf[] = {0, -1}, kN1[] = {1};
const shimgen::InputSpec kFakeInputs[] = {
    {"x", c10::ScalarType::Float, c10::MemoryFormat::Contiguous, 2, kFakeSizes, kFakeDimsOf, "float32[n, 2]"}};
const shimgen::VariantInfo kFakeVariants[] = {{"n1", "n=1", "f_cpu_n1.so", kN1, false}};
const shimgen::OutNode kFakeOut[] = {{shimgen::kTensor, 0, nullptr, 0, -1}};
const char* const kFakeState[] = {"model.s", nullptr};
const shimgen::GraphSpec kFakeF = {"f", "_f_cpu", "cpu-native", false, kFakeInputs, 1, 1, kFakeDims, 1, 1, kFakeOut, 1,
                                   nullptr, 0, kFakeVariants, 1, kFakeState, true, "no weights", 2, false, true, 0, nullptr, ""};
const shimgen::GraphSpec kFakeG = {"g", "_g_cpu", "cpu-native", false, kFakeInputs, 1, 1, kFakeDims, 1, 1, kFakeOut, 1,
                                   nullptr, 0, nullptr, 0, kFakeState, true, "no weights", 2, false, true, 0, nullptr, ""};
const char* const kFakeGraphs[] = {"f", "g"};
const shimgen::UnitInfo kFakeUnits[] = {{&kFakeF, 0, "f_cpu.so", "f_cpu.safetensors", "f-code", "owner"},
                                        {&kFakeG, 1, "g_cpu.so", "g_cpu.safetensors", "g-code", "owner"}};
// The same package built with flags.weights = "external": no weights file in its directory.
const shimgen::UnitInfo kExternalUnits[] = {{&kFakeF, 0, "f_cpu.so", "", "f-code", "owner"},
                                            {&kFakeG, 1, "g_cpu.so", "", "g-code", "owner"}};

shimgen::PackageInfo fake_info() {
  static const std::string torch = shimgen::torch_version_in(shimgen::loaded_torch_directory());
  return {"fake", "1.0", torch.c_str(), kFakeGraphs, 2, kFakeUnits, 2, nullptr, 0, ""};
}

// The weights file an "external" build of the stand-in writes beside its wheel (weights.external_file), with these
// layouts for f's and g's compiled code.
std::string external_weights(const std::string& f_layout, const std::string& g_layout) {
  return safetensors({{"f_cpu/w", "F32", {2}, floats({1, 2})}, {"f_cpu/s", "F32", {1}, floats({100})},
                      {"f_cpu/n1/w", "F32", {2}, floats({10, 20})}, {"g_cpu/w", "F32", {2}, floats({3, 4})}},
                     {{"format", "shimgen-weights-1"},
                      {"units", R"({"f_cpu": {"constants": {"s": "f_cpu/s", "w": "f_cpu/w"}, "layout": ")" + f_layout +
                                    R"(", "variants": {"n1": {"s": "f_cpu/s", "w": "f_cpu/n1/w"}}}, "g_cpu": )"
                                    R"({"constants": {"s": "f_cpu/s", "w": "g_cpu/w"}, "layout": ")" +
                                    g_layout + R"(", "variants": {}}})"}});
}

// An installed package of the stand-in under a new prefix; its private directory.
std::string install_fake() {
  const std::string prefix = temp_directory(), dir = prefix + "lib/fake/";
  mkdir((prefix + "lib").c_str(), 0755);
  mkdir(dir.c_str(), 0755);
  std::ifstream in(g_fake_model, std::ios::binary);
  const std::string library((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* name : {"f_cpu.so", "f_cpu_n1.so", "g_cpu.so"}) write_file(dir + name, library);  // loaded apart
  write_file(dir + "f_cpu.safetensors",
             weights_file({{"w", "F32", {2}, floats({1, 2})}, {"s", "F32", {1}, floats({100})},
                           {"n1/w", "F32", {2}, floats({10, 20})}},
                          R"({"s": "s", "w": "w"})", R"({"n1": {"s": "s", "w": "n1/w"}})"));
  write_file(dir + "g_cpu.safetensors",
             weights_file({{"w", "F32", {2}, floats({3, 4})}, {"s", "F32", {1}, floats({100})}},
                          R"({"s": "s", "w": "w"})"));
  return dir;
}

int fake_containers(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  auto count = handle ? reinterpret_cast<int (*)()>(dlsym(handle, "fake_model_containers")) : nullptr;
  const int result = count ? count() : -1;
  if (handle) dlclose(handle);
  return result;
}

void test_package() {
  const std::string dir = install_fake();
  const shimgen::PackageInfo info = fake_info();
  auto package = std::make_unique<shimgen::Package>(info, dir);
  auto containers = [&] {
    return std::to_string(fake_containers(dir + "f_cpu.so")) + std::to_string(fake_containers(dir + "f_cpu_n1.so")) +
           std::to_string(fake_containers(dir + "g_cpu.so"));
  };
  EXPECT_EQ(containers(), "111");
  const at::Tensor ones2 = at::ones({2, 2}), ones1 = at::ones({1, 2});
  auto run = [&](const char* graph, const at::Tensor& x) {
    return values(package->run(package->graph_index(graph), {x}).at(0));
  };
  // y = x * w + s, then s += 1: the state is one tensor for f, its variant and g (one owner).
  EXPECT(run("f", ones2) == std::vector<float>({101, 102, 101, 102}));
  EXPECT(run("g", ones2) == std::vector<float>({104, 105, 104, 105}));
  EXPECT(run("f", ones1) == std::vector<float>({112, 122}));  // the variant's weights
  EXPECT_EQ(error_of([&] { package->run(0, {ones2, ones2}); }), "f(): takes 1 input but 2 were given");
  EXPECT_EQ(error_of([&] { package->run(0, {at::ones({2, 3})}); }),
            "f(): input 'x' dim 1 must be 2 (float32[n, 2]), got shape (2, 3)");
  EXPECT_EQ(error_of([&] { package->graph_index("h"); }), "no graph 'h' in package fake (graphs: f, g)");

  // A weights file of graph f: every unit whose constants it holds takes it (g's are f's dynamic model's); the state
  // keeps its value, not the file's.
  const std::string other = temp_directory();
  write_file(other + "f.safetensors",
             weights_file({{"w", "F32", {2}, floats({5, 6})}, {"s", "F32", {1}, floats({0})},
                           {"n1/w", "F32", {2}, floats({50, 60})}},
                          R"({"s": "s", "w": "w"})", R"({"n1": {"s": "s", "w": "n1/w"}})"));
  package->load_weights(other + "f.safetensors");
  EXPECT(run("f", ones2) == std::vector<float>({108, 109, 108, 109}));
  EXPECT(run("f", ones1) == std::vector<float>({154, 164}));
  EXPECT(run("g", ones2) == std::vector<float>({110, 111, 110, 111}));
  // A state dict by weight name: every graph and variant.
  write_file(other + "state_dict.safetensors", safetensors({{"w", "F32", {2}, floats({7, 8})}}, {}));
  package->load_weights(other + "state_dict.safetensors");
  EXPECT(run("f", ones1) == std::vector<float>({113, 114}));
  EXPECT(run("g", ones2) == std::vector<float>({114, 115, 114, 115}));
  write_file(other + "missing.safetensors", safetensors({{"v", "F32", {2}, floats({7, 8})}}, {}));
  EXPECT_EQ(error_of([&] { package->load_weights(other + "missing.safetensors"); }),
            "graph f: weight 'w' is missing from " + other + "missing.safetensors");
  write_file(other + "dtype.safetensors", safetensors({{"w", "F64", {2}, std::string(16, '\0')}}, {}));
  EXPECT_EQ(error_of([&] { package->load_weights(other + "dtype.safetensors"); }),
            "graph f: weight 'w' is float64[2], the compiled model's is float32[2]");
  write_file(other + "another.safetensors", weights_file({{"v", "F32", {2}, floats({7, 8})}}, R"({"v": "v"})"));
  EXPECT_EQ(error_of([&] { package->load_weights(other + "another.safetensors"); }),
            other + "another.safetensors holds the weights of no graph in this package as it was built (f_cpu, g_cpu): "
                    "it comes from a build of another model, or with other flags");
  write_file(other + "model.pt", "PK\x03\x04 a zip archive");
  EXPECT(starts_with(error_of([&] { package->load_weights(other + "model.pt"); }),
                     other + "model.pt is not a safetensors file ("));
  EXPECT(run("g", ones2) == std::vector<float>({115, 116, 115, 116}));  // the failed loads changed nothing

  // Calls from several threads: the state's calls take turns, none is lost.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i) package->run(1, {ones2});
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT(run("g", ones2) == std::vector<float>({216, 217, 216, 217}));

  // Destroyed, its containers are; made again, it starts from the files.
  package.reset();
  EXPECT_EQ(containers(), "000");
  package = std::make_unique<shimgen::Package>(info, dir);
  EXPECT(run("f", ones2) == std::vector<float>({101, 102, 101, 102}));
  package.reset();
  // open_package: a prefix, and a weights file to load after.
  const std::string prefix = dir.substr(0, dir.size() - std::string("lib/fake/").size());
  std::shared_ptr<shimgen::Package> opened = shimgen::open_package(info, prefix, nullptr);
  EXPECT(opened->directory() == dir);
  EXPECT(values(opened->run(1, {ones2}).at(0)) == std::vector<float>({103, 104, 103, 104}));
}

void test_package_errors() {
  const shimgen::PackageInfo info = fake_info();
  std::string dir = install_fake();
  unlink((dir + "g_cpu.safetensors").c_str());
  EXPECT_EQ(error_of([&] { shimgen::Package(info, dir); }), dir + "g_cpu.safetensors: missing; reinstall the package");
  write_file(dir + "g_cpu.safetensors", weights_file({{"v", "F32", {2}, floats({7, 8})}}, R"({"v": "v"})"));
  EXPECT_EQ(error_of([&] { shimgen::Package(info, dir); }),
            dir + "g_cpu.safetensors does not hold the weights of graph g; reinstall the package");
  write_file(dir + "g_cpu.safetensors", "not safetensors");
  EXPECT(starts_with(error_of([&] { shimgen::Package(info, dir); }),
                     dir + "g_cpu.safetensors is not a safetensors file ("));
  unlink((dir + "g_cpu.so").c_str());
  EXPECT_EQ(error_of([&] { shimgen::Package(info, dir); }),
            dir + "g_cpu.so: missing (the compiled model of graph g); the package is incomplete: reinstall it");
  dir = install_fake();  // a library once loaded stays: a new directory, whose variant was never loaded
  unlink((dir + "f_cpu_n1.so").c_str());
  EXPECT(starts_with(error_of([&] { shimgen::Package(info, dir); }),
                     "_f_cpu: cannot load the variant for n=1 (" + dir + "f_cpu_n1.so): "));
  const char* const ops[] = {"custom_ops.so", nullptr};
  shimgen::PackageInfo with_ops = info;
  with_ops.op_libraries = ops;
  with_ops.num_op_libraries = 1;
  EXPECT_EQ(error_of([&] { shimgen::Package(with_ops, dir); }),
            dir + "ops/custom_ops.so: missing (a custom ops library); the package is incomplete: reinstall it");
  shimgen::PackageInfo old = info;
  old.torch_version = "1.0.0";
  const std::string torch = shimgen::loaded_torch_directory();
  EXPECT_EQ(error_of([&] { shimgen::Package(old, dir); }),
            "libfake.so was built for torch 1.0.0; this process loaded torch " + shimgen::torch_version_in(torch) +
                " (" + torch.substr(0, torch.size() - 1) +
                "). Rebuild the package with that torch, or run it with torch 1.0.0");
}

void test_external_package() {
  const std::string dir = install_fake(), other = temp_directory();
  unlink((dir + "f_cpu.safetensors").c_str());
  unlink((dir + "g_cpu.safetensors").c_str());
  shimgen::PackageInfo info = fake_info();
  info.units = kExternalUnits;
  info.weights_env = "FAKE_WEIGHTS";
  const at::Tensor ones2 = at::ones({2, 2});
  // Without weights it loads, and a call says what to do.
  unsetenv("FAKE_WEIGHTS");
  const std::string prefix = dir.substr(0, dir.size() - std::string("lib/fake/").size());
  std::shared_ptr<shimgen::Package> package = shimgen::open_package(info, prefix, nullptr);
  EXPECT_EQ(error_of([&] { package->run(0, {ones2}); }), "f(): no weights");
  // Given the build's file, by load_weights() or by the variable.
  write_file(other + "fake.safetensors", external_weights("f-code", "g-code"));
  package->load_weights(other + "fake.safetensors");
  EXPECT(values(package->run(0, {ones2}).at(0)) == std::vector<float>({101, 102, 101, 102}));
  EXPECT(values(package->run(1, {ones2}).at(0)) == std::vector<float>({104, 105, 104, 105}));
  package.reset();
  setenv("FAKE_WEIGHTS", (other + "fake.safetensors").c_str(), 1);
  package = shimgen::open_package(info, prefix, nullptr);
  EXPECT(values(package->run(1, {ones2}).at(0)) == std::vector<float>({103, 104, 103, 104}));
  // A file laid out for other compiled code is refused, naming the units.
  write_file(other + "other.safetensors", external_weights("f-other", "g-other"));
  EXPECT_EQ(error_of([&] { package->load_weights(other + "other.safetensors"); }),
            other + "other.safetensors holds weights laid out for other compiled code than this package's (f_cpu, "
                    "g_cpu): it comes from another build, spec or shimgen; load the file of this package's build, or "
                    "the model's state dict");
  package.reset();
  setenv("FAKE_WEIGHTS", (other + "absent.safetensors").c_str(), 1);
  EXPECT(starts_with(error_of([&] { shimgen::open_package(info, prefix, nullptr); }),
                     "FAKE_WEIGHTS=" + other + "absent.safetensors: "));
  unsetenv("FAKE_WEIGHTS");
}

}  // namespace

int main(int argc, char** argv) {
  g_fake_model = argc > 1 ? argv[1] : "";
  const std::vector<std::pair<const char*, std::function<void()>>> tests = {
      {"checks", test_checks}, {"threads_mismatch", test_threads_mismatch}, {"dims_bind_across_inputs", test_dims_bind_across_inputs}, {"dispatch", test_dispatch},
      {"output_tree", test_output_tree}, {"output_tree_failure", test_output_tree_failure}, {"cpp_face_errors", test_cpp_face_errors},
      {"buffer_pool", test_buffer_pool}, {"buffer_pool_fork", test_buffer_pool_fork},
      {"json", test_json}, {"safetensors", test_safetensors}, {"safetensors_errors", test_safetensors_errors},
      {"weights_file", test_weights_file}, {"weights_by_name", test_weights_by_name},
      {"torch_version", test_torch_version}, {"pick_unit", test_pick_unit}, {"package_paths", test_package_paths},
      {"package", test_package}, {"package_errors", test_package_errors}, {"external_package", test_external_package},
  };
  for (const auto& [name, test] : tests) {
    const int before = g_failures;
    test();
    std::printf("%s %s\n", g_failures == before ? "ok" : "FAILED", name);
  }
  for (const std::string& directory : g_temp_directories) std::filesystem::remove_all(directory);
  return g_failures == 0 ? 0 : 1;
}

#endif  // SHIMGEN_FAKE_MODEL
