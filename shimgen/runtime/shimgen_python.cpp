// shimgen runtime, CPython face (shimgen_python.h).
#include "shimgen_python.h"

#include <ATen/Parallel.h>

#include <exception>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shimgen_core.h"
#include "shimgen_runtime.h"
#include "shimgen_tree.h"

namespace shimgen::python {

namespace {

// A graph's module: the core, and the Python objects its calls use (made at import). Never destroyed.
struct PyGraph {
  explicit PyGraph(const GraphSpec& s, const std::string& directory) : spec(s), core(s, directory) {}

  const GraphSpec& spec;
  Graph core;
  std::string validate_name, variant_name, validate_doc, variant_doc, input_list;
  PyMethodDef methods[9] = {};
  PyModuleDef def = {};
  PyObject* tensor_type = nullptr;
  std::vector<PyObject*> input_names;  // interned
  std::vector<PyObject*> out_keys;     // per node: its key in the parent (dict key or field name), or nullptr
  std::vector<PyObject*> object_kwnames;  // kKeyword: the names, as a call's keywords
  std::vector<PyObject*> object_make;     // the type, the fallback namedtuple or None; set on first use
  std::vector<char> object_own_type;      // object_make is the type itself (or its unflatten function)
  std::vector<PyObject*> object_context;  // kUnflatten: the context, unpickled on first use
  PyObject* module_name = nullptr;        // __module__ of the fallback namedtuples
  bool threads_warned = false;            // warn_of_threads said it (under the GIL)
};

PyGraph& graph_of(PyObject* module) { return **static_cast<PyGraph**>(PyModule_GetState(module)); }

std::string prefix(const GraphSpec& spec) { return std::string(spec.name) + "(): "; }

// Any C++ exception becomes Python's: InputError a TypeError or ValueError, Error (its message complete) and anything
// else (an allocation that fails: a RuntimeError naming the graph) a RuntimeError.
void set_error(const GraphSpec& spec) {
  try {
    throw;
  } catch (const InputError& e) {
    PyErr_SetString(e.type_error() ? PyExc_TypeError : PyExc_ValueError, e.what());
  } catch (const Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, (prefix(spec) + e.what_without_backtrace()).c_str());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, (prefix(spec) + e.what()).c_str());
  }
}

template <class Body>
PyObject* guarded(const GraphSpec& spec, Body body) {
  try {
    return body();
  } catch (...) {
    set_error(spec);
  }
  return nullptr;
}

bool bind_arguments(PyGraph& g, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** bound) {
  const GraphSpec& spec = g.spec;
  const Py_ssize_t num_inputs = static_cast<Py_ssize_t>(spec.num_inputs), num_positional = static_cast<Py_ssize_t>(spec.num_positional);
  if (nargs > num_positional) {
    PyErr_Format(PyExc_TypeError, "%s() takes %zd positional input%s but %zd were given", spec.name, num_positional,
                 num_positional == 1 ? "" : "s", nargs);
    return false;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) bound[i] = args[i];
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    Py_ssize_t slot = -1;
    for (Py_ssize_t i = 0; i < num_inputs && slot < 0; ++i) {
      if (key == g.input_names[i]) slot = i;
    }
    for (Py_ssize_t i = 0; i < num_inputs && slot < 0; ++i) {
      if (PyUnicode_Compare(key, g.input_names[i]) == 0) slot = i;
    }
    if (slot < 0) {
      PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U' (inputs: %s)", spec.name, key, g.input_list.c_str());
      return false;
    }
    if (bound[slot]) {
      PyErr_Format(PyExc_TypeError, "%s() got multiple values for input '%s'", spec.name, spec.inputs[slot].name);
      return false;
    }
    bound[slot] = args[nargs + k];
  }
  for (Py_ssize_t i = 0; i < num_inputs; ++i) {
    if (!bound[i]) {
      PyErr_Format(PyExc_TypeError, "%s() missing input '%s' (%s)", spec.name, spec.inputs[i].name, spec.inputs[i].signature);
      return false;
    }
  }
  return true;
}

