// shimgen runtime: the torch <-> Python conversions a generated binding needs.
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

namespace shimgen {

// The C++ tensor of a torch.Tensor (or subclass) object; valid while the object lives.
const at::TensorBase& unpack(PyObject* tensor);

// A new handle owning one more reference to `tensor`; AOTInductor steals it.
AtenTensorHandle new_handle(const at::TensorBase& tensor);

// The handle's tensor, the handle freed.
at::TensorBase take(AtenTensorHandle handle);

// A new torch.Tensor object for `tensor`.
PyObject* wrap(at::TensorBase&& tensor);

inline PyObject* wrap_and_free(AtenTensorHandle handle) { return wrap(take(handle)); }

inline std::string shape_text(c10::IntArrayRef sizes) {
  std::string s = "(";
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(sizes[i]);
  }
  return s + (sizes.size() == 1 ? ",)" : ")");
}

inline std::string device_text(const at::TensorBase& t) {
  return t.device().str();
}

}  // namespace shimgen
