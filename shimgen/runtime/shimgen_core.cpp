// shimgen runtime core (shimgen_core.h). Built once per toolchain and device: with SHIMGEN_CUDA, the GPU's paths
// (containers made on the first call's GPU, device copies of the weights and state, CUDA graphs) are compiled in.
#include "shimgen_core.h"

#include <dlfcn.h>

#include <optional>
#include <unordered_map>

#include "shimgen_handles.h"

#ifdef SHIMGEN_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include "shimgen_cuda_graph.h"
#endif

namespace shimgen {

namespace {

std::string prefix(const GraphSpec& spec) { return std::string(spec.name) + "(): "; }

std::string input_prefix(const GraphSpec& spec, size_t i) { return prefix(spec) + "input '" + spec.inputs[i].name + "'"; }

[[noreturn]] void fail_input(bool type_error, const std::string& message) { throw InputError(type_error, message); }

void check_tensor(const GraphSpec& spec, size_t i, const at::TensorBase& t, const char* type_name, int64_t* dim_values,
                  size_t* dim_source) {
  const InputSpec& in = spec.inputs[i];
  // Messages are made only where a check fails: a call that passes allocates nothing here.
  auto input = [&] { return input_prefix(spec, i); };
  if (!t.defined() || t.layout() != c10::Layout::Strided || t.is_nested()) {
    const std::string got = !t.defined() ? "an undefined tensor" : t.is_nested() ? "a nested tensor" : "layout " + c10::str(t.layout());
    fail_input(true, input() + " must be a dense (strided) tensor, got " + got);
  }
  if (t.scalar_type() != in.dtype) {
    fail_input(true, input() + " has dtype " + dtype_name(t.scalar_type()) + ", expected " + dtype_name(in.dtype));
  }
  if (t.device().type() != (spec.cuda ? c10::DeviceType::CUDA : c10::DeviceType::CPU)) {
    fail_input(false, input() + " is on " + device_text(t) + "; this package was built for " + spec.target_ids);
  }
  if (t.dim() != in.rank) {
    fail_input(false, input() + " must have " + std::to_string(in.rank) + " dims " + in.signature + ", got shape " + shape_text(t.sizes()));
  }
  const c10::IntArrayRef sizes = t.sizes();
  for (int64_t d = 0; d < in.rank; ++d) {
    const int64_t size = sizes[d];
    auto dim_text = [&] { return " dim " + std::to_string(d); };
    if (in.sizes[d] != kStatic) {
      if (size != in.sizes[d]) {
        fail_input(false, input() + dim_text() + " must be " + std::to_string(in.sizes[d]) + " (" + in.signature + "), got shape " +
                              shape_text(sizes));
      }
      continue;
    }
    const int64_t k = in.dims[d];
    const DimSpec& dim = spec.dims[k];
    auto named = [&] { return input() + dim_text() + " ('" + dim.name + "')"; };
    if (size < dim.min || size > dim.max) {
      fail_input(false, named() + " must be in [" + std::to_string(dim.min) + ", " + std::to_string(dim.max) + "], got " + std::to_string(size));
    }
    if (size % dim.multiple_of != 0) {
      fail_input(false, named() + " must be a multiple of " + std::to_string(dim.multiple_of) + ", got " + std::to_string(size));
    }
    if (dim_values[k] < 0) {
      dim_values[k] = size;
      dim_source[k] = i;
    } else if (dim_values[k] != size) {
      fail_input(false, named() + " is " + std::to_string(size) + " but input '" + spec.inputs[dim_source[k]].name + "' has " + dim.name +
                            " = " + std::to_string(dim_values[k]));
    }
  }
  if (!t.is_contiguous(in.memory_format)) {
    const bool contiguous = in.memory_format == c10::MemoryFormat::Contiguous;
    fail_input(false, input() + " must be " + (contiguous ? "contiguous" : "channels_last") + " in memory (strides " +
                          shape_text(t.strides()) + "); call " +
                          (contiguous ? ".contiguous()" : ".contiguous(memory_format=torch.channels_last)") + " first");
  }
  if (!t.has_storage() || t.key_set().has(c10::DispatchKey::Python)) {
    fail_input(true, input() + " is a " + type_name +
                         ", a tensor subclass whose data lives in Python (__torch_dispatch__); pass a plain tensor");
  }
}

}  // namespace

const char* dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "torch.float32";
    case c10::ScalarType::Double: return "torch.float64";
    case c10::ScalarType::Half: return "torch.float16";
    case c10::ScalarType::BFloat16: return "torch.bfloat16";
    case c10::ScalarType::Long: return "torch.int64";
    case c10::ScalarType::Int: return "torch.int32";
    case c10::ScalarType::Short: return "torch.int16";
    case c10::ScalarType::Char: return "torch.int8";
    case c10::ScalarType::Byte: return "torch.uint8";
    case c10::ScalarType::Bool: return "torch.bool";
    default: return c10::toString(t);
  }
}

