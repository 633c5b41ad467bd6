"""A LLaMA-shaped causal LM from a config (random weights, no downloads), wrapped by transformers' own recipe for
export: a static KV cache held in buffers the model updates in place at each step, logits out.

`prefill` and `decode` graphs of a spec build the same module, so their caches have the same names and the package
keeps one copy that both use: prefill fills it over a prompt, decode reads it and adds one token per call.
"""

import torch
import transformers

from models import torchvision_ops  # noqa: F401  (before transformers' export integration, which imports torchvision)

from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM  # noqa: E402  isort: skip


def llama(hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2, intermediate: int = 128, vocab: int = 128,
          max_cache: int = 64) -> torch.nn.Module:
    """LlamaForCausalLM behind TorchExportableModuleWithStaticCache: forward(input_ids, cache_position=...) -> logits."""
    config = transformers.LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                      intermediate_size=intermediate, vocab_size=vocab, max_position_embeddings=max(128, max_cache))
    model = transformers.LlamaForCausalLM(config).eval()
    model.generation_config = transformers.GenerationConfig(
        use_cache=True, cache_implementation="static", cache_config={"batch_size": 1, "max_cache_len": max_cache, "device": "cpu"})
    return TorchExportableModuleForDecoderOnlyLM(model).model

