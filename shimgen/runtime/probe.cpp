// shimgen toolchain probe: proves that this compiler's torch extensions load and that the runtime
// library every package links (shimgen_runtime.h) round-trips tensors with the installed torch.
#include "shimgen_runtime.h"

#include <torch/csrc/inductor/aoti_runtime/model_base.h>

namespace {

// roundtrip(t) -> a new torch.Tensor sharing t's storage, made through an AOTInductor handle.
PyObject* roundtrip(PyObject*, PyObject* arg) {
  return shimgen::wrap_and_free(shimgen::new_handle(shimgen::unpack(arg)));
}

// empty(n) -> a float32 tensor of shape (n,) allocated through the AOTInductor C shim.
PyObject* empty(PyObject*, PyObject* arg) {
  int64_t size = PyLong_AsLongLong(arg);
  if (size < 0 && PyErr_Occurred()) return nullptr;
  int64_t stride = 1;
  AtenTensorHandle out = nullptr;
  if (aoti_torch_empty_strided(1, &size, &stride, aoti_torch_dtype_float32(), aoti_torch_device_type_cpu(), 0, &out)) {
    PyErr_SetString(PyExc_RuntimeError, "aoti_torch_empty_strided failed");
    return nullptr;
  }
  return shimgen::wrap_and_free(out);
}

// device("cuda:0") -> (device type, index) through AOTInductor's own parser: its std::regex is
// where libraries built by a compiler with another libstdc++ crash.
PyObject* device(PyObject*, PyObject* arg) {
  const char* text = PyUnicode_AsUTF8(arg);
  if (!text) return nullptr;
  int32_t type = -1, index = -1;
  try {
    torch::aot_inductor::parse_device_str(text, type, index);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  }
  return Py_BuildValue("(ii)", type, index);
}

PyMethodDef kMethods[] = {
    {"roundtrip", roundtrip, METH_O, nullptr},
    {"empty", empty, METH_O, nullptr},
    {"device", device, METH_O, nullptr},
    {nullptr, nullptr, 0, nullptr},
};
PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "shimgen_probe", nullptr, -1, kMethods};

}  // namespace

PyMODINIT_FUNC PyInit_shimgen_probe() { return PyModule_Create(&kModule); }