// torch raises C++ exceptions where a tensor cannot answer (a subclass whose sizes live in Python): they become the
// input's TypeError.
void check_input(const GraphSpec& spec, size_t i, const at::TensorBase& t, const char* type_name, int64_t* dim_values,
                 size_t* dim_source) {
  std::string error;
  try {
    check_tensor(spec, i, t, type_name, dim_values, dim_source);
    return;
  } catch (const InputError&) {
    throw;
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = e.what();
  }
  fail_input(true, input_prefix(spec, i) + " (a " + type_name + ") cannot be read as a dense tensor: " + error);
}

std::string threads_mismatch(const GraphSpec& spec, int threads, const char* source) {
  const int packed = spec.packed_threads;
  if (packed <= 0 || threads == packed) return "";
  const std::string at = std::to_string(threads), as = std::to_string(packed);
  return std::string(spec.name) + "(): called at " + at + " threads (" + source +
         "), but its oneDNN weights are packed for " + as +
         ": where oneDNN's layout follows the threads (on some CPUs), each call repacks them, much slower. Build for " +
         at + " threads ([[target]] threads = " + at + ") or call at " + as + ".";
}

size_t pick_variant(const GraphSpec& spec, const int64_t* dim_values) {
  size_t best = 0, best_fixed = 0;
  for (size_t v = 0; v < spec.num_variants; ++v) {
    const int64_t* sizes = spec.variants[v].dim_sizes;
    bool match = true;
    size_t fixed = 0;
    for (size_t d = 0; d < spec.num_dims && match; ++d) {
      match = sizes[d] < 0 || sizes[d] == dim_values[d];
      fixed += sizes[d] >= 0;
    }
    if (match && (best == 0 || fixed > best_fixed)) {
      best = v + 1;
      best_fixed = fixed;
    }
  }
  return best;
}

void WeightSet::delete_handles() {
  for (AtenTensorHandle h : handles) aoti_torch_delete_tensor_object(h);
  handles.clear();
}

std::string Model::label() const { return variant ? std::string(" (") + variant->label + ")" : std::string(); }

std::string directory_of(const void* address) {
  Dl_info self;
  if (!dladdr(address, &self) || !self.dli_fname) return {};
  std::string directory = self.dli_fname;
  directory.resize(directory.rfind('/') + 1);
  return directory;
}

