"""A LLaMA-shaped causal LM from a config (random weights, no downloads), wrapped by transformers' own recipe for
export: a static KV cache held in buffers the model updates in place at each step, logits out.

`prefill` and `decode` graphs of a spec build the same module, so their caches have the same names and the package
keeps one copy that both use: prefill fills it over a prompt, decode reads it and adds one token per call.
"""

import torch
import transformers
from transformers.integrations.executorch import TorchExportableModuleWithStaticCache


class StaticCacheLM(TorchExportableModuleWithStaticCache):
    """transformers' static-cache recipe, with a cache that follows the module to another device (`.to("cuda")`): the
    recipe registers its StaticCache layers' tensors as buffers, and `.to()` replaces the buffers but not the tensors
    the
    StaticCache object goes on writing into."""

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        super()._apply(fn, recurse)
        for i, layer in enumerate(self.static_cache.layers):
            layer.keys, layer.values = getattr(self, f"key_cache_{i}"), getattr(self, f"value_cache_{i}")
            layer.cumulative_length = getattr(self, f"cumulative_length_{i}")
            layer.device = layer.keys.device
        return self


def llama(
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    vocab: int = 128,
    max_cache: int = 64,
    dtype: str = "float32",
) -> torch.nn.Module:
    """LlamaForCausalLM behind TorchExportableModuleWithStaticCache: forward(input_ids, cache_position=...) -> logits;
    its weights and KV cache in `dtype`."""
    config = transformers.LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        max_position_embeddings=max(128, max_cache),
    )
    return _with_static_cache(transformers.LlamaForCausalLM(config).eval().to(getattr(torch, dtype)), max_cache)


def causal_lm(arch: str, max_cache: int = 64, dtype: str = "float32", **config: object) -> torch.nn.Module:
    """A small causal LM of transformers' model type `arch` (qwen2, gemma2, mixtral, ...) behind the same recipe: a
    2-layer config of width 64 with grouped-query attention, where `config` overrides or adds fields; its weights and
    KV cache in `dtype`."""
    small = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 128,
        "max_position_embeddings": max(128, max_cache),
    }
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(arch, **small | config))
    return _with_static_cache(model.eval().to(getattr(torch, dtype)), max_cache)


def _with_static_cache(model: transformers.PreTrainedModel, max_cache: int) -> StaticCacheLM:
    model.generation_config = transformers.GenerationConfig(
        use_cache=True,
        cache_implementation="static",
        cache_config={"batch_size": 1, "max_cache_len": max_cache, "device": "cpu"},
    )
    return StaticCacheLM(model)
