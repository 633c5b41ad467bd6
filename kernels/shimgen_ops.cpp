// Example custom ops for projects/custom_ops.toml: CPU kernels and Meta kernels (the shapes torch.export traces with).
// kernels/shimgen_cuda_ops.cu adds soft_clamp's CUDA kernel (projects/cuda_ops.toml).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>

namespace {

// limit * tanh(x / limit): a clamp to (-limit, limit) with a smooth edge.
at::Tensor soft_clamp_cpu(const at::Tensor& x, double limit) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "soft_clamp: expected float32, got ", x.scalar_type());
  TORCH_CHECK(limit > 0, "soft_clamp: limit must be positive, got ", limit);
  const at::Tensor in = x.contiguous();
  at::Tensor out = at::empty_like(in);
  const float* src = in.const_data_ptr<float>();
  float* dst = out.mutable_data_ptr<float>();
  const float lim = static_cast<float>(limit);
  at::parallel_for(0, in.numel(), 16384, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dst[i] = lim * std::tanh(src[i] / lim);
  });
  return out;
}

// Keeps the k largest (or smallest) entries of each row of the last dimension and zeroes the rest (ATen ops: any device).
at::Tensor topk_mask(const at::Tensor& x, int64_t k, bool largest) {
  TORCH_CHECK(k >= 1 && k <= x.size(-1), "topk_mask: k must be in [1, ", x.size(-1), "], got ", k);
  const at::Tensor indices = std::get<1>(x.topk(k, -1, largest, /*sorted=*/false));
  return at::zeros_like(x).scatter(-1, indices, x.gather(-1, indices));
}

at::Tensor same_shape_meta(const at::Tensor& x) { return at::empty_like(x); }

}  // namespace

TORCH_LIBRARY(shimgen_ops, m) {
  m.def("soft_clamp(Tensor x, float limit) -> Tensor");
  m.def("topk_mask(Tensor x, int k, bool largest=True) -> Tensor");
}

TORCH_LIBRARY_IMPL(shimgen_ops, CPU, m) { m.impl("soft_clamp", soft_clamp_cpu); }

TORCH_LIBRARY_IMPL(shimgen_ops, CompositeExplicitAutograd, m) { m.impl("topk_mask", topk_mask); }

TORCH_LIBRARY_IMPL(shimgen_ops, Meta, m) {
  m.impl("soft_clamp", [](const at::Tensor& x, double) { return same_shape_meta(x); });
  m.impl("topk_mask", [](const at::Tensor& x, int64_t, bool) { return same_shape_meta(x); });
}