Graph::Graph(const GraphSpec& spec, const std::string& directory) : spec_(spec) {
  models_.reserve(1 + spec.num_variants);
  models_.emplace_back();
  models_.back().api = spec.linked;
  for (size_t v = 0; v < spec.num_variants; ++v) {
    const VariantInfo& info = spec.variants[v];
    const std::string path = directory + info.library;
    // RTLD_LOCAL: each variant's model class and kernels have the names of every other's.
    void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    auto getter = library ? reinterpret_cast<ModelApiGetter>(dlsym(library, kModelApiSymbol)) : nullptr;
    if (!getter) {
      const char* error = dlerror();
      throw Error(std::string(spec.module) + ": cannot load the variant for " + info.label + " (" + path + "): " + (error ? error : "") +
                  "; reinstall the package");
    }
    models_.emplace_back();
    models_.back().api = getter();
    models_.back().variant = &info;
  }
  // Never destroyed by the Graph: another extension may share it (the C++ package frees its own).
  if (stateful()) state_ = new StateGroup;
  if (spec.keep_buffers && !spec.cuda) {
    for (Model& m : models_) m.buffers = std::make_unique<BufferPool>();
  }
#ifdef SHIMGEN_CUDA
  if (spec.cuda && spec.cuda_graphs) {
    for (Model& m : models_) {
      if (m.variant ? m.variant->captured : spec.num_dims == 0) m.captured = new CapturedModel;
    }
  }
#endif
}

Graph::~Graph() {
  if (spec_.cuda && device_.load() >= 0) {
    new std::vector<Model>(std::move(models_));  // left to process exit (shimgen_core.h)
    return;
  }
#ifdef SHIMGEN_CUDA
  for (Model& m : models_) delete m.captured;  // never captured: no call made the containers
#endif
  destroy_containers();
  for (Model& m : models_) m.weights.delete_handles();
}

int32_t Graph::instances(const Model& m) const {
  if (stateful()) return 1;        // its calls run one at a time: more instances would only hold more memory
  if (m.captured) return 1;        // a captured graph replays one instance
  return spec_.instances;
}

bool Graph::is_state(const std::string& fqn) const {
  for (const char* const* name = spec_.state; name && *name; ++name) {
    if (fqn == *name) return true;
  }
  return false;
}

std::string Graph::device_string() const { return spec_.cuda ? "cuda:" + std::to_string(device_.load()) : "cpu"; }

void Graph::create_containers() {
  if (spec_.cuda) return;
  for (Model& m : models_) {
    if (m.container) continue;
    if (m.api->create(&m.container, instances(m), "cpu", nullptr) != AOTI_RUNTIME_SUCCESS) {
      throw Error(std::string(spec_.module) + ": could not create the compiled model" + m.label() + ": " + m.api->last_error());
    }
  }
}

void Graph::destroy_containers() {
  if (spec_.cuda) return;  // left to process exit: at interpreter shutdown the CUDA context may already be gone
  for (Model& m : models_) {
    if (m.container) m.api->destroy(m.container);
    m.container = nullptr;
  }
}

void Graph::check(const at::TensorBase* const* inputs, const char* const* type_names, int64_t* dim_values) const {
  SmallArray<size_t> dim_source(spec_.num_dims);
  for (size_t k = 0; k < spec_.num_dims; ++k) dim_values[k] = -1;
  for (size_t i = 0; i < spec_.num_inputs; ++i) check_input(spec_, i, *inputs[i], type_names[i], dim_values, dim_source.data());
  check_devices(inputs);
}

void Graph::check_devices(const at::TensorBase* const* inputs) const {
  if (!spec_.cuda || spec_.num_inputs == 0) return;
  const c10::Device device = inputs[0]->device();
  for (size_t i = 1; i < spec_.num_inputs; ++i) {
    if (inputs[i]->device() != device) {
      fail_input(false, input_prefix(spec_, i) + " is on " + device_text(*inputs[i]) + " but input '" + spec_.inputs[0].name + "' is on " +
                            device.str() + "; all inputs must be on one GPU");
    }
  }
  const int32_t loaded = device_.load();
  if (loaded >= 0 && device.index() != loaded) {
    fail_input(false, prefix(spec_) + "inputs are on " + device.str() + ", but this callable's model was loaded on cuda:" +
                          std::to_string(loaded) + " by its first call and serves that GPU only");
  }
}