// Binds and checks a call's arguments: `tensors` the inputs in spec order, `dim_values` each dim's size in this call.
// False with the exception set.
bool bind_and_check(PyGraph& g, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, const at::TensorBase** tensors,
                    int64_t* dim_values) {
  const GraphSpec& spec = g.spec;
  SmallArray<PyObject*> bound(spec.num_inputs);
  if (!bind_arguments(g, args, nargs, kwnames, bound.data())) return false;
  SmallArray<size_t> dim_source(spec.num_dims);
  for (size_t k = 0; k < spec.num_dims; ++k) dim_values[k] = -1;
  try {
    for (size_t i = 0; i < spec.num_inputs; ++i) {
      PyObject* obj = bound[i];
      if (!PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(g.tensor_type))) {
        PyErr_Format(PyExc_TypeError, "%s(): input '%s' must be a torch.Tensor (%s), got %s", spec.name, spec.inputs[i].name,
                     spec.inputs[i].signature, Py_TYPE(obj)->tp_name);
        return false;
      }
      tensors[i] = &unpack(obj);
      check_input(spec, i, *tensors[i], Py_TYPE(obj)->tp_name, dim_values, dim_source.data());
    }
    g.core.check_devices(tensors);
  } catch (...) {
    set_error(spec);
    return false;
  }
  return true;
}

// ---- outputs: the model's structure rebuilt (shimgen_tree.h's walk) ----

// The object `module`.`qualname`, or nullptr with an exception set.
PyObject* import_attribute(const char* module, const std::string& qualname) {
  PyObject* obj = PyImport_ImportModule(module);
  for (size_t start = 0; obj && start <= qualname.size();) {
    size_t end = qualname.find('.', start);
    if (end == std::string::npos) end = qualname.size();
    PyObject* next = PyObject_GetAttrString(obj, qualname.substr(start, end - start).c_str());
    Py_DECREF(obj);
    obj = next;
    start = end + 1;
  }
  return obj;
}

// The type object `module`.`qualname` (kUnflatten: its unflatten function, its context unpickled into object_context),
// or nullptr: with an exception set when importing or a lookup raised one.
PyObject* import_type(PyGraph& g, size_t i) {
  const OutObject& o = g.spec.objects[i];
  if (o.construct != kUnflatten) {
    PyObject* type = import_attribute(o.module, o.qualname);
    if (type && !PyType_Check(type)) Py_CLEAR(type);
    return type;
  }
  PyObject* fn = import_attribute(o.unflatten_module, o.unflatten_qualname);
  if (!fn) return nullptr;
  PyObject* base64 = PyImport_ImportModule("base64");
  PyObject* pickle = base64 ? PyImport_ImportModule("pickle") : nullptr;
  PyObject* pickled = pickle ? PyObject_CallMethod(base64, "b64decode", "s", o.context) : nullptr;
  PyObject* context = pickled ? PyObject_CallMethod(pickle, "loads", "O", pickled) : nullptr;
  Py_XDECREF(pickled);
  Py_XDECREF(pickle);
  Py_XDECREF(base64);
  if (!context) {
    Py_DECREF(fn);
    return nullptr;
  }
  g.object_context[i] = context;
  return fn;
}

// What object i falls back to: a namedtuple of the same name and fields, made once, or None where the fallback is a
// dict or a tuple.
PyObject* make_fallback(PyGraph& g, const OutObject& o) {
  if (o.fallback != kAsNamedTuple) {
    Py_INCREF(Py_None);
    return Py_None;
  }
  PyObject* fields = PyTuple_New(o.num_fields);
  if (!fields) return nullptr;
  for (int k = 0; k < o.num_fields; ++k) {
    PyObject* field = PyUnicode_FromString(o.names[k]);
    if (!field) {
      Py_DECREF(fields);
      return nullptr;
    }
    PyTuple_SET_ITEM(fields, k, field);
  }
  PyObject* collections = PyImport_ImportModule("collections");
  PyObject* made = collections ? PyObject_CallMethod(collections, "namedtuple", "sO", o.name, fields) : nullptr;
  Py_XDECREF(collections);
  Py_DECREF(fields);
  if (made && PyObject_SetAttrString(made, "__module__", g.module_name) < 0) Py_CLEAR(made);
  return made;
}

// Object i's type, imported on the first call that returns one, or its fallback where the type is never imported or
// its import fails (silently: a package runs where its types' library may not be installed). False, with the
// exception set, only for errors that are not Exceptions.
bool resolve_object(PyGraph& g, size_t i) {
  if (g.object_make[i]) return true;
  const OutObject& o = g.spec.objects[i];
  PyObject* type = nullptr;
  if (o.construct != kFallbackOnly && !(type = import_type(g, i)) && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return false;
    PyErr_Clear();
  }
  PyObject* make = type ? type : make_fallback(g, o);
  if (!make) return false;
  if (g.object_make[i]) {  // another thread resolved it while an import let go of the GIL
    Py_DECREF(make);
    return true;
  }
  g.object_make[i] = make;
  g.object_own_type[i] = type != nullptr;
  return true;
}

