// shimgen runtime: the torch <-> Python conversions the CPython face needs.
//
// Declared here, defined in shimgen_runtime.cpp through torch's own functions (THPVariable_Unpack,
// THPVariable_Wrap, AOTInductor's handle helpers). Only the runtime library includes torch's
// Python headers, which cost 10-20 s to compile: it is built once per toolchain in the per-user
// cache, and every package links it.
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