Model& Graph::prepare(const at::TensorBase* const* inputs, const int64_t* dim_values) {
  if (spec_.weights_in_file && !weights_given_) {
    throw Error(prefix(spec_) + spec_.no_weights);
  }
#ifdef SHIMGEN_CUDA
  if (spec_.cuda) {
    const int32_t device = inputs[0]->device().index();
    // A thread's first call makes the GPU's primary context current in it: Inductor's kernels are launched through the
    // CUDA driver API, which needs a current context, and a thread that never called the CUDA runtime has none
    // ("invalid device context"). The caller's current device stays as it was.
    thread_local bool ready = false;
    if (!ready) {
      const c10::DeviceIndex previous = c10::cuda::current_device();
      c10::cuda::SetDevice(static_cast<c10::DeviceIndex>(device), /*force=*/true);
      if (previous != device) c10::cuda::SetDevice(previous, /*force=*/true);
      ready = true;
    }
    ensure_containers(device);
    if (device_.load() != device) check_devices(inputs);  // another thread's first call made them on its GPU
  }
#else
  (void)inputs;
  if (spec_.cuda) throw Error(prefix(spec_) + "this runtime library was built without CUDA");
#endif
  return models_[pick_variant(spec_, dim_values)];
}

void Graph::execute(Model& model, const at::TensorBase* const* inputs, at::TensorBase* outputs) {
  const size_t num_inputs = spec_.num_inputs, num_outputs = spec_.num_outputs;
  std::unique_lock<std::mutex> turn = stateful() ? std::unique_lock<std::mutex>(state_->calls) : std::unique_lock<std::mutex>();
#ifdef SHIMGEN_CUDA
  const int32_t device = spec_.cuda ? device_.load() : 0;
  if (model.captured) {
    SmallArray<at::Tensor> results(num_outputs);
    std::vector<at::Tensor> state;
    if (!model.captured->captured()) {
      for (auto& named : state_of(model)) state.emplace_back(std::move(named.second));
    }
    const std::string error = model.captured->call(
        inputs, num_inputs, results.data(), num_outputs, static_cast<c10::DeviceIndex>(device),
        [&model, num_inputs, num_outputs](AtenTensorHandle* in, AtenTensorHandle* out, void* run_stream) -> std::string {
          if (model.api->run(model.container, in, num_inputs, out, num_outputs, static_cast<AOTInductorStreamHandle>(run_stream),
                             model.api->ops()) == AOTI_RUNTIME_SUCCESS) {
            return {};
          }
          return model.api->last_error();
        },
        state);
    if (turn.owns_lock()) turn.unlock();
    if (!error.empty()) throw Error(prefix(spec_) + "the captured model" + model.label() + " failed: " + error);
    for (size_t i = 0; i < num_outputs; ++i) outputs[i] = std::move(results[i]);
    return;
  }
  void* stream = nullptr;
  std::optional<c10::cuda::CUDAGuard> device_guard;
  if (spec_.cuda) {
    aoti_torch_get_current_cuda_stream(device, &stream);
    device_guard.emplace(static_cast<c10::DeviceIndex>(device));
  }
#else
  void* stream = nullptr;
#endif
  SmallArray<AtenTensorHandle> in(num_inputs), out(num_outputs);
  for (size_t i = 0; i < num_inputs; ++i) in[i] = new_handle(*inputs[i]);
  BufferPool::Scope pooled(model.buffers.get());
  const AOTIRuntimeError status =
      model.api->run(model.container, in.data(), num_inputs, out.data(), num_outputs, static_cast<AOTInductorStreamHandle>(stream), model.api->ops());
  if (turn.owns_lock()) turn.unlock();
  if (status != AOTI_RUNTIME_SUCCESS) {
    for (size_t i = 0; i < num_outputs; ++i) {
      if (out[i]) aoti_torch_delete_tensor_object(out[i]);
    }
    throw Error(prefix(spec_) + "the compiled model" + model.label() + " failed: " + model.api->last_error());
  }
  for (size_t i = 0; i < num_outputs; ++i) outputs[i] = take(out[i]);
}

