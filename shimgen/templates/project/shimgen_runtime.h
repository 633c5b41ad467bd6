// shimgen runtime: the few torch <-> Python conversions a generated binding needs.
//
// Deliberately avoids torch/csrc/autograd/python_variable.h and torch/extension.h (11-14 s per
// translation unit here): a torch.Tensor's C++ tensor is read through a mirror of THPVariable,
// and outputs go back to Python through THPVariable_Wrap, which libtorch_python exports.
// The package pins the exact torch it was built against, and the toolchain probe checks this
// layout by round-tripping a tensor before any real build.
#pragma once

#include <Python.h>

#include <ATen/core/TensorBase.h>
#include <c10/util/MaybeOwned.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include <string>

PyObject* THPVariable_Wrap(at::TensorBase&& var);  // defined in libtorch_python

namespace shimgen {

// Mirror of THPVariable (torch/csrc/autograd/python_variable.h); at::Tensor and at::TensorBase
// share one layout.
struct TorchVariable {
  PyObject_HEAD
#ifdef SHIMGEN_VARIABLE_MAYBE_OWNED
  c10::MaybeOwned<at::TensorBase> cdata;
  const at::TensorBase& tensor() const { return *cdata; }
#else
  at::TensorBase cdata;
  const at::TensorBase& tensor() const { return cdata; }
#endif
};

inline const at::TensorBase& unpack(PyObject* obj) {
  return reinterpret_cast<TorchVariable*>(obj)->tensor();
}

// A new handle owning one more reference to the tensor; AOTInductor steals it.
inline AtenTensorHandle new_handle(const at::TensorBase& t) {
  AtenTensorHandle out = nullptr;
  aoti_torch_new_tensor_handle(reinterpret_cast<AtenTensorHandle>(const_cast<at::TensorBase*>(&t)), &out);
  return out;
}

// Moves the handle's tensor into a new torch.Tensor and frees the handle.
inline PyObject* wrap_and_free(AtenTensorHandle handle) {
  PyObject* obj = THPVariable_Wrap(std::move(*reinterpret_cast<at::TensorBase*>(handle)));
  aoti_torch_delete_tensor_object(handle);
  return obj;
}

inline const char* dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "torch.float32";
    case c10::ScalarType::Double: return "torch.float64";
    case c10::ScalarType::Half: return "torch.float16";
    case c10::ScalarType::BFloat16: return "torch.bfloat16";
    case c10::ScalarType::Long: return "torch.int64";
    case c10::ScalarType::Int: return "torch.int32";
    case c10::ScalarType::Short: return "torch.int16";
    case c10::ScalarType::Char: return "torch.int8";
    case c10::ScalarType::Byte: return "torch.uint8";
    case c10::ScalarType::Bool: return "torch.bool";
    default: return c10::toString(t);
  }
}

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
