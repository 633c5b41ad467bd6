// shimgen runtime: the torch <-> Python conversions the CPython face needs.
//
// Declared here, defined in shimgen_runtime.cpp through torch's own functions (THPVariable_Unpack,
// THPVariable_Wrap, AOTInductor's handle helpers). That one translation unit includes torch's
// Python headers, which cost 11-14 s to compile: the toolchain probe compiles it once per
// toolchain, loads it, and every package links the library it proved.
#pragma once

#include <Python.h>

#include <ATen/core/TensorBase.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include <string>

#include "shimgen_handles.h"

namespace shimgen {

// The C++ tensor of a torch.Tensor (or subclass) object; valid while the object lives.
const at::TensorBase& unpack(PyObject* tensor);

// A new torch.Tensor object for `tensor`.
PyObject* wrap(at::TensorBase&& tensor);

inline PyObject* wrap_and_free(AtenTensorHandle handle) { return wrap(take(handle)); }
}  // namespace shimgen
