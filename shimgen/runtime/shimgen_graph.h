// shimgen runtime: what a graph's generated code hands the runtime library. Data only (the graph's
// inputs, dims, outputs and variants) and the entry points of its linked model; light headers, so
// that a graph's generated translation units compile in a fraction of a second.
#pragma once

#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>

#include "shimgen_model_api.h"
#include "shimgen_variants.h"

namespace shimgen {

constexpr int64_t kStatic = -1;  // InputSpec::sizes: the size is a dynamic dim's (InputSpec::dims names it)

struct DimSpec {
  const char* name;
  int64_t min, max, multiple_of;
};

struct InputSpec {
  const char* name;
  c10::ScalarType dtype;
  c10::MemoryFormat memory_format;
  int64_t rank;
  const int64_t* sizes;   // per dim: the static size, or kStatic where `dims` names a dynamic dim
  const int64_t* dims;    // per dim: an index into GraphSpec::dims, or -1
  const char* signature;  // for messages: "float32[batch, 3, 224, 224]"
};

// The output's structure in preorder: every node, then its children. kTensor leaves take the model's outputs in order.
enum NodeKind : int { kTensor, kTuple, kList, kDict, kNone, kObject };
struct OutNode {
  int kind;         // NodeKind
  int arity;        // children
  const char* key;  // key in the parent dict or field name in the parent object, or nullptr
  int int_key;      // the dict key is an int, `key` its digits
  int object;       // kObject: its index in GraphSpec::objects
};

// kObject nodes (namedtuples, dataclasses, ModelOutputs...): rebuilt by calling their own type, imported on the first
// call that returns one, or where it is never imported or cannot be, as the fallback (shimgen/trace's OutType).
enum Construct : int { kFallbackOnly, kPositional, kKeyword, kSequence, kUnflatten };
enum Fallback : int { kAsNamedTuple, kAsDict, kAsTuple };
struct OutObject {
  const char* module;
  const char* qualname;
  const char* name;  // the fallback namedtuple's
  int construct;     // Construct
  int fallback;      // Fallback
  int num_fields, num_dropped;
  const char* const* names;      // the fields, then the fields that were None (passed as None)
  const char* unflatten_module;  // kUnflatten: the type's pytree unflatten function, called (children, context)
  const char* unflatten_qualname;
  const char* context;  // kUnflatten: its pytree context, pickled, base64
};

// One graph compiled for one target: everything the runtime needs to know of it.
struct GraphSpec {
  const char* name;        // the graph's, for messages: "forward(): ..."
  const char* module;      // the extension module's name: "_forward_cpu"
  const char* target_ids;  // for messages: "cpu-native and cuda-sm_90"
  bool cuda;               // the target's device: "cuda" (else "cpu")
  const InputSpec* inputs;
  size_t num_inputs, num_positional;  // the first num_positional inputs may come by position
  const DimSpec* dims;
  size_t num_dims;
  size_t num_outputs;  // the model's outputs: the tree's kTensor leaves
  const OutNode* out_nodes;
  size_t num_out_nodes;
  const OutObject* objects;
  size_t num_objects;
  const VariantInfo* variants;  // the specialized variants, each a library beside the extension
  size_t num_variants;
  const char* const* state;  // the constants (by weight name) the graph updates in place, nullptr-terminated
  bool weights_in_file;      // flags.weights "file" or "external": the library holds no weights; they are handed over
  const char* no_weights;    // what a call says where none were handed over yet (after "<name>(): ")
  int32_t instances;         // model instances per container: this many threads run the model at once
  bool cuda_graphs;          // flags.cuda_graphs on a cuda target: static models are replayed from CUDA graphs
  bool keep_buffers;         // runtime.keep_buffers on a CPU target: calls take large buffers from a pool (shimgen_buffers.h)
  int32_t packed_threads;    // CPU: the threads oneDNN's weights are packed for (0: none); other counts repack per call
  const ModelApi* linked;    // the dynamic model, linked into the extension
  const char* docstring;
};

}  // namespace shimgen
