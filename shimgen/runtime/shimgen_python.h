// shimgen runtime, CPython face: a graph's extension module over the core (shimgen_core.h). One fast call
// (METH_FASTCALL: arguments bound without building tuples or dicts), every input checked, the GIL released while the
// kernels run, the outputs rebuilt in the model's structure; C++ exceptions become Python's.
#pragma once

#include <Python.h>

#include "shimgen_graph.h"

namespace shimgen::python {

// The extension module of `spec`'s graph (its PyInit_ returns this): a new reference, or nullptr with ImportError (or
// the error importing torch) set. `spec` lives as long as the process.
PyObject* create_module(const GraphSpec& spec);

}  // namespace shimgen::python
