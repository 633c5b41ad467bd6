// shimgen runtime library: shimgen_runtime.h's conversions, each a call into torch's own code.
#include "shimgen_runtime.h"

#include <torch/csrc/autograd/python_variable.h>

namespace shimgen {

const at::TensorBase& unpack(PyObject* tensor) {
  return THPVariable_Unpack(tensor);
}

PyObject* wrap(at::TensorBase&& tensor) {
  return THPVariable_Wrap(std::move(tensor));
}

}  // namespace shimgen
