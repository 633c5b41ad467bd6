// Headers of the translation units over shimgen's runtime (a graph's binding, a model library's entry point, the C++
// package's front door), precompiled once per toolchain and flag set. Not the wrapper's: g++ instantiates the
// templates that AOTInductor's model and container headers use again in every translation unit that includes their
// precompiled form (about 2 s each), and these files use neither. Python.h first, as Python requires.
#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/TensorBase.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/inductor/aoti_runtime/interface.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>
