// The CPython face's files as one translation unit (see shimgen_core_unity.cpp).
#include "shimgen_python.cpp"
#include "shimgen_runtime.cpp"
