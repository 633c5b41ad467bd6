// shimgen: a graph's constants (its weights), as Inductor's generated model class describes them, for
// the AOTInductor container's user-managed constant buffers (load_weights, flags.weights = "file").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shimgen {

struct Constant {
  std::string name;  // Inductor's
  std::string fqn;   // the weight's name in the model's state dict, or `name` for a constant Inductor made
  int32_t dtype, layout, device_type;
  std::vector<int64_t> shape, stride;
  int64_t offset;
  std::vector<uint8_t> opaque_metadata;  // oneDNN's description of a prepacked weight
};

// The constants the container takes (not those runtime constant folding computes), in the model's
// order, for a model on `device`. Defined at the end of model.cpp (shimgen_model_constants.h).
std::vector<Constant> model_constants(const char* device);

}  // namespace shimgen
