// Included at the end of a graph's model.cpp, where Inductor's model class is complete.
#include "shimgen_weights.h"

std::vector<shimgen::Constant> shimgen::model_constants(const char* device) {
  using namespace torch::aot_inductor;
  AOTInductorModel model(std::make_shared<ConstantMap>(), std::make_shared<std::vector<ConstantHandle>>(), device, std::nullopt);
  std::vector<Constant> constants;
  for (int64_t i = 0; i < static_cast<int64_t>(model.num_constants()); ++i) {
    if (model.constant_from_folded(i)) continue;
    const size_t ndim = model.constant_ndim(i);
    const int64_t* shape = model.constant_shape(i);
    const int64_t* stride = model.constant_stride(i);
    const uint8_t* opaque = model.opaque_metadata(i);
    constants.push_back({model.constant_name(i), model.constant_original_fqn(i), model.constant_dtype(i), model.constant_layout(i),
                         model.constant_device_type(i), std::vector<int64_t>(shape, shape + ndim), std::vector<int64_t>(stride, stride + ndim),
                         static_cast<int64_t>(model.constant_offset(i)),
                         std::vector<uint8_t>(opaque, opaque + (opaque ? model.opaque_metadata_size(i) : 0))});
  }
  return constants;
}
