// shimgen runtime core: unit tests (checks and their messages, dims, variant dispatch, the output tree's walk). Built
// and run with `meson test` (tests/unit/test_runtime_cpp.py); no model is compiled, so no container is made.
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "../shimgen_core.h"
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
    {"batch=1", "v0.so", kBatch1, false}, {"batch=1, seq=16", "v1.so", kBatch1Seq16, false}, {"seq=16", "v2.so", kSeq16, false}};
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
          false, 2, false, nullptr, ""};
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

}  // namespace

int main() {
  const std::vector<std::pair<const char*, std::function<void()>>> tests = {
      {"checks", test_checks}, {"dims_bind_across_inputs", test_dims_bind_across_inputs}, {"dispatch", test_dispatch},
      {"output_tree", test_output_tree}, {"output_tree_failure", test_output_tree_failure}, {"cpp_face_errors", test_cpp_face_errors},
  };
  for (const auto& [name, test] : tests) {
    const int before = g_failures;
    test();
    std::printf("%s %s\n", g_failures == before ? "ok" : "FAILED", name);
  }
  return g_failures == 0 ? 0 : 1;
}
