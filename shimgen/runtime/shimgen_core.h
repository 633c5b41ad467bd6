// shimgen runtime core: one graph's models run on at::Tensors, without Python. Argument checks, dims, variant dispatch,
// the instance pool (the AOTInductor container's), weights, state and CUDA graphs live here; the CPython face
// (shimgen_python.cpp) and C++ consumers both call it.
//
// Errors are exceptions carrying the message a caller shows as it is: InputError (a std::invalid_argument) for a bad
// input, Error (a std::runtime_error) for everything else.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/TensorBase.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "shimgen_buffers.h"
#include "shimgen_graph.h"
#include "shimgen_state.h"

namespace shimgen {

// A bad input. `type_error`: Python raises it as TypeError (a wrong kind of object or dtype), else as ValueError.
class InputError : public std::invalid_argument {
 public:
  InputError(bool type_error, const std::string& message) : std::invalid_argument(message), type_error_(type_error) {}
  bool type_error() const { return type_error_; }

 private:
  bool type_error_;
};

// Anything else that failed, its message complete ("forward(): the compiled model failed: ...").
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An array of n value-initialized elements on the stack where n <= N (every graph but the largest), else on the heap.
// The per-call scratch of both faces: a call allocates nothing for it, and initializes only the n elements it uses.
template <class T, size_t N = 16>
class SmallArray {
 public:
  explicit SmallArray(size_t n) : heap_(n > N ? new T[n]() : nullptr), data_(heap_ ? heap_.get() : inline_) {
    if (!heap_) {
      for (size_t i = 0; i < n; ++i) inline_[i] = T();
    }
  }
  SmallArray(const SmallArray&) = delete;
  SmallArray& operator=(const SmallArray&) = delete;
  T* data() { return data_; }
  T& operator[](size_t i) { return data_[i]; }

 private:
  T inline_[N];
  std::unique_ptr<T[]> heap_;
  T* data_;
};

// The name torch gives a dtype in Python: "torch.float32".
const char* dtype_name(c10::ScalarType t);

// Checks input i of `spec` (`type_name`: what the caller passed, for messages), and binds its dynamic dims:
// `dim_values[k]` is dim k's size once an input has it (-1 before), `dim_source[k]` that input. Throws InputError.
void check_input(const GraphSpec& spec, size_t i, const at::TensorBase& t, const char* type_name, int64_t* dim_values,
                 size_t* dim_source);

// The index of the model compiled for these dim sizes: 1 + the most specific variant (the most dims specialized; the
// first of those) whose every specialized dim matches, else 0, the dynamic model.
size_t pick_variant(const GraphSpec& spec, const int64_t* dim_values);

// What to tell a caller running `spec` at `threads` (as `source` reports them) where its oneDNN weights are packed for
// another count, which makes every call repack them; "" where the counts agree or the graph packs none.
std::string threads_mismatch(const GraphSpec& spec, int threads, const char* source);

// Weights the container uses that are not its own: the tensors holding their bytes, and the handles made over them
// (the container does not own user-managed handles).
struct WeightSet {
  std::vector<at::TensorBase> data;       // released by the caller that may need to (Python tensors: with the GIL)
  std::vector<AtenTensorHandle> handles;  // tensors over `data` or copies
  void delete_handles();
};

class CapturedModel;  // shimgen_cuda_graph.h, in the cuda runtime only

// One compiled model of the graph: the dynamic one, linked into the extension, or a specialized variant, a library of
// its own.
struct Model {
  const ModelApi* api = nullptr;
  const VariantInfo* variant = nullptr;  // nullptr: the dynamic model
  AOTInductorModelContainerHandle container = nullptr;
  WeightSet weights;
  bool weights_applied = false;
  std::vector<at::TensorBase> pending;  // cuda: weights given before the first call made the container
  CapturedModel* captured = nullptr;    // cuda_graphs: where the model is replayed from a CUDA graph; never destroyed
  std::unique_ptr<BufferPool> buffers;  // spec.keep_buffers: its calls' large buffers, kept for its next call