PyObject* construct(PyGraph& g, size_t i, PyObject* type, int arity, PyObject** args) {
  const OutObject& o = g.spec.objects[i];
  if (o.construct == kPositional) return PyObject_Vectorcall(type, args, arity, nullptr);
  if (o.construct == kUnflatten) {
    PyObject* children = PyList_New(arity);
    if (!children) return nullptr;
    for (int c = 0; c < arity; ++c) {
      Py_INCREF(args[c]);
      PyList_SET_ITEM(children, c, args[c]);
    }
    PyObject* made = PyObject_CallFunctionObjArgs(type, children, g.object_context[i], nullptr);
    Py_DECREF(children);
    return made;
  }
  if (o.construct == kSequence) {
    PyObject* seq = PyTuple_New(arity);
    if (!seq) return nullptr;
    for (int c = 0; c < arity; ++c) {
      Py_INCREF(args[c]);
      PyTuple_SET_ITEM(seq, c, args[c]);
    }
    PyObject* made = PyObject_CallOneArg(type, seq);
    Py_DECREF(seq);
    return made;
  }
  for (int d = 0; d < o.num_dropped; ++d) args[arity + d] = Py_None;
  return PyObject_Vectorcall(type, args, 0, g.object_kwnames[i]);
}

// The type was importable but its constructor now refuses what the build verified (another version of its library):
// warn once, and return the fallback from now on.
bool give_up_type(PyGraph& g, size_t i) {
  const OutObject& o = g.spec.objects[i];
  PyObject* error = nullptr;
#if PY_VERSION_HEX >= 0x030C0000
  error = PyErr_GetRaisedException();
#else
  PyObject *error_type = nullptr, *traceback = nullptr;
  PyErr_Fetch(&error_type, &error, &traceback);
  PyErr_NormalizeException(&error_type, &error, &traceback);
  Py_XDECREF(error_type);
  Py_XDECREF(traceback);
#endif
  const int warned = PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "%s(): %s.%s(...) raised %R; returning %s from now on", g.spec.name, o.module,
                                      o.qualname, error ? error : Py_None,
                                      o.fallback == kAsNamedTuple ? "a namedtuple of its fields"
                                      : o.fallback == kAsDict     ? "a dict of its fields"
                                                                  : "a tuple");
  Py_XDECREF(error);
  if (warned < 0) return false;
  PyObject* fallback = make_fallback(g, o);
  if (!fallback) return false;
  PyObject* type = g.object_make[i];
  g.object_make[i] = fallback;
  g.object_own_type[i] = false;
  Py_DECREF(type);
  return true;
}

PyObject* make_fallback_value(PyGraph& g, size_t i, int arity, PyObject** args, PyObject** keys) {
  const OutObject& o = g.spec.objects[i];
  if (o.fallback == kAsNamedTuple) return PyObject_Vectorcall(g.object_make[i], args, arity, nullptr);
  if (o.fallback == kAsDict) {
    PyObject* dict = PyDict_New();
    for (int c = 0; dict && c < arity; ++c) {
      if (PyDict_SetItem(dict, keys[c], args[c]) < 0) Py_CLEAR(dict);
    }
    return dict;
  }
  PyObject* tuple = PyTuple_New(arity);
  for (int c = 0; tuple && c < arity; ++c) {
    Py_INCREF(args[c]);
    PyTuple_SET_ITEM(tuple, c, args[c]);
  }
  return tuple;
}

// The Python objects of an output tree: tensors wrapped as they are reached, containers and objects made of their
// children (borrowed from build_tree).
struct PythonBuilder {
  PyGraph& g;
  at::TensorBase* outputs;

  PyObject* leaf(size_t i) { return wrap(std::move(outputs[i])); }
  bool ok(PyObject* value) const { return value != nullptr; }
  void release(PyObject* value) const { Py_DECREF(value); }

