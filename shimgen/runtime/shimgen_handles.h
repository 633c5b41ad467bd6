// shimgen runtime: tensors to and from AOTInductor's handles, through torch's own helpers; tensors in messages.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/TensorBase.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>

#include <string>
#include <utility>

namespace shimgen {

// A new handle owning one more reference to `tensor`; AOTInductor steals it.
inline AtenTensorHandle new_handle(const at::TensorBase& tensor) {
  return torch::aot_inductor::new_tensor_handle(at::Tensor(tensor));
}

// The handle's tensor, the handle freed.
inline at::TensorBase take(AtenTensorHandle handle) {
  at::TensorBase tensor = std::move(*torch::aot_inductor::tensor_handle_to_tensor_pointer(handle));
  aoti_torch_delete_tensor_object(handle);
  return tensor;
}

// For messages: "(2, 3)", "(5,)".
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