  std::string label() const;  // " (batch=1)" for a variant, "" for the dynamic model
};

// One graph's runtime. The CPython face makes one per process and never destroys it (another extension may share its
// state group); the C++ package destroys its own. Calls from several threads run at once; weights are replaced under a
// lock.
class Graph {
 public:
  // `directory`: where the variants' libraries are (the extension's); throws Error where one does not load. `spec`
  // must outlive the Graph.
  Graph(const GraphSpec& spec, const std::string& directory);
  // CPU: destroys the containers. A GPU's containers, once a call made them, are left to process exit with their
  // weights: at exit the CUDA context may be gone, and destroying them then fails. The state group is not freed.
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  const GraphSpec& spec() const { return spec_; }
  size_t num_models() const { return models_.size(); }
  const Model& model(size_t m) const { return models_[m]; }

  // CPU: makes the containers (a GPU's are made by the first call, on its device). Throws Error.
  void create_containers();
  // CPU: destroys them (the extension module is freed).
  void destroy_containers();

  // Checks all inputs (check_input for each, then check_devices) and returns the dims' sizes. Throws InputError.
  void check(const at::TensorBase* const* inputs, const char* const* type_names, int64_t* dim_values) const;
  // cuda: the inputs (each checked) are on one GPU, the one the containers are on once made. Throws InputError.
  void check_devices(const at::TensorBase* const* inputs) const;

  // The model a call with these (checked) inputs runs: on a GPU, made on the inputs' device by the first call, with
  // the weights given before. Throws Error.
  Model& prepare(const at::TensorBase* const* inputs, const int64_t* dim_values);

  // Runs `model` on the checked inputs (their order the spec's), its outputs into `outputs` (spec().num_outputs); a
  // stateful graph's calls take turns. Needs no GIL; throws Error.
  void execute(Model& model, const at::TensorBase* const* inputs, at::TensorBase* outputs);

  // The C++ face: check, prepare and execute, the outputs flattened (the Python pytree's leaf order). Throws
  // InputError or Error.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs);

  // Replaces the weights: `given[m]` for model m, one tensor of bytes (uint8) per constant in the model's order, or
  // undefined to keep one. Calls in flight finish on the old weights. The tensors no longer used end up in `retired`;
  // `given` is left for the caller to release. Throws Error.
  void set_weights(std::vector<std::vector<at::TensorBase>>& given, std::vector<WeightSet>& retired);
  bool weights_given() const { return weights_given_; }

  // The tensors model m updates in place (its state constants), by constant name: on the device it runs on.
  std::vector<std::pair<std::string, at::TensorBase>> state_of(const Model& m) const;
  bool stateful() const { return spec_.state && *spec_.state; }
  StateGroup* state_group() const { return state_; }
  void join_state_group(StateGroup* group) {
    if (stateful()) state_ = group;
  }

  int32_t device() const { return device_; }  // cuda: the GPU the containers were made on, or -1

 private:
  bool is_state(const std::string& fqn) const;
  int32_t instances(const Model& m) const;
  std::string device_string() const;
  void apply_weights(Model& m, const std::vector<at::TensorBase>& given, WeightSet& retired, void* copies);
  void apply_all_weights(const std::vector<std::vector<at::TensorBase>>& given, std::vector<WeightSet>& retired);
  void ensure_containers(int32_t device);
  at::TensorBase to_device(const at::TensorBase& bytes, void* copies) const;
  at::TensorBase state_on_device(const at::TensorBase& bytes) const;

  const GraphSpec& spec_;
  std::vector<Model> models_;  // [0]: the dynamic model; then the variants in spec order
  StateGroup* state_ = nullptr;
  std::mutex weights_mutex_;     // one replacement at a time
  std::mutex containers_mutex_;  // cuda: the first calls make the containers once; weights given meanwhile wait
  std::atomic<bool> weights_given_{false};
  std::atomic<bool> containers_ready_{false};  // cuda: made, with the weights given before
  std::atomic<int32_t> device_{-1};
};

// The directory (ending in '/') of the shared object that holds `address`, or "" where it is unknown.
std::string directory_of(const void* address);

}  // namespace shimgen
