// soft_clamp's CUDA kernel (schema, CPU and Meta kernels: shimgen_ops.cpp), compiled by nvcc for the spec's archs.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

namespace {

__global__ void soft_clamp_kernel(const float* __restrict__ in, float* __restrict__ out, float limit, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = limit * tanhf(in[i] / limit);
}

at::Tensor soft_clamp_cuda(const at::Tensor& x, double limit) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "soft_clamp: expected float32, got ", x.scalar_type());
  TORCH_CHECK(limit > 0, "soft_clamp: limit must be positive, got ", limit);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor in = x.contiguous();
  at::Tensor out = at::empty_like(in);
  const int64_t n = in.numel();
  if (n == 0) return out;
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  soft_clamp_kernel<<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(in.const_data_ptr<float>(), out.mutable_data_ptr<float>(),
                                                                               static_cast<float>(limit), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(shimgen_ops, CUDA, m) { m.impl("soft_clamp", soft_clamp_cuda); }
