// shimgen: a graph's specialized variants (dims.<name>.specialize), as its variants.cpp lists them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shimgen {

struct VariantInfo {
  const char* name;           // its key in the graph's weights file ("variants")
  const char* label;          // for messages: "batch=1"
  const char* library;        // file name, in the package beside the extension
  const int64_t* dim_sizes;   // per dim of the graph: the size the variant was compiled for, or -1 where it is dynamic
  bool captured;              // flags.cuda_graphs and no dynamic dim: replayed from a CUDA graph
};

}  // namespace shimgen
