// shimgen: a compiled model's entry points, those of the library that holds it. A graph's extension links its dynamic
// model; each specialized variant is a library of its own (its kernels and model class have the same names), which the
// extension loads with dlopen and reaches through this table alone (`shimgen_model_api`).
#pragma once

#include <torch/csrc/inductor/aoti_runtime/interface.h>

#include <string>
#include <vector>

#include "shimgen_weights.h"

namespace shimgen {

struct ModelApi {
  decltype(&AOTInductorModelContainerCreateWithDevice) create;
  decltype(&AOTInductorModelContainerDelete) destroy;
  decltype(&AOTInductorModelContainerRun) run;
  decltype(&AOTInductorModelContainerExtractConstantsMap) extract_constants_map;
  decltype(&AOTInductorModelContainerUpdateUserManagedConstantBuffer) update_user_managed_constants;
  decltype(&AOTInductorModelContainerSwapConstantBuffer) swap_constant_buffer;
  decltype(&AOTInductorModelContainerFreeInactiveConstantBuffer) free_inactive_constant_buffer;
  std::vector<Constant> (*constants)(const char* device);  // shimgen_model_constants.h
  AOTIProxyExecutorHandle (*ops)();  // the ops the model calls through the dispatcher, or nullptr
  std::string (*last_error)();        // the message of this thread's last failure in this library
};

// Where a variant's library is found: this symbol alone.
using ModelApiGetter = const ModelApi* (*)();
constexpr const char* kModelApiSymbol = "shimgen_model_api";

}  // namespace shimgen
