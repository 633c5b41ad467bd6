// Headers of every wrapper-side translation unit (AOTI interface, model, binding), precompiled once
// per toolchain and flag set. Python.h first, as Python requires.
#include <Python.h>

#include <ATen/core/TensorBase.h>
#include <c10/util/MaybeOwned.h>
#include <torch/csrc/inductor/aoti_include/cpu.h>
#include <torch/csrc/inductor/aoti_runtime/interface.h>
#include <torch/csrc/inductor/aoti_runtime/model_container.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include <iostream>
#include <string>
#include <unordered_map>
#include <vector>
