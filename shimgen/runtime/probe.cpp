// shimgen toolchain probe: proves that this compiler's torch extensions load and call into the installed torch
// through AOTInductor's C shim and runtime headers, as every generated package does. (The runtime library itself is
// built, with warnings as errors, and tested by every build's check of its package.)
#include <Python.h>

#include <torch/csrc/inductor/aoti_runtime/model_base.h>

namespace {

// empty(n) -> n, the size of a float32 tensor of shape (n,) allocated and freed through the AOTInductor C shim.
PyObject* empty(PyObject*, PyObject* arg) {
  int64_t size = PyLong_AsLongLong(arg);
  if (size < 0 && PyErr_Occurred()) return nullptr;
  int64_t stride = 1;
  AtenTensorHandle out = nullptr;
  if (aoti_torch_empty_strided(1, &size, &stride, aoti_torch_dtype_float32(), aoti_torch_device_type_cpu(), 0, &out)) {
    PyErr_SetString(PyExc_RuntimeError, "aoti_torch_empty_strided failed");
    return nullptr;
  }
  int64_t* sizes = nullptr;
  bool ok = aoti_torch_get_sizes(out, &sizes) == AOTI_TORCH_SUCCESS;
  int64_t got = ok ? sizes[0] : -1;
  aoti_torch_delete_tensor_object(out);
  if (!ok) {
    PyErr_SetString(PyExc_RuntimeError, "aoti_torch_get_sizes failed");
    return nullptr;
  }
  return PyLong_FromLongLong(got);
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
    {"empty", empty, METH_O, nullptr},
    {"device", device, METH_O, nullptr},
    {nullptr, nullptr, 0, nullptr},
};
PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "shimgen_probe", nullptr, -1, kMethods};

}  // namespace

PyMODINIT_FUNC PyInit_shimgen_probe() { return PyModule_Create(&kModule); }
