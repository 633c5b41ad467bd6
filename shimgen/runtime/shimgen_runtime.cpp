// shimgen runtime library: shimgen_runtime.h's conversions, each a call into torch's own code.
#include "shimgen_runtime.h"

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>

namespace shimgen {

const at::TensorBase& unpack(PyObject* tensor) {
  return THPVariable_Unpack(tensor);
}

AtenTensorHandle new_handle(const at::TensorBase& tensor) {
  return torch::aot_inductor::new_tensor_handle(at::Tensor(tensor));
}

at::TensorBase take(AtenTensorHandle handle) {
  at::TensorBase tensor = std::move(*torch::aot_inductor::tensor_handle_to_tensor_pointer(handle));
  aoti_torch_delete_tensor_object(handle);
  return tensor;
}

PyObject* wrap(at::TensorBase&& tensor) {
  return THPVariable_Wrap(std::move(tensor));
}

}  // namespace shimgen