std::vector<at::Tensor> Graph::run(const std::vector<at::Tensor>& inputs) {
  if (inputs.size() != spec_.num_inputs) {
    throw InputError(true, prefix(spec_) + "takes " + std::to_string(spec_.num_inputs) + " input" + (spec_.num_inputs == 1 ? "" : "s") +
                               " but " + std::to_string(inputs.size()) + " were given");
  }
  SmallArray<const at::TensorBase*> tensors(spec_.num_inputs);
  SmallArray<const char*> type_names(spec_.num_inputs);
  for (size_t i = 0; i < spec_.num_inputs; ++i) {
    tensors[i] = &inputs[i];
    type_names[i] = "at::Tensor";
  }
  SmallArray<int64_t> dim_values(spec_.num_dims);
  check(tensors.data(), type_names.data(), dim_values.data());
  std::vector<at::TensorBase> outputs(spec_.num_outputs);
  try {
    execute(prepare(tensors.data(), dim_values.data()), tensors.data(), outputs.data());
  } catch (const c10::Error& e) {
    throw Error(prefix(spec_) + e.what_without_backtrace());
  }
  std::vector<at::Tensor> result;
  result.reserve(outputs.size());
  for (at::TensorBase& t : outputs) result.emplace_back(std::move(t));
  return result;
}

std::vector<std::pair<std::string, at::TensorBase>> Graph::state_of(const Model& m) const {
  std::vector<std::pair<std::string, at::TensorBase>> state;
  if (!stateful() || !m.container) return state;
  const std::vector<Constant> constants = m.api->constants(device_string().c_str());
  for (size_t i = 0; i < constants.size() && i < m.weights.handles.size(); ++i) {
    AtenTensorHandle view = nullptr;
    if (is_state(constants[i].fqn) && aoti_torch_new_tensor_handle(m.weights.handles[i], &view) == AOTI_TORCH_SUCCESS) {
      state.emplace_back(constants[i].name, take(view));
    }
  }
  return state;
}

// Device copies of the weights made by one replacement, by the bytes they copy: variants given the same weight share
// one copy on the GPU.
using DeviceCopies = std::unordered_map<const void*, at::TensorBase>;

at::TensorBase Graph::to_device(const at::TensorBase& bytes, void* copies_address) const {
  DeviceCopies& copies = *static_cast<DeviceCopies*>(copies_address);
  const int32_t device = device_.load();
  if (bytes.device().is_cuda() && bytes.device().index() == device) return bytes;
  if (auto it = copies.find(bytes.data_ptr()); it != copies.end() && it->second.numel() == bytes.numel()) return it->second;
  const int64_t size = bytes.numel(), stride = 1;
  AtenTensorHandle dst = nullptr;
  if (aoti_torch_empty_strided(1, &size, &stride, aoti_torch_dtype_uint8(), aoti_torch_device_type_cuda(), device, &dst) != AOTI_TORCH_SUCCESS) {
    throw std::runtime_error("out of GPU memory for the weights");
  }
  at::TensorBase result = take(dst);
  AtenTensorHandle src = new_handle(bytes), view = new_handle(result);
  const AOTITorchError copied = aoti_torch_copy_(view, src, 0);
  aoti_torch_delete_tensor_object(src);
  aoti_torch_delete_tensor_object(view);
  if (copied != AOTI_TORCH_SUCCESS) throw std::runtime_error("could not copy the weights to the GPU");
  copies.emplace(bytes.data_ptr(), result);
  return result;
}

// A state tensor's one copy on the GPU, shared by every graph of the state group; made from the host tensor the first time.
at::TensorBase Graph::state_on_device(const at::TensorBase& bytes) const {
  std::lock_guard<std::mutex> lock(state_->copies_mutex);
  DeviceCopies& copies = state_->device_copies;
  if (auto it = copies.find(bytes.data_ptr()); it != copies.end()) return it->second;
  return to_device(bytes, &copies);
}