  PyObject* make(size_t node, PyObject** children, const size_t* child_nodes) {
    const OutNode& n = g.spec.out_nodes[node];
    switch (n.kind) {
      case kNone:
        Py_RETURN_NONE;
      case kTuple: {
        PyObject* seq = PyTuple_New(n.arity);
        for (int c = 0; seq && c < n.arity; ++c) {
          Py_INCREF(children[c]);
          PyTuple_SET_ITEM(seq, c, children[c]);
        }
        return seq;
      }
      case kList: {
        PyObject* seq = PyList_New(n.arity);
        for (int c = 0; seq && c < n.arity; ++c) {
          Py_INCREF(children[c]);
          PyList_SET_ITEM(seq, c, children[c]);
        }
        return seq;
      }
      case kDict: {
        PyObject* dict = PyDict_New();
        for (int c = 0; dict && c < n.arity; ++c) {
          if (PyDict_SetItem(dict, g.out_keys[child_nodes[c]], children[c]) < 0) Py_CLEAR(dict);
        }
        return dict;
      }
      case kObject: {
        const size_t i = static_cast<size_t>(n.object);
        const OutObject& o = g.spec.objects[i];
        SmallArray<PyObject*, 8> args(static_cast<size_t>(n.arity + o.num_dropped));
        SmallArray<PyObject*, 8> keys(static_cast<size_t>(n.arity));
        for (int c = 0; c < n.arity; ++c) {
          args[c] = children[c];
          keys[c] = g.out_keys[child_nodes[c]];
        }
        if (!resolve_object(g, i)) return nullptr;
        if (g.object_own_type[i]) {
          PyObject* made = construct(g, i, g.object_make[i], n.arity, args.data());
          if (made || !PyErr_ExceptionMatches(PyExc_Exception)) return made;
          if (!give_up_type(g, i)) return nullptr;
        }
        return make_fallback_value(g, i, n.arity, args.data(), keys.data());
      }
      default:
        PyErr_SetString(PyExc_RuntimeError, "shimgen: unknown output node");
        return nullptr;
    }
  }
};

// ---- the module's functions ----

// oneDNN repacks at every call a weight packed for another thread count: a call at another count than the build packed
// for says so once, as a RuntimeWarning (false where the warning was raised as an error).
bool warn_of_threads(PyGraph& g) {
  if (g.spec.packed_threads <= 0 || g.threads_warned) return true;
  const std::string message = threads_mismatch(g.spec, at::get_num_threads(), "torch.get_num_threads()");
  if (message.empty()) return true;
  g.threads_warned = true;
  return PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) == 0;
}

PyObject* run(PyGraph& g, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  const GraphSpec& spec = g.spec;
  SmallArray<const at::TensorBase*> tensors(spec.num_inputs);
  SmallArray<int64_t> dim_values(spec.num_dims);
  if (!bind_and_check(g, args, nargs, kwnames, tensors.data(), dim_values.data())) return nullptr;
  if (!warn_of_threads(g)) return nullptr;
  Model& model = g.core.prepare(tensors.data(), dim_values.data());
  SmallArray<at::TensorBase, 4> outputs(spec.num_outputs);
  std::exception_ptr error;
  Py_BEGIN_ALLOW_THREADS
  try {
    g.core.execute(model, tensors.data(), outputs.data());
  } catch (...) {
    error = std::current_exception();  // raised in Python once the GIL is back
  }
  Py_END_ALLOW_THREADS
  if (error) std::rethrow_exception(error);
  PythonBuilder builder{g, outputs.data()};
  return build_tree(spec, builder);
}

PyObject* call(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyGraph& g = graph_of(self);
  return guarded(g.spec, [&] { return run(g, args, nargs, kwnames); });
}

// _validate_<graph>(...): the call's argument binding and input checks alone.
PyObject* validate(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyGraph& g = graph_of(self);
  return guarded(g.spec, [&]() -> PyObject* {
    SmallArray<const at::TensorBase*> tensors(g.spec.num_inputs);
    SmallArray<int64_t> dim_values(g.spec.num_dims);
    if (!bind_and_check(g, args, nargs, kwnames, tensors.data(), dim_values.data())) return nullptr;
    Py_RETURN_NONE;
  });
}

// _variant_<graph>(...): the label of the model a call with these arguments runs ("" for the dynamic one).
PyObject* variant_of(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyGraph& g = graph_of(self);
  return guarded(g.spec, [&]() -> PyObject* {
    SmallArray<const at::TensorBase*> tensors(g.spec.num_inputs);
    SmallArray<int64_t> dim_values(g.spec.num_dims);
    if (!bind_and_check(g, args, nargs, kwnames, tensors.data(), dim_values.data())) return nullptr;
    const Model& m = g.core.model(pick_variant(g.spec, dim_values.data()));
    return PyUnicode_FromString(m.variant ? m.variant->label : "");
  });
}

