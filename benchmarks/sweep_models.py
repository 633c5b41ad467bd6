"""Models of benchmarks/model_sweep.py: timm, torchvision and transformers architectures by name, from small configs
(random weights, no downloads). Copied as models/sweep_models.py beside the sweep's specs."""

from __future__ import annotations

import inspect
from typing import Any

from models import torchvision_ops  # noqa: F401  (torchvision imports where its ops library does not load)
from torch import nn


def timm_model(name: str, dtype: str = "float32", **kwargs: Any) -> nn.Module:
    import timm

    return _in(dtype, timm.create_model(name, pretrained=False, **kwargs).eval())


def torchvision_model(name: str, dtype: str = "float32", **kwargs: Any) -> nn.Module:
    import torchvision

    builder = torchvision.models.get_model_builder(name)
    if "weights_backbone" in inspect.signature(builder).parameters:  # else a download of its backbone's weights
        kwargs.setdefault("weights_backbone", None)
    return _in(dtype, builder(weights=None, **kwargs).eval())


def hf_model(model_type: str, head: str = "", dtype: str = "float32", **config: Any) -> nn.Module:
    """transformers' AutoModel (or AutoModelFor<head>) of `model_type` from `config`; no KV cache."""
    import transformers

    made = transformers.AutoConfig.for_model(model_type, **config)
    if hasattr(made, "use_cache"):
        made.use_cache = False
    auto = getattr(transformers, f"AutoModelFor{head}" if head else "AutoModel")
    return _in(dtype, auto.from_config(made).eval())


def _in(dtype: str, model: nn.Module) -> nn.Module:
    """The model in `dtype`, its batch norms given statistics and affine parameters of their own: a fresh model's are
    all alike (mean 0, variance 1, weight 1, bias 0), which hides a fold that mixes them up (freezing folds them into
    the convolutions)."""
    import torch

    numbers = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(getattr(module, "running_var", None), torch.Tensor):
                count = module.running_var.numel()
                module.running_mean.copy_(torch.randn(count, generator=numbers) * 0.1)
                module.running_var.copy_(torch.rand(count, generator=numbers) + 0.5)
                if getattr(module, "affine", False):
                    module.weight.copy_(torch.rand(count, generator=numbers) + 0.5)
                    module.bias.copy_(torch.randn(count, generator=numbers) * 0.1)
    return model.to(getattr(torch, dtype))