// Makes `given` model m's weights (undefined: keep the current value, copied). The new set goes into the inactive
// buffer; the swap waits for calls in flight, which finish on the old weights, and frees them.
void Graph::apply_weights(Model& m, const std::vector<at::TensorBase>& given, WeightSet& retired, void* copies) {
  const ModelApi& api = *m.api;
  const std::string device = device_string();
  const int32_t device_index = spec_.cuda ? device_.load() : 0;
  const std::vector<Constant> constants = api.constants(device.c_str());
  if (given.size() != constants.size()) {
    throw std::runtime_error("expected " + std::to_string(constants.size()) + " weights, got " + std::to_string(given.size()));
  }
  const bool first = spec_.weights_in_file && !m.weights_applied;
  AOTInductorModelContainerHandle target = m.container;
  // A capture keeps the container's CUDA events and the weights' addresses: new weights go into a new container, whose
  // first call captures afresh.
  if (m.captured && !first && api.create(&target, instances(m), device.c_str(), nullptr) != AOTI_RUNTIME_SUCCESS) {
    throw std::runtime_error(api.last_error());
  }
  const bool use_inactive = !first && (!m.captured || !spec_.weights_in_file);  // a new container has its embedded weights, or none
  std::unordered_map<std::string, AtenTensorHandle> current;  // by the weight's name, borrowed
  if (!first) api.extract_constants_map(m.container, reinterpret_cast<AOTInductorConstantMapHandle>(&current), false);
  WeightSet next;
  std::unordered_map<std::string, AtenTensorHandle> map;
  auto give_up = [&](const std::string& error) {
    next.delete_handles();
    retired.data = std::move(next.data);
    if (target != m.container) api.destroy(target);
    throw std::runtime_error(error);
  };
  for (size_t i = 0; i < constants.size(); ++i) {
    const Constant& c = constants[i];
    AtenTensorHandle handle = nullptr;
    AOTITorchError made = AOTI_TORCH_FAILURE;
    if (given[i].defined()) {
      at::TensorBase bytes = !spec_.cuda || c.device_type != aoti_torch_device_type_cuda() ? given[i]
                             : is_state(c.fqn)                                            ? state_on_device(given[i])
                                                                                          : to_device(given[i], copies);
      made = aoti_torch_create_tensor_from_blob_v2(bytes.data_ptr(), static_cast<int64_t>(c.shape.size()), c.shape.data(), c.stride.data(),
                                                   c.offset, c.dtype, c.device_type,
                                                   c.device_type == aoti_torch_device_type_cpu() ? 0 : device_index, &handle, c.layout,
                                                   c.opaque_metadata.data(), static_cast<int64_t>(c.opaque_metadata.size()));
      next.data.push_back(std::move(bytes));
    } else if (auto it = current.find(c.fqn); it != current.end()) {
      made = aoti_torch_clone(it->second, &handle);
    } else {
      give_up("weight '" + c.fqn + "' is missing");
    }
    if (made != AOTI_TORCH_SUCCESS) give_up("could not place weight '" + c.fqn + "'");
    next.handles.push_back(handle);
    map.emplace(c.name, handle);
  }
  auto map_handle = reinterpret_cast<AOTInductorConstantMapHandle>(&map);
  AOTIRuntimeError status = api.update_user_managed_constants(target, map_handle, use_inactive, true);
  if (status == AOTI_RUNTIME_SUCCESS && use_inactive) {
    status = api.swap_constant_buffer(target);
#ifdef SHIMGEN_CUDA
    if (spec_.cuda) c10::cuda::device_synchronize();  // kernels launched before the swap may still read the old weights
#endif
    if (status == AOTI_RUNTIME_SUCCESS) status = api.free_inactive_constant_buffer(target);
  }
  if (status != AOTI_RUNTIME_SUCCESS) give_up(api.last_error());
#ifdef SHIMGEN_CUDA
  if (target != m.container) {
    AOTInductorModelContainerHandle old = nullptr;
    m.captured->reset([&] {
      old = m.container;
      m.container = target;
    });
    c10::cuda::device_synchronize();  // replays launched before may still read the old weights
    api.destroy(old);
  }
#endif
  m.weights.delete_handles();
  retired.data = std::move(m.weights.data);
  m.weights = std::move(next);
  m.weights_applied = true;
}