// _set_weights(per_model): for the dynamic model, then each variant, the weights as the bytes of each constant (uint8),
// or None to keep one. The package's load_weights() checks names, dtypes and shapes first.
PyObject* set_weights(PyObject* self, PyObject* sequence) {
  PyGraph& g = graph_of(self);
  return guarded(g.spec, [&]() -> PyObject* {
    PyObject* models = PySequence_Fast(sequence, "_set_weights() takes a sequence of sequences of tensors, one per model");
    if (!models) return nullptr;
    std::vector<std::vector<at::TensorBase>> given;
    for (Py_ssize_t m = 0; m < PySequence_Fast_GET_SIZE(models); ++m) {
      PyObject* items = PySequence_Fast(PySequence_Fast_GET_ITEM(models, m), "_set_weights() takes a sequence of tensors per model");
      if (!items) {
        Py_DECREF(models);
        return nullptr;
      }
      given.emplace_back();
      for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items); ++i) {
        PyObject* item = PySequence_Fast_GET_ITEM(items, i);
        given.back().push_back(item == Py_None ? at::TensorBase() : unpack(item));
      }
      Py_DECREF(items);
    }
    Py_DECREF(models);
    // Without the GIL: a call in flight may need it to finish. The tensors released after hold Python's.
    std::vector<WeightSet> retired;
    std::exception_ptr error;
    Py_BEGIN_ALLOW_THREADS
    try {
      g.core.set_weights(given, retired);
    } catch (...) {
      error = std::current_exception();
    }
    Py_END_ALLOW_THREADS
    if (error) std::rethrow_exception(error);
    Py_RETURN_NONE;
  });
}

// _state_group(): the capsule of this extension's state group; _join_state_group(capsule): share another's (at import,
// before any call).
PyObject* state_group(PyObject* self, PyObject*) {
  PyGraph& g = graph_of(self);
  if (!g.core.stateful()) Py_RETURN_NONE;
  return PyCapsule_New(g.core.state_group(), kStateGroupCapsule, nullptr);
}

PyObject* join_state_group(PyObject* self, PyObject* capsule) {
  auto* group = static_cast<StateGroup*>(PyCapsule_GetPointer(capsule, kStateGroupCapsule));
  if (!group) return nullptr;
  graph_of(self).core.join_state_group(group);
  Py_RETURN_NONE;
}

// _state(): {constant name: the tensor the dynamic model reads and writes} for the state it mutates (on the GPU where
// the model runs there; empty before the first call made it).
PyObject* state_tensors(PyObject* self, PyObject*) {
  PyGraph& g = graph_of(self);
  return guarded(g.spec, [&]() -> PyObject* {
    PyObject* result = PyDict_New();
    if (!result || !g.core.stateful()) return result;
    for (auto& [name, value] : g.core.state_of(g.core.model(0))) {
      PyObject* tensor = wrap(std::move(value));
      if (!tensor || PyDict_SetItemString(result, name.c_str(), tensor) < 0) {
        Py_XDECREF(tensor);
        Py_DECREF(result);
        return nullptr;
      }
      Py_DECREF(tensor);
    }
    return result;
  });
}

// _with_state_lock(fn): fn() while no call of the state group runs (reading or resetting the state).
PyObject* with_state_lock(PyObject* self, PyObject* fn) {
  PyGraph& g = graph_of(self);
  if (!g.core.stateful()) return PyObject_CallNoArgs(fn);
  std::unique_lock<std::mutex> turn(g.core.state_group()->calls, std::defer_lock);
  Py_BEGIN_ALLOW_THREADS
  turn.lock();
  Py_END_ALLOW_THREADS
  return PyObject_CallNoArgs(fn);
}

void free_module(void* module) {
  PyGraph** state = static_cast<PyGraph**>(PyModule_GetState(static_cast<PyObject*>(module)));
  if (state && *state) (*state)->core.destroy_containers();
}

template <class F>
PyCFunction fastcall(F f) {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(f));
}

