// The ops Inductor leaves to run time (custom ops, aten ops without a C shim), described as data: a graph's
// proxy_executor.cpp holds a table of ExternNode, read by the build from Inductor's `<hash>.wrapper.json`, and the core
// (shimgen_extern_ops.cpp) calls each through the dispatcher. AOTInductor's code passes a call's ints and tensors
// flattened, its output tensors last; everything else is a literal here. No torch C++ header: the generated file
// compiles in a fraction of a second.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace shimgen {

// One argument of an op call, in the schema's order. `index`: where its ints or tensors start in the call's arrays.
struct ExternArg {
  enum Kind : uint8_t {
    kNone,
    kTensor,
    kInt,
    kInts,             // `count` ints, as a list
    kTensors,          // `count` tensors, as a list
    kOptionalTensors,  // `count` items: the call's next tensor where flags[i], else None
    kFloat,            // `number`
    kBool,             // `integer` != 0
    kLiteralInt,       // `integer`
    kString,           // `text`
    kFloats,           // `count` of `numbers`
    kBools,            // `count` of `flags`
    kLiteralInts,      // `count` of `integers`
    kStrings,          // `count` of `texts`
    kScalarType,       // `text`: a c10::ScalarType's name ("Float")
    kMemoryFormat,     // `text`: a c10::MemoryFormat's name
    kLayout,           // `text`: a c10::Layout's name
    kDevice,           // `text`: the device type alone (the model's device is current while it runs)
  };
  Kind kind = kNone;
  int64_t index = 0;
  int64_t count = 0;
  int64_t integer = 0;
  double number = 0;
  const char* text = nullptr;
  const double* numbers = nullptr;
  const bool* flags = nullptr;
  const int64_t* integers = nullptr;
  const char* const* texts = nullptr;
};

// One result of an op call, in the schema's order, stored from `index` of the call's tensors (or ints).
struct ExternResult {
  enum Kind : uint8_t {
    kSkip,      // None, or an optional tensor traced as None: nothing stored
    kTensor,
    kTensors,   // a list of `count`
    kIntCheck,  // an int, which must equal the call's int (its traced value)
  };
  Kind kind = kSkip;
  int64_t index = 0;
  int64_t count = 0;
};

struct ExternNode {
  const char* name;  // 'ns::op'
  const char* overload;
  int num_ints;
  int num_tensors;
  size_t num_args;
  const ExternArg* args;
  size_t num_results;
  const ExternResult* results;
};

// The proxy executor for a graph's table, made on the first call and kept for the process (an op whose body is in
// Python is looked up on its first call, once its module is imported).
AOTIProxyExecutorHandle extern_ops(const ExternNode* nodes, size_t count);

// The message of this thread's last failed op call, once: AOTInductor reports the failure by the model's line.
std::string take_op_error();

}  // namespace shimgen
