// Included by a graph's model.cpp after Inductor's includes: AOTInductor's model base class, the same code for every
// graph of a toolchain and flag set, is compiled once into the prebuilt interface library (model_base.cpp there)
// instead of in every model.cpp, where it took about half of the compile time.
#pragma once
#include <torch/csrc/inductor/aoti_runtime/model.h>

#include "shimgen_regex_once.h"

extern template class torch::aot_inductor::AOTInductorModelBase<torch::aot_inductor::AOTInductorModel>;