// The Python objects a graph's calls use; false with the exception set.
bool init_objects(PyGraph& g) {
  const GraphSpec& spec = g.spec;
  PyObject* torch = PyImport_ImportModule("torch");
  if (!torch) return false;
  g.tensor_type = PyObject_GetAttrString(torch, "Tensor");
  Py_DECREF(torch);
  if (!g.tensor_type) return false;
  for (size_t i = 0; i < spec.num_inputs; ++i) {
    PyObject* name = PyUnicode_InternFromString(spec.inputs[i].name);
    if (!name) return false;
    g.input_names.push_back(name);
    g.input_list += (i ? ", " : "") + std::string(spec.inputs[i].name);
  }
  g.out_keys.assign(spec.num_out_nodes, nullptr);
  for (size_t i = 0; i < spec.num_out_nodes; ++i) {
    const OutNode& n = spec.out_nodes[i];
    if (n.key && !(g.out_keys[i] = n.int_key ? PyLong_FromString(n.key, nullptr, 10) : PyUnicode_InternFromString(n.key))) return false;
  }
  g.object_kwnames.assign(spec.num_objects, nullptr);
  g.object_make.assign(spec.num_objects, nullptr);
  g.object_own_type.assign(spec.num_objects, 0);
  g.object_context.assign(spec.num_objects, nullptr);
  for (size_t i = 0; i < spec.num_objects; ++i) {
    const OutObject& o = spec.objects[i];
    if (o.construct != kKeyword) continue;
    if (!(g.object_kwnames[i] = PyTuple_New(o.num_fields + o.num_dropped))) return false;
    for (int k = 0; k < o.num_fields + o.num_dropped; ++k) {
      PyObject* name = PyUnicode_InternFromString(o.names[k]);
      if (!name) return false;
      PyTuple_SET_ITEM(g.object_kwnames[i], k, name);
    }
  }
  g.validate_name = std::string("_validate_") + spec.name;
  g.variant_name = std::string("_variant_") + spec.name;
  g.validate_doc = "Check arguments as " + std::string(spec.name) + "() does, without running the model.";
  g.variant_doc = "The specialized variant a call of " + std::string(spec.name) +
                  "() with these arguments runs, as 'dim=size, ...', or '' for the dynamic model.";
  const int keywords = METH_FASTCALL | METH_KEYWORDS;
  PyMethodDef* m = g.methods;
  *m++ = {spec.name, fastcall(call), keywords, spec.docstring};
  *m++ = {g.validate_name.c_str(), fastcall(validate), keywords, g.validate_doc.c_str()};
  *m++ = {g.variant_name.c_str(), fastcall(variant_of), keywords, g.variant_doc.c_str()};
  *m++ = {"_set_weights", set_weights, METH_O, "Replace the weights (the package's load_weights() checks them first)."};
  *m++ = {"_state_group", state_group, METH_NOARGS, "The state group this graph's calls take turns in (a capsule), or None."};
  *m++ = {"_join_state_group", join_state_group, METH_O, "Share another graph's state group (at import)."};
  *m++ = {"_state", state_tensors, METH_NOARGS, "The state tensors the model reads and writes, by constant name."};
  *m++ = {"_with_state_lock", with_state_lock, METH_O, "Call a function while no call of the state group runs."};
  *m = {nullptr, nullptr, 0, nullptr};
  g.def = {PyModuleDef_HEAD_INIT, spec.module, nullptr, sizeof(PyGraph*), g.methods, nullptr, nullptr, nullptr, free_module};
  return true;
}

}  // namespace

PyObject* create_module(const GraphSpec& spec) {
  // One PyGraph per graph for the life of the process: importing the extension again gets a module over the same one.
  static std::unordered_map<const GraphSpec*, PyGraph*>& graphs = *new std::unordered_map<const GraphSpec*, PyGraph*>;
  PyGraph*& g = graphs[&spec];
  if (!g) {
    PyGraph* made = nullptr;
    try {
      made = new PyGraph(spec, directory_of(reinterpret_cast<const void*>(&create_module)));
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_ImportError, e.what());
      return nullptr;
    }
    if (!init_objects(*made)) return nullptr;  // leaked with what it made: the import failed
    g = made;
  }
  try {
    g->core.create_containers();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ImportError, e.what());
    return nullptr;
  }
  PyObject* module = PyModule_Create(&g->def);
  if (!module) return nullptr;
  *static_cast<PyGraph**>(PyModule_GetState(module)) = g;
  if (!g->module_name && !(g->module_name = PyModule_GetNameObject(module))) Py_CLEAR(module);
  return module;
}

}  // namespace shimgen::python
