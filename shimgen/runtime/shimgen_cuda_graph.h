// shimgen runtime, flags.cuda_graphs: the model captured into a CUDA graph on its first call, then
// replayed. Inputs are copied into the captured (static) input buffers and outputs copied out of
// the captured ones, so a returned tensor is never overwritten by a later call.
//
// Only bindings built with cuda_graphs include this: ATen's CUDA graph headers cost compile time.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include "shimgen_handles.h"

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace shimgen {

class CapturedModel {
 public:
  // run(inputs, outputs, stream): one model run on `stream`, AOTInductor's handle conventions. `state`: the tensors the
  // model updates in place, which the capture's uncaptured warm-up run must leave as they were.
  template <class Run>
  std::string call(const at::TensorBase* const* inputs, size_t num_inputs, at::Tensor* outputs, size_t num_outputs,
                   c10::DeviceIndex device, Run run, const std::vector<at::Tensor>& state = {}) {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      c10::cuda::CUDAGuard device_guard(device);
      c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device);
      if (!graph_) {
        std::string error = capture(inputs, num_inputs, num_outputs, device, current, run, state);
        if (!error.empty()) return error;
      } else {
        for (size_t i = 0; i < num_inputs; ++i) static_inputs_[i].copy_(at::Tensor(*inputs[i]), /*non_blocking=*/true);
      }
      graph_->replay();
      for (size_t i = 0; i < num_outputs; ++i) outputs[i] = static_outputs_[i].clone();
      return {};
    } catch (const std::exception& e) {
      return e.what();
    }
  }

  bool captured() const { return graph_ != nullptr; }

  // Drops the capture, calling `between` while no call runs: the next call captures again.
  template <class Between>
  void reset(Between between) {
    std::lock_guard<std::mutex> lock(mutex_);
    between();
    graph_.reset();
    static_inputs_.clear();
    static_outputs_.clear();
  }

 private:
  template <class Run>
  std::string capture(const at::TensorBase* const* inputs, size_t num_inputs, size_t num_outputs, c10::DeviceIndex device,
                      c10::cuda::CUDAStream current, Run run, const std::vector<at::Tensor>& state) {
    current.synchronize();
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device);
    c10::cuda::CUDAStreamGuard stream_guard(side);
    for (size_t i = 0; i < num_inputs; ++i) static_inputs_.push_back(at::Tensor(*inputs[i]).clone());
    // An uncaptured run first: it loads the kernels, which must not happen during capture. The replay after the capture
    // is the call's run, so the state the warm-up updates is put back.
    std::vector<at::Tensor> saved;
    for (const at::Tensor& t : state) saved.push_back(t.clone());
    std::vector<at::Tensor> warmup(num_outputs);
    std::string error = run_once(num_outputs, side, warmup.data(), run);
    for (size_t i = 0; i < state.size(); ++i) state[i].copy_(saved[i]);
    side.synchronize();
    if (!error.empty()) return error;
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    // Relaxed: AOTInductor's container queries its own events while picking a model instance.
    graph->capture_begin({0, 0}, cudaStreamCaptureModeRelaxed);
    static_outputs_.resize(num_outputs);
    error = run_once(num_outputs, side, static_outputs_.data(), run);
    graph->capture_end();
    side.synchronize();
    if (!error.empty()) return error;
    graph_ = std::move(graph);
    return {};
  }

  template <class Run>
  std::string run_once(size_t num_outputs, c10::cuda::CUDAStream stream, at::Tensor* outputs, Run run) {
    std::vector<AtenTensorHandle> in(static_inputs_.size()), out(num_outputs, nullptr);
    for (size_t i = 0; i < in.size(); ++i) {
      in[i] = new_handle(static_inputs_[i]);
    }
    std::string error = run(in.data(), out.data(), static_cast<void*>(stream.stream()));
    for (size_t i = 0; i < num_outputs; ++i) {
      if (!out[i]) continue;
      if (error.empty()) {
        outputs[i] = take(out[i]);
      } else {
        aoti_torch_delete_tensor_object(out[i]);
      }
    }
    return error;
  }

  std::mutex mutex_;
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  std::vector<at::Tensor> static_inputs_;
  std::vector<at::Tensor> static_outputs_;
};

}  // namespace shimgen
