"""Models nobody here wrote: transformers architectures from small configs, random weights (no downloads).

Each factory takes the config's sizes as keyword arguments, so the same entry builds a CI-sized
model or a full-sized one (the MiniLM shape: hidden 384, 6 layers, 12 heads, intermediate 1536).
"""

import transformers


def bert(
    hidden: int = 32, layers: int = 2, heads: int = 4, intermediate: int = 37, vocab: int = 99, positions: int = 128
):
    """A BERT/MiniLM-shaped encoder returning its ModelOutput (last_hidden_state, pooler_output)."""
    config = transformers.BertConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        max_position_embeddings=positions,
    )
    return transformers.BertModel(config)


def gpt2(hidden: int = 32, layers: int = 2, heads: int = 4, vocab: int = 99, positions: int = 128):
    """GPT-2 with its LM head, returning CausalLMOutputWithCrossAttentions (logits); no KV cache."""
    config = transformers.GPT2Config(
        n_embd=hidden, n_layer=layers, n_head=heads, vocab_size=vocab, n_positions=positions, use_cache=False
    )
    return transformers.GPT2LMHeadModel(config)


def vit(hidden: int = 32, layers: int = 2, heads: int = 4, intermediate: int = 37, image: int = 32, patch: int = 8):
    """A ViT encoder returning BaseModelOutputWithPooling."""
    config = transformers.ViTConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        image_size=image,
        patch_size=patch,
    )
    return transformers.ViTModel(config)


def t5_encoder(d_model: int = 32, layers: int = 2, heads: int = 4, d_kv: int = 8, d_ff: int = 37, vocab: int = 99):
    """The encoder half of T5 (relative position buckets over a dynamic length), returning BaseModelOutput."""
    config = transformers.T5Config(
        d_model=d_model, d_kv=d_kv, d_ff=d_ff, num_layers=layers, num_heads=heads, vocab_size=vocab
    )
    return transformers.T5EncoderModel(config)


def minilm():
    """BERT at the size of sentence-transformers' all-MiniLM-L6-v2 (hidden 384, 6 layers, 12 heads, intermediate 1536,
    vocab 30522, 512 positions; about 90 MB of fp32 weights), randomly initialised: nothing is downloaded."""
    return bert(hidden=384, layers=6, heads=12, intermediate=1536, vocab=30522, positions=512).eval()


def llama_with_cache(
    hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2, intermediate: int = 37, vocab: int = 99
):
    """A LLaMA decoder with its default use_cache=True: it returns BaseModelOutputWithPast whose past_key_values is a
    DynamicCache, which torch.export (and the package) return once transformers registers it."""
    from transformers.integrations.executorch import register_dynamic_cache_export_support

    register_dynamic_cache_export_support()
    config = transformers.LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        max_position_embeddings=128,
    )
    return transformers.LlamaModel(config)


def mixtral(
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 48,
    experts: int = 4,
    per_token: int = 2,
    vocab: int = 99,
):
    """A Mixtral decoder (mixture of experts) with its LM head and no KV cache. On a CPU, transformers routes tokens to
    experts through a Python custom op of its own (transformers::grouped_mm_fallback), which the package imports from
    transformers when it loads; its grouped GEMMs want rows of a multiple of 16 bytes (intermediate 48)."""
    config = transformers.MixtralConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        num_local_experts=experts,
        num_experts_per_tok=per_token,
        vocab_size=vocab,
        max_position_embeddings=128,
        use_cache=False,
    )
    return transformers.MixtralForCausalLM(config)