// Every model's weights, `given[m]` for model m, under one lock: a replacement is not interleaved with another. Throws
// std::runtime_error with the bare reason, the model's label appended.
void Graph::apply_all_weights(const std::vector<std::vector<at::TensorBase>>& given, std::vector<WeightSet>& retired) {
  std::lock_guard<std::mutex> lock(weights_mutex_);
  DeviceCopies copies;
  retired.resize(models_.size());
  for (size_t m = 0; m < models_.size(); ++m) {
    try {
      apply_weights(models_[m], given[m], retired[m], &copies);
    } catch (const c10::Error& e) {
      throw std::runtime_error(e.what_without_backtrace() + models_[m].label());
    } catch (const std::exception& e) {
      throw std::runtime_error(e.what() + models_[m].label());
    }
  }
}

void Graph::set_weights(std::vector<std::vector<at::TensorBase>>& given, std::vector<WeightSet>& retired) {
  if (given.size() != models_.size()) {
    throw Error(prefix(spec_) + "_set_weights() needs the weights of " + std::to_string(models_.size()) + " models, got " +
                std::to_string(given.size()));
  }
  if (spec_.cuda) {
    std::lock_guard<std::mutex> lock(containers_mutex_);
    if (!containers_ready_.load()) {  // the containers are made by the first call, which applies these
      for (size_t m = 0; m < models_.size(); ++m) models_[m].pending = std::move(given[m]);
      weights_given_ = true;
      return;
    }
  }
  try {
    apply_all_weights(given, retired);
  } catch (const std::exception& e) {
    throw Error(prefix(spec_) + "could not load the weights: " + e.what());
  }
  weights_given_ = true;
}

// The containers are made on the first call's GPU, not at import: importing a package with a cuda target neither
// initializes CUDA nor takes GPU memory. The first calls of several threads make them once.
void Graph::ensure_containers(int32_t device) {
#ifndef SHIMGEN_CUDA
  throw Error(prefix(spec_) + "this runtime library was built without CUDA (device " + std::to_string(device) + ")");
#else
  if (containers_ready_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(containers_mutex_);
  if (containers_ready_.load()) return;
  const std::string device_str = "cuda:" + std::to_string(device);
  if (device_.load() < 0) {
    for (Model& m : models_) {
      CUDAGuardHandle guard = nullptr;  // AOTInductor makes the model's GPU current; the caller's comes back after
      aoti_torch_create_cuda_guard(device, &guard);
      const AOTIRuntimeError status = m.api->create(&m.container, instances(m), device_str.c_str(), nullptr);
      if (guard) aoti_torch_delete_cuda_guard(guard);
      if (status != AOTI_RUNTIME_SUCCESS) {
        m.container = nullptr;
        const std::string error = prefix(spec_) + "could not load the compiled model" + m.label() + " on " + device_str +
                                  ": " + m.api->last_error();
        for (Model& made : models_) {
          if (made.container) made.api->destroy(made.container);
          made.container = nullptr;
        }
        throw Error(error);
      }
    }
    device_ = device;
  }
  if (weights_given_) {  // no call is in flight on new containers; pending until placed (a failure retries)
    std::vector<std::vector<at::TensorBase>> pending;
    for (Model& m : models_) pending.push_back(m.pending);
    std::vector<WeightSet> retired;
    try {
      apply_all_weights(pending, retired);
    } catch (const std::exception& e) {
      throw Error(prefix(spec_) + "could not load the weights on " + device_str + ": " + e.what());
    }
    for (Model& m : models_) m.pending.clear();
  }
  containers_ready_.store(true, std::memory_order_release);
#endif
}

}  // namespace shimgen
