"""Models nobody here wrote, built as a user would: timm, torchvision and transformers architectures by name, from
small configs, each its own project with shimgen's default flags, then `shimgen check` against eager.

    python benchmarks/model_sweep.py [--device cpu|cuda] [--jobs N] [--only NAME ...] [--out FILE]

Each model is built by `shimgen build` (its own process and output directory, builds running `--jobs` at once) and
checked by `shimgen check` (eager against the package at every dim's min, example and max). A failure is reported with
the first lines of shimgen's message; nothing is retried. A pass notes what the build fell back on (scalar kernels,
a graph generated without oneDNN or without freezing). Batch norms get statistics of their own (`sweep_models._in`).
With --device cuda, the builds take the GPUs in turn.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path

from common import REPO, Report

HERE = Path(__file__).resolve().parent

IMAGE = '[{ name = "x", shape = ["batch", 3, SIZE, SIZE] }]'
TEXT = (
    '[{ name = "input_ids", shape = ["batch", "seq"], dtype = "int64", high = 99 },'
    ' { name = "attention_mask", shape = ["batch", "seq"], dtype = "int64", low = 1, high = 2, keyword = true }]'
)
PIXELS = '[{ name = "pixel_values", shape = ["batch", 3, 32, 32] }]'
BATCH = "{ batch = { min = 1, max = 4 } }"
TOKENS_16 = TEXT.replace('"seq"', "16")  # a fixed sequence: models that scan it in Python
BATCH_SEQ = "{ batch = { min = 1, max = 4 }, seq = { min = 2, max = 32 } }"
SMALL_TEXT = "hidden_size = 32, num_hidden_layers = 2, num_attention_heads = 4, intermediate_size = 37, vocab_size = 99"
SMALL_DECODER = SMALL_TEXT + ", num_key_value_heads = 2, max_position_embeddings = 64"
SMALL_MOE = SMALL_DECODER.replace("37", "48")
SMALL_VISION = (
    "hidden_size = 32, num_hidden_layers = 2, num_attention_heads = 4, intermediate_size = 37, image_size = 32,"
    " patch_size = 8"
)

# DeepSeek's multi-head latent attention, with experts after a first dense layer
SMALL_LATENT = (
    "hidden_size = 32, intermediate_size = 37, moe_intermediate_size = 48, num_hidden_layers = 2,"
    " num_attention_heads = 4, num_key_value_heads = 4, n_routed_experts = 4, num_experts_per_tok = 2,"
    " n_group = 1, topk_group = 1, first_k_dense_replace = 1, q_lora_rank = 16, kv_lora_rank = 16,"
    " qk_rope_head_dim = 8, v_head_dim = 8, qk_nope_head_dim = 8, vocab_size = 99, max_position_embeddings = 64"
)


@dataclass(frozen=True)
class Case:
    name: str
    entry: str
    kwargs: str  # a TOML inline table's body
    inputs: str
    dims: str
    tolerance: float = 1e-3


def timm(name: str, size: int = 224, **extra: str) -> Case:
    body = ", ".join([f'name = "{name}"', "num_classes = 10", *(f"{k} = {v}" for k, v in extra.items())])
    return Case(f"timm:{name}", "timm_model", body, IMAGE.replace("SIZE", str(size)), BATCH)


def torchvision(name: str, size: int = 224, **extra: str) -> Case:
    body = ", ".join([f'name = "{name}"', "num_classes = 10", *(f"{k} = {v}" for k, v in extra.items())])
    return Case(f"torchvision:{name}", "torchvision_model", body, IMAGE.replace("SIZE", str(size)), BATCH)


def hf(model_type: str, config: str, head: str = "", inputs: str = TEXT, dims: str = BATCH_SEQ) -> Case:
    body = f'model_type = "{model_type}", head = "{head}", {config}'
    return Case(f"transformers:{model_type}{'/' + head if head else ''}", "hf_model", body, inputs, dims, 1e-4)


CASES = [
    timm("deit_tiny_patch16_224"),
    timm("efficientnet_b0"),
    timm("mobilenetv3_small_100"),
    timm("regnetx_002"),
    timm("resnet18d"),
    timm("mobilevit_xxs", 256),
    timm("efficientformer_l1"),
    timm("fastvit_t8"),
    timm("tiny_vit_5m_224"),
    timm("pvt_v2_b0"),
    timm("xcit_nano_12_p16_224"),
    timm("edgenext_xx_small", 256),
    timm("mobileone_s0"),
    timm("ghostnet_100"),
    timm("eva02_tiny_patch14_224"),
    timm("maxvit_nano_rw_256", 256),
    timm("coatnet_nano_rw_224"),
    timm("poolformerv2_s12"),
    timm("gcvit_xxtiny"),
    timm("davit_tiny"),
    timm("hrnet_w18_small"),
    timm("inception_v3", 299),
    timm("densenet121"),
    timm("repvgg_a0"),
    timm("levit_128s"),
    timm("convnextv2_atto"),
    timm("mobilenetv4_conv_small"),
    timm("efficientvit_b0"),
    timm("swin_tiny_patch4_window7_224"),
    timm("nfnet_l0"),
    timm("convnext_atto"),
    timm("rexnet_100"),
    timm("hgnetv2_b0"),
    # a bias of 2 (heads) that Inductor's oneDNN fusion compares with the example batch 2
    timm("cait_xxs24_224", 64, img_size="64", embed_dim="32", depth="2", num_heads="2"),
    timm("beit_base_patch16_224", 64, img_size="64", embed_dim="32", depth="2", num_heads="2"),
    timm("deit_tiny_distilled_patch16_224", 64, img_size="64", embed_dim="32", depth="2", num_heads="2"),
    timm("vit_small_patch14_reg4_dinov2", 56, img_size="56", embed_dim="32", depth="2", num_heads="2"),
    torchvision("mobilenet_v3_small"),
    torchvision("efficientnet_b0"),
    torchvision("vit_b_16"),
    torchvision("swin_t"),
    torchvision("swin_v2_t", 256),
    torchvision("convnext_tiny"),
    torchvision("regnet_y_400mf"),
    torchvision("shufflenet_v2_x1_0"),
    torchvision("squeezenet1_1"),
    torchvision("googlenet", aux_logits="false", init_weights="false"),
    torchvision("maxvit_t"),
    torchvision("mnasnet0_5"),
    torchvision("resnext50_32x4d"),
    torchvision("resnet50"),
    torchvision("mobilenet_v2"),
    torchvision("efficientnet_v2_s"),
    # bidirectional LSTMs over image rows and columns; an MLP-Mixer; a segmentation model whose output is a dict
    timm("sequencer2d_s", 64),
    timm("mixer_s16_224", 64, img_size="64"),
    torchvision("lraspp_mobilenet_v3_large", 64),
    # 3-D convolutions over a clip of frames
    Case(
        "torchvision:r3d_18",
        "torchvision_model",
        'name = "r3d_18", num_classes = 10',
        '[{ name = "x", shape = ["batch", 3, 4, 32, 32] }]',
        BATCH,
    ),
    torchvision("alexnet"),
    torchvision("vgg11_bn", 64),
    torchvision("densenet121"),
    torchvision("inception_v3", 299, aux_logits="false", init_weights="false"),
    torchvision("wide_resnet50_2"),
    torchvision("regnet_x_400mf"),
    torchvision("vit_b_32"),
    torchvision("deeplabv3_mobilenet_v3_large", 64),
    torchvision("fcn_resnet50", 64),
    Case(
        "torchvision:mc3_18",
        "torchvision_model",
        'name = "mc3_18", num_classes = 10',
        '[{ name = "x", shape = ["batch", 3, 4, 32, 32] }]',
        BATCH,
    ),
    Case(
        "torchvision:r2plus1d_18",
        "torchvision_model",
        'name = "r2plus1d_18", num_classes = 10',
        '[{ name = "x", shape = ["batch", 3, 4, 32, 32] }]',
        BATCH,
    ),
    Case(
        "torchvision:s3d",
        "torchvision_model",
        'name = "s3d", num_classes = 10',
        '[{ name = "x", shape = ["batch", 3, 16, 224, 224] }]',
        BATCH,
    ),
    Case(
        "torchvision:swin3d_t",
        "torchvision_model",
        'name = "swin3d_t", num_classes = 10',
        '[{ name = "x", shape = ["batch", 3, 8, 64, 64] }]',
        BATCH,
    ),
    # optical flow: two frames, a correlation pyramid sampled by grid_sample, twelve recurrent refinements
    Case(
        "torchvision:raft_small",
        "torchvision_model",
        'name = "raft_small"',  # 128 x 128: its correlation pyramid halves an eighth of the image three times
        '[{ name = "image1", shape = ["batch", 3, 128, 128] }, { name = "image2", shape = ["batch", 3, 128, 128] }]',
        "{ batch = { min = 1, max = 4, specialize = [1] } }",
    ),
    # vision transformers with pooled attention, unrolled windows, sub-sampled attention
    timm("mvitv2_tiny"),
    timm("hiera_tiny_224"),
    timm("twins_svt_small"),
    # attention over two scales, outlooker, focal modulation, gated positional attention, lambda and halo layers,
    # split attention, selective kernels, partial convolutions, mixed depthwise kernels, pooled and MLP-only models
    timm("crossvit_tiny_240", 240),
    timm("volo_d1_224"),
    timm("focalnet_tiny_srf"),
    timm("convit_tiny"),
    timm("res2net50_14w_8s"),
    timm("dpn68"),
    timm("efficientformerv2_s0"),
    timm("rdnet_tiny"),
    timm("ese_vovnet19b_dw"),
    timm("dla34"),
    timm("nest_tiny_jx"),
    timm("coat_lite_tiny"),
    timm("inception_next_atto"),
    timm("lambda_resnet26t", 256),
    timm("botnet26t_256", 256),
    timm("halonet26t", 256),
    timm("mambaout_femto"),
    timm("starnet_s1"),
    timm("resnest14d"),
    timm("skresnet18"),
    timm("pit_ti_224"),
    timm("visformer_tiny"),
    timm("gmlp_ti16_224"),
    timm("resmlp_12_224"),
    timm("shvit_s1"),
    timm("xception41", 299),
    timm("mixnet_s"),
    timm("swinv2_cr_tiny_ns_224"),
    timm("efficientvit_m0"),
    timm("fasternet_t0"),
    hf("distilbert", "dim = 32, n_layers = 2, n_heads = 4, hidden_dim = 37, vocab_size = 99"),
    hf("roberta", SMALL_TEXT + ", pad_token_id = 1"),
    hf("xlm-roberta", SMALL_TEXT + ", pad_token_id = 1"),
    # local and global attention layers
    hf(
        "modernbert",
        SMALL_TEXT + ", global_attn_every_n_layers = 2, local_attention = 16, pad_token_id = 0, bos_token_id = 1,"
        " eos_token_id = 2, cls_token_id = 1, sep_token_id = 2",
    ),
    hf("albert", SMALL_TEXT + ", embedding_size = 16"),
    hf("electra", SMALL_TEXT + ", embedding_size = 16"),
    hf("deberta-v2", SMALL_TEXT),
    hf("gpt_neox", SMALL_TEXT, "CausalLM"),
    hf("mistral", SMALL_DECODER, "CausalLM"),
    hf("qwen2", SMALL_DECODER, "CausalLM"),
    hf("phi3", SMALL_DECODER + ", pad_token_id = 0", "CausalLM"),
    hf("gemma", SMALL_DECODER + ", head_dim = 8", "CausalLM"),
    # grouped GEMMs need rows of a multiple of 16 bytes: intermediate_size 48
    hf("mixtral", SMALL_MOE + ", num_local_experts = 4, num_experts_per_tok = 2", "CausalLM"),
    hf("bloom", "hidden_size = 32, n_layer = 2, n_head = 4, vocab_size = 99", "CausalLM"),
    hf("llama", SMALL_DECODER, "CausalLM"),
    hf("phi", SMALL_DECODER, "CausalLM"),
    hf("stablelm", SMALL_DECODER, "CausalLM"),
    hf("starcoder2", SMALL_DECODER, "CausalLM"),
    hf("olmo2", SMALL_DECODER, "CausalLM"),
    hf("granite", SMALL_DECODER, "CausalLM"),
    hf("smollm3", SMALL_DECODER + ", pad_token_id = 0", "CausalLM"),
    hf(
        "qwen2_moe",
        SMALL_DECODER + ", num_experts = 4, num_experts_per_tok = 2, moe_intermediate_size = 48,"
        " shared_expert_intermediate_size = 48",
        "CausalLM",
    ),
    # multi-head latent attention, and experts after a first dense layer
    hf("deepseek_v3", SMALL_LATENT, "CausalLM"),
    # a state-space model: transformers' reference scan (no mamba_ssm kernels) loops over the sequence in Python, which
    # fixes its length (a dynamic one is refused, saying so)
    hf(
        "mamba",
        "hidden_size = 32, num_hidden_layers = 2, vocab_size = 99, state_size = 8",
        "CausalLM",
        inputs=TOKENS_16,
        dims=BATCH,
    ),
    hf("gpt2", "n_embd = 32, n_layer = 2, n_head = 4, vocab_size = 99, n_positions = 64", "CausalLM"),
    hf("qwen3", SMALL_DECODER + ", head_dim = 8", "CausalLM"),
    hf("gemma2", SMALL_DECODER + ", head_dim = 8, sliding_window = 16", "CausalLM"),
    hf("gemma3_text", SMALL_DECODER + ", head_dim = 8, sliding_window = 16", "CausalLM"),
    hf(
        "qwen3_moe",
        SMALL_DECODER + ", head_dim = 8, num_experts = 4, num_experts_per_tok = 2, moe_intermediate_size = 48",
        "CausalLM",
    ),
    hf(
        "gpt_oss",
        SMALL_MOE + ", head_dim = 8, num_local_experts = 4, num_experts_per_tok = 2, sliding_window = 16",
        "CausalLM",
    ),
    hf(
        "opt",
        "hidden_size = 32, num_hidden_layers = 2, num_attention_heads = 4, ffn_dim = 37, vocab_size = 99,"
        " word_embed_proj_dim = 32, max_position_embeddings = 64",
        "CausalLM",
    ),
    hf("falcon", "hidden_size = 32, num_hidden_layers = 2, num_attention_heads = 4, vocab_size = 99", "CausalLM"),
    # decoders of other families: sliding windows, experts, latent attention, linear attention (gated delta rule),
    # short convolutions, state-space layers beside attention, a real-gated linear recurrence. The scans (Qwen3-Next,
    # Jamba, Falcon-H1, Mamba-2, RecurrentGemma) take a fixed sequence: with a dynamic one shimgen says why not
    hf("cohere2", SMALL_DECODER + ", sliding_window = 16", "CausalLM"),
    hf("olmoe", SMALL_MOE + ", num_experts = 4, num_experts_per_tok = 2", "CausalLM"),
    hf("granitemoe", SMALL_MOE + ", num_local_experts = 4, num_experts_per_tok = 2", "CausalLM"),
    hf("phimoe", SMALL_MOE + ", num_local_experts = 4, num_experts_per_tok = 2", "CausalLM"),
    hf("exaone4", SMALL_DECODER + ", head_dim = 8", "CausalLM"),
    hf("ernie4_5", SMALL_DECODER + ", head_dim = 8", "CausalLM"),
    hf("glm4", SMALL_DECODER + ", head_dim = 8, pad_token_id = 0", "CausalLM"),
    hf("nemotron", SMALL_DECODER + ", head_dim = 8", "CausalLM"),
    hf("persimmon", SMALL_DECODER, "CausalLM"),
    hf("apertus", SMALL_DECODER, "CausalLM"),
    hf("doge", SMALL_DECODER, "CausalLM"),
    hf("hunyuan_v1_dense", SMALL_DECODER + ", head_dim = 8", "CausalLM"),
    hf("jetmoe", SMALL_DECODER, "CausalLM"),
    hf("deepseek_v2", SMALL_LATENT, "CausalLM"),
    hf(
        "llama4_text",
        SMALL_MOE + ", head_dim = 8, num_local_experts = 4, num_experts_per_tok = 1, intermediate_size_mlp = 48",
        "CausalLM",
    ),
    hf(
        "qwen3_next",
        SMALL_DECODER + ", head_dim = 8, num_experts = 4, num_experts_per_tok = 2, moe_intermediate_size = 48,"
        " shared_expert_intermediate_size = 48, linear_num_value_heads = 4, linear_num_key_heads = 2,"
        " linear_key_head_dim = 8, linear_value_head_dim = 8",
        "CausalLM",
        inputs=TOKENS_16,
        dims=BATCH,
    ),
    hf("lfm2", SMALL_DECODER, "CausalLM"),
    hf(
        "jamba",
        SMALL_MOE + ", num_experts = 4, num_experts_per_tok = 2, mamba_d_state = 8,"
        " attn_layer_period = 2, attn_layer_offset = 1, expert_layer_period = 2, expert_layer_offset = 1",
        "CausalLM",
        inputs=TOKENS_16,
        dims=BATCH,
    ),
    hf("falcon_h1", SMALL_DECODER + ", head_dim = 8", "CausalLM", inputs=TOKENS_16, dims=BATCH),
    hf(
        "mamba2",
        "hidden_size = 32, num_hidden_layers = 2, vocab_size = 99, num_heads = 4, head_dim = 16, state_size = 8,"
        " n_groups = 1",
        "CausalLM",
        inputs=TOKENS_16,
        dims=BATCH,
    ),
    hf(
        "recurrent_gemma",
        SMALL_DECODER + ", head_dim = 8, lru_width = 32",
        "CausalLM",
        inputs=TOKENS_16,
        dims=BATCH,
    ),
    hf(
        "bamba",
        SMALL_DECODER + ", mamba_n_heads = 4, mamba_d_head = 16, mamba_d_state = 8, mamba_n_groups = 1,"
        " attn_layer_indices = [1], mamba_chunk_size = 16",
        "CausalLM",
        inputs=TOKENS_16,
        dims=BATCH,
    ),
    hf(
        "granitemoehybrid",
        SMALL_MOE + ", shared_intermediate_size = 48, num_local_experts = 4,"
        " num_experts_per_tok = 2, mamba_n_heads = 4, mamba_d_head = 16, mamba_d_state = 8, mamba_n_groups = 1,"
        ' layer_types = ["mamba", "attention"], mamba_chunk_size = 16',
        "CausalLM",
        inputs=TOKENS_16,
        dims=BATCH,
    ),
    hf("glm", SMALL_DECODER + ", head_dim = 8, pad_token_id = 0", "CausalLM"),
    hf(
        "gemma3n_text",
        SMALL_DECODER.replace("intermediate_size = 37", "intermediate_size = [37, 37]")
        + ", head_dim = 8, laurel_rank = 4, altup_num_inputs = 2, hidden_size_per_layer_input = 8,"
        " vocab_size_per_layer_input = 99, num_kv_shared_layers = 0, sliding_window = 16,"
        ' layer_types = ["sliding_attention", "full_attention"], activation_sparsity_pattern = [0.0, 0.0]',
        "CausalLM",
    ),
    hf(
        "dbrx",
        "d_model = 32, n_heads = 4, n_layers = 2, max_seq_len = 64, vocab_size = 99,"
        " attn_config = { kv_n_heads = 2, rope_theta = 10000.0, clip_qkv = 8.0 },"
        " ffn_config = { ffn_hidden_size = 48, moe_num_experts = 4, moe_top_k = 2 }",
        "CausalLM",
    ),
    hf(
        "dots1",
        SMALL_DECODER + ", head_dim = 8, n_routed_experts = 4, num_experts_per_tok = 2, moe_intermediate_size = 48,"
        " first_k_dense_replace = 1, n_shared_experts = 1, n_group = 1, topk_group = 1",
        "CausalLM",
    ),
    hf("gptj", "n_embd = 32, n_layer = 2, n_head = 4, rotary_dim = 4, n_positions = 64, vocab_size = 99", "CausalLM"),
    hf(
        "codegen",
        "n_embd = 32, n_layer = 2, n_head = 4, rotary_dim = 4, n_positions = 64, n_ctx = 64, vocab_size = 99",
        "CausalLM",
    ),
    hf("mpt", "d_model = 32, n_heads = 4, n_layers = 2, max_seq_len = 64, vocab_size = 99", "CausalLM"),
    hf("xglm", "d_model = 32, num_layers = 2, attention_heads = 4, ffn_dim = 37, vocab_size = 99", "CausalLM"),
    hf("mobilebert", SMALL_TEXT + ", embedding_size = 16, intra_bottleneck_size = 16, true_hidden_size = 16"),
    hf("clip_text_model", SMALL_TEXT),
    hf(
        "bart",
        "d_model = 32, encoder_layers = 2, decoder_layers = 2, encoder_attention_heads = 4,"
        " decoder_attention_heads = 4, encoder_ffn_dim = 37, decoder_ffn_dim = 37, vocab_size = 99",
    ),
    hf(
        "wav2vec2",
        SMALL_TEXT + ", conv_dim = [16, 16, 16], conv_stride = [5, 2, 2], conv_kernel = [10, 3, 3],"
        " num_conv_pos_embeddings = 16, num_conv_pos_embedding_groups = 4",
        inputs='[{ name = "input_values", shape = ["batch", "n"] }]',
        dims="{ batch = { min = 1, max = 4 }, n = { min = 400, max = 4000, multiple_of = 20 } }",
    ),
    # encoder-decoders given the decoder's tokens, an audio encoder, a detector and plain BERT
    hf(
        "t5",
        "d_model = 32, d_kv = 8, d_ff = 37, num_layers = 2, num_decoder_layers = 2, num_heads = 4, vocab_size = 99",
        inputs=TEXT[:-1] + ', { name = "decoder_input_ids", shape = ["batch", "target"], dtype = "int64", high = 99,'
        " keyword = true }]",
        dims=BATCH_SEQ[:-1] + ", target = { min = 1, max = 16 } }",
    ),
    hf(
        "whisper",
        "d_model = 32, encoder_layers = 2, decoder_layers = 2, encoder_attention_heads = 4, decoder_attention_heads = 4,"
        " encoder_ffn_dim = 37, decoder_ffn_dim = 37, vocab_size = 99, num_mel_bins = 16, max_source_positions = 16,"
        " max_target_positions = 32, pad_token_id = 0, bos_token_id = 1, eos_token_id = 2, decoder_start_token_id = 1",
        inputs='[{ name = "input_features", shape = ["batch", 16, 32] }, { name = "decoder_input_ids", shape = '
        '["batch", "target"], dtype = "int64", high = 99, keyword = true }]',
        dims="{ batch = { min = 1, max = 4 }, target = { min = 1, max = 16 } }",
    ),
    hf(
        "hubert",
        SMALL_TEXT + ", conv_dim = [16, 16, 16], conv_stride = [5, 2, 2], conv_kernel = [10, 3, 3],"
        " num_conv_pos_embeddings = 16, num_conv_pos_embedding_groups = 4",
        inputs='[{ name = "input_values", shape = ["batch", "n"] }]',
        dims="{ batch = { min = 1, max = 4 }, n = { min = 400, max = 4000, multiple_of = 20 } }",
    ),
    hf(
        "yolos",
        SMALL_VISION.replace("image_size = 32", "image_size = [32, 32]") + ", num_detection_tokens = 4",
        "ObjectDetection",
        inputs=PIXELS,
        dims=BATCH,
    ),
    hf("bert", SMALL_TEXT),
    hf("dinov2", SMALL_VISION, inputs=PIXELS, dims=BATCH),
    hf("vit", SMALL_VISION, inputs=PIXELS, dims=BATCH),
    hf("siglip_vision_model", SMALL_VISION, inputs=PIXELS, dims=BATCH),
    hf("clip_vision_model", SMALL_VISION, inputs=PIXELS, dims=BATCH),
    hf("beit", SMALL_VISION, inputs=PIXELS, dims=BATCH),
    hf("convnext", "hidden_sizes = [8, 16, 32, 64], depths = [1, 1, 1, 1], image_size = 32", inputs=PIXELS, dims=BATCH),
    hf(
        "segformer",
        "hidden_sizes = [8, 16, 32, 64], depths = [1, 1, 1, 1], num_attention_heads = [1, 1, 2, 2],"
        " decoder_hidden_size = 32, image_size = 32",
        inputs=PIXELS,
        dims=BATCH,
    ),
    hf(
        "swin",
        "embed_dim = 16, depths = [1, 1], num_heads = [1, 2], image_size = 32, patch_size = 4, window_size = 2",
        inputs=PIXELS,
        dims=BATCH,
    ),
]
# a detector, depth, two towers, sparse and disentangled attention, translation, audio, video and a time series
SEQ2SEQ = "encoder_attention_heads = 4, decoder_attention_heads = 4, encoder_ffn_dim = 37, decoder_ffn_dim = 37"
TEXT_AND_TARGET = TEXT[:-1] + (
    ', { name = "decoder_input_ids", shape = ["batch", "target"], dtype = "int64", high = 99, keyword = true }]'
)
BATCH_SEQ_TARGET = BATCH_SEQ[:-1] + ", target = { min = 1, max = 16 } }"
CASES += [
    hf(
        "detr",
        'use_timm_backbone = false, use_pretrained_backbone = false, backbone_config = { model_type = "resnet",'
        ' embedding_size = 8, hidden_sizes = [8, 16, 32, 64], depths = [1, 1, 1, 1], out_features = ["stage4"] },'
        " d_model = 32, encoder_layers = 1, decoder_layers = 1, num_queries = 5, num_labels = 3, " + SEQ2SEQ,
        "ObjectDetection",
        inputs=PIXELS.replace("32, 32", "64, 64"),
        dims=BATCH,
    ),
    hf(
        "dpt",
        SMALL_VISION.replace("num_hidden_layers = 2", "num_hidden_layers = 4")
        + ", backbone_out_indices = [0, 1, 2, 3],"
        " neck_hidden_sizes = [8, 16, 32, 32], fusion_hidden_size = 16, reassemble_factors = [4, 2, 1, 0.5]",
        "DepthEstimation",
        inputs=PIXELS,
        dims=BATCH,
    ),
    hf(
        "clip",
        "projection_dim = 16, text_config = { "
        + SMALL_TEXT
        + ", max_position_embeddings = 32 }, vision_config = { "
        + SMALL_VISION
        + " }",
        inputs=TEXT[:-1] + ', { name = "pixel_values", shape = ["batch", 3, 32, 32], keyword = true }]',
    ),
    hf("longformer", SMALL_TEXT + ", attention_window = 4, max_position_embeddings = 64"),
    hf("convbert", SMALL_TEXT),
    hf("deberta", SMALL_TEXT),
    hf("xlnet", "d_model = 32, n_layer = 2, n_head = 4, d_inner = 37, vocab_size = 99"),
    hf("gpt_bigcode", "n_embd = 32, n_layer = 2, n_head = 4, n_positions = 64, vocab_size = 99", "CausalLM"),
    hf(
        "marian",
        "d_model = 32, encoder_layers = 2, decoder_layers = 2, vocab_size = 99, pad_token_id = 0,"
        " decoder_start_token_id = 0, " + SEQ2SEQ,
        inputs=TEXT_AND_TARGET,
        dims=BATCH_SEQ_TARGET,
    ),
    hf(
        "pegasus",
        "d_model = 32, encoder_layers = 2, decoder_layers = 2, vocab_size = 99, pad_token_id = 0,"
        " decoder_start_token_id = 0, " + SEQ2SEQ,
        inputs=TEXT_AND_TARGET,
        dims=BATCH_SEQ_TARGET,
    ),
    hf(
        "wavlm",
        SMALL_TEXT + ", conv_dim = [16, 16, 16], conv_stride = [5, 2, 2], conv_kernel = [10, 3, 3],"
        " num_conv_pos_embeddings = 16, num_conv_pos_embedding_groups = 4, num_buckets = 32, max_bucket_distance = 64",
        inputs='[{ name = "input_values", shape = ["batch", "n"] }]',
        dims="{ batch = { min = 1, max = 4 }, n = { min = 400, max = 4000, multiple_of = 20 } }",
    ),
    hf(
        "audio-spectrogram-transformer",
        "hidden_size = 32, num_hidden_layers = 2, num_attention_heads = 4, intermediate_size = 37, num_mel_bins = 16,"
        " max_length = 32, patch_size = 8, frequency_stride = 8, time_stride = 8",
        inputs='[{ name = "input_values", shape = ["batch", 32, 16] }]',
        dims=BATCH,
    ),
    hf(
        "videomae",
        SMALL_VISION + ", num_frames = 4, tubelet_size = 2",
        inputs='[{ name = "pixel_values", shape = ["batch", 4, 3, 32, 32] }]',
        dims=BATCH,
    ),
    hf(
        "mobilevit",
        "image_size = 32, hidden_sizes = [16, 24, 32], neck_hidden_sizes = [8, 8, 16, 16, 24, 32, 64]",
        inputs=PIXELS,
        dims=BATCH,
    ),
    hf(
        "levit",
        "image_size = 32, hidden_sizes = [16, 32, 48], num_attention_heads = [1, 2, 3], depths = [1, 1, 1],"
        " key_dim = [8, 8, 8]",
        inputs=PIXELS,
        dims=BATCH,
    ),
    hf(
        "regnet",
        "embedding_size = 8, hidden_sizes = [8, 16, 24, 32], depths = [1, 1, 1, 1], groups_width = 8",
        inputs=PIXELS,
        dims=BATCH,
    ),
    hf(
        "patchtst",
        "num_input_channels = 3, context_length = 32, patch_length = 8, patch_stride = 8, d_model = 16,"
        " num_attention_heads = 2, num_hidden_layers = 2, ffn_dim = 32",
        inputs='[{ name = "past_values", shape = ["batch", 32, 3] }]',
        dims=BATCH,
    ),
]
# detectors, zero-shot detection, super-resolution, depth, video, protein and Fourier encoders, more translation,
# a mixture-of-experts T5, speech-to-text, and recurrent and state-space decoders


def resnet_backbone(features: str) -> str:
    return (
        'backbone_config = { model_type = "resnet", embedding_size = 8, hidden_sizes = [8, 16, 32, 64],'
        f" depths = [1, 1, 1, 1], out_features = [{features}] }}, use_pretrained_backbone = false"
    )


DETECTOR = (
    "d_model = 32, encoder_layers = 1, decoder_layers = 1, num_queries = 10, num_labels = 3, encoder_attention_heads = 4,"
    " decoder_attention_heads = 4, encoder_ffn_dim = 37, decoder_ffn_dim = 37"
)
CASES += [
    hf(
        "rt_detr",
        resnet_backbone('"stage2", "stage3", "stage4"').replace('"resnet"', '"rt_detr_resnet"')
        + ", encoder_hidden_dim = 32, encoder_in_channels = [16, 32, 64], feat_strides = [8, 16, 32],"
        " decoder_in_channels = [32, 32, 32], num_feature_levels = 3, " + DETECTOR,
        "ObjectDetection",
        inputs=PIXELS.replace('"batch", 3, 32, 32', "1, 3, 64, 64"),
        dims="{}",  # batch_size = len(source_flatten) fixes the batch
    ),
    hf(
        "conditional_detr",
        "use_timm_backbone = false, " + resnet_backbone('"stage4"') + ", " + DETECTOR,
        "ObjectDetection",
        inputs=PIXELS.replace("32, 32", "64, 64"),
        dims=BATCH,
    ),
    hf(
        "owlvit",
        "projection_dim = 16, text_config = { "
        + SMALL_TEXT
        + ", max_position_embeddings = 16 }, vision_config = { "
        + SMALL_VISION
        + " }",
        inputs=TEXT[:-1] + ', { name = "pixel_values", shape = ["batch", 3, 32, 32], keyword = true }]',
        dims="{ batch = { min = 1, max = 4 }, seq = { min = 2, max = 16 } }",
    ),
    hf(
        "swin2sr",
        "image_size = 16, embed_dim = 16, depths = [1, 1], num_heads = [2, 2], window_size = 4, upscale = 2",
        inputs=PIXELS.replace("32, 32", "16, 16"),
        dims=BATCH,
    ),
    hf(
        "glpn",
        "hidden_sizes = [8, 16, 32, 64], depths = [1, 1, 1, 1], num_attention_heads = [1, 1, 2, 2],"
        " decoder_hidden_size = 16",
        "DepthEstimation",
        inputs=PIXELS,
        dims=BATCH,
    ),
    hf(
        "hiera",
        "embed_dim = 16, image_size = [64, 64], patch_size = [7, 7], patch_stride = [4, 4], patch_padding = [3, 3],"
        " depths = [1, 1, 1, 1], num_heads = [1, 1, 2, 2], query_stride = [2, 2], masked_unit_size = [8, 8]",
        inputs=PIXELS.replace("32, 32", "64, 64"),
        dims=BATCH,
    ),
    hf(
        "vivit",
        SMALL_VISION.replace(", patch_size = 8", "") + ", num_frames = 4, tubelet_size = [2, 8, 8]",
        inputs='[{ name = "pixel_values", shape = ["batch", 4, 3, 32, 32] }]',
        dims=BATCH,
    ),
    hf("esm", SMALL_TEXT + ', pad_token_id = 1, max_position_embeddings = 64, position_embedding_type = "rotary"'),
    hf(
        "fnet",
        "hidden_size = 32, num_hidden_layers = 2, intermediate_size = 37, vocab_size = 99, max_position_embeddings = 64",
        inputs=TEXT[: TEXT.index("},") + 1] + "]",
    ),
    hf("big_bird", SMALL_TEXT + ', attention_type = "original_full", max_position_embeddings = 64'),
    hf("mpnet", SMALL_TEXT),
    hf(
        "squeezebert",
        SMALL_TEXT.replace("intermediate_size = 37", "intermediate_size = 64") + ", embedding_size = 32, q_groups = 2,"
        " k_groups = 2, v_groups = 2, post_attention_groups = 2, intermediate_groups = 2, output_groups = 2",
    ),
    *(
        hf(
            model_type,
            "d_model = 32, encoder_layers = 2, decoder_layers = 2, vocab_size = 99, pad_token_id = 0,"
            " decoder_start_token_id = 0, max_position_embeddings = 64, " + SEQ2SEQ,
            inputs=TEXT_AND_TARGET,
            dims=BATCH_SEQ_TARGET,
        )
        for model_type in ("mbart", "m2m_100")
    ),
    hf(
        "switch_transformers",
        "d_model = 32, d_kv = 8, d_ff = 37, num_layers = 2, num_decoder_layers = 2, num_heads = 4, vocab_size = 99,"
        " num_experts = 4, expert_capacity = 8, decoder_start_token_id = 0, pad_token_id = 0",
        inputs=TEXT_AND_TARGET,
        dims=BATCH_SEQ_TARGET,
    ),
    hf(
        "speech_to_text",
        "d_model = 32, encoder_layers = 2, decoder_layers = 2, vocab_size = 99, input_feat_per_channel = 16,"
        " input_channels = 1, conv_channels = 32, num_conv_layers = 2, max_source_positions = 64,"
        " max_target_positions = 32, pad_token_id = 0, decoder_start_token_id = 0, " + SEQ2SEQ,
        inputs='[{ name = "input_features", shape = ["batch", 40, 16] }, { name = "decoder_input_ids", shape = '
        '["batch", "target"], dtype = "int64", high = 99, keyword = true }]',
        dims="{ batch = { min = 1, max = 4 }, target = { min = 1, max = 16 } }",
    ),
    hf(
        "sew",
        SMALL_TEXT + ", conv_dim = [16, 16, 16], conv_stride = [5, 2, 2], conv_kernel = [10, 3, 3],"
        " num_conv_pos_embeddings = 16, num_conv_pos_embedding_groups = 4, squeeze_factor = 2",
        inputs='[{ name = "input_values", shape = ["batch", "n"] }]',
        dims="{ batch = { min = 1, max = 4 }, n = { min = 400, max = 4000, multiple_of = 20 } }",
    ),
    hf(
        "rwkv",
        "hidden_size = 32, num_hidden_layers = 2, attention_hidden_size = 32, intermediate_size = 37, vocab_size = 99,"
        " context_length = 64",
        "CausalLM",
        inputs=TOKENS_16,
        dims=BATCH,
    ),
    hf(
        "falcon_mamba",
        "hidden_size = 32, num_hidden_layers = 2, state_size = 8, expand = 2, conv_kernel = 4, vocab_size = 99",
        "CausalLM",
        inputs=TOKENS_16,
        dims=BATCH,
    ),
    hf(
        "zamba2",
        SMALL_DECODER + ", mamba_d_state = 8, mamba_headdim = 8, n_mamba_heads = 8, mamba_ngroups = 1,"
        ' layers_block_type = ["mamba", "hybrid"], hybrid_layer_ids = [1], chunk_size = 16, use_mem_rope = true,'
        " attention_head_dim = 16, adapter_rank = 8",
        "CausalLM",
        inputs=TOKENS_16,
        dims=BATCH,
    ),
    hf("olmo", SMALL_DECODER, "CausalLM"),
]
# segmentation heads over other backbones, two more image-text towers, registers, and ModernBERT as a decoder
SWIN_BACKBONE = (
    'backbone_config = { model_type = "swin", embed_dim = 16, depths = [1, 1, 1, 1], num_heads = [1, 1, 2, 2],'
    ' window_size = 2, image_size = 64, out_features = ["stage1", "stage2", "stage3", "stage4"] },'
    " use_pretrained_backbone = false"
)
CASES += [
    hf(
        "maskformer",
        SWIN_BACKBONE + ", fpn_feature_size = 32, mask_feature_size = 32, num_queries = 5, num_labels = 3,"
        ' decoder_config = { model_type = "detr", d_model = 32, encoder_layers = 1, decoder_layers = 1,'
        " encoder_attention_heads = 4, decoder_attention_heads = 4, encoder_ffn_dim = 37, decoder_ffn_dim = 37,"
        " num_queries = 5 }",
        inputs=PIXELS.replace("32, 32", "64, 64"),
        dims=BATCH,
    ),
    hf(
        "upernet",
        'backbone_config = { model_type = "convnext", hidden_sizes = [8, 16, 32, 64], depths = [1, 1, 1, 1],'
        ' out_features = ["stage1", "stage2", "stage3", "stage4"] }, hidden_size = 16, auxiliary_in_channels = 32,'
        " num_labels = 3",
        "SemanticSegmentation",
        inputs=PIXELS.replace("32, 32", "64, 64"),
        dims=BATCH,
    ),
    hf(
        "blip",
        "projection_dim = 16, text_config = { "
        + SMALL_TEXT
        + ", max_position_embeddings = 32 }, vision_config = { "
        + SMALL_VISION
        + " }",
        inputs=TEXT[:-1] + ', { name = "pixel_values", shape = ["batch", 3, 32, 32], keyword = true }]',
    ),
    hf(
        "siglip",
        "text_config = { " + SMALL_TEXT + ", max_position_embeddings = 32 }, vision_config = { " + SMALL_VISION + " }",
        inputs=TEXT[: TEXT.index("},") + 1]
        + ', { name = "pixel_values", shape = ["batch", 3, 32, 32], keyword = true }]',
    ),
    hf("data2vec-vision", SMALL_VISION, inputs=PIXELS, dims=BATCH),
    hf("mobilenet_v2", "image_size = 32, depth_multiplier = 0.35", inputs=PIXELS, dims=BATCH),
    hf("dinov2_with_registers", SMALL_VISION + ", num_register_tokens = 2", inputs=PIXELS, dims=BATCH),
    hf("modernbert-decoder", SMALL_TEXT + ", max_position_embeddings = 64, pad_token_id = 0", "CausalLM"),
]
# TensorFlow-style "same" padding, hybrids, SAM's image encoder, MetaFormers, transformers in transformers
CASES += [
    timm("tf_efficientnet_b0", 96),
    timm("efficientnetv2_rw_t", 96),
    timm("regnetz_b16", 96),
    timm("ghostnetv2_100", 96),
    timm("repvit_m1", 96),
    timm("mobilevitv2_050", 128),
    timm("tresnet_m", 128),
    timm(
        "samvit_base_patch16",
        64,
        img_size="64",
        embed_dim="32",
        depth="2",
        num_heads="2",
        global_attn_indexes="[1]",
        window_size="2",
    ),
    timm("cspdarknet53", 96),
    timm("selecsls42b", 96),
    timm("lcnet_050", 96),
    timm("gernet_s", 96),
    timm("resnetv2_50x1_bit", 96),
    timm("vit_base_r50_s16_224", 64, img_size="64", embed_dim="32", depth="2", num_heads="2"),
    timm("nextvit_small", 96),
    timm("caformer_s18", 96),
    timm("convformer_s18", 96),
    timm("tnt_s_patch16_224", 64, img_size="64"),
    timm("seresnext26d_32x4d", 96),
    timm("efficientvit_l1", 96),
    # timm's families no sweep had built (2026-12-07)
    timm("convmixer_768_32", 64),
    timm("cpubone_t0", 96),
    timm("csatv2", 96),
    timm("hardcorenas_a", 96),
    timm("sam2_hiera_tiny", 96),
    timm("inception_resnet_v2", 96),
    timm("lcnetv2_small", 96),
    timm("lowformer_b0", 96),
    timm("repghostnet_050", 96),
    timm("legacy_seresnet18", 96),
    timm("swiftformer_xs", 96),
    timm("swinv2_tiny_window8_256", 64, img_size="64"),
    timm("vgg11", 64),
    timm("vit_relpos_small_patch16_224", 64, img_size="64"),
    timm("vitamin_small_224", 64, img_size="64"),
    timm("legacy_xception", 96),
    timm("inception_v4", 96),
    timm("nasnetalarge", 96),
    timm("pnasnet5large", 96),
    timm("naflexvit_base_patch16_gap", 64, embed_dim="32", depth="2", num_heads="2"),
    timm("gemma4_vit_167m", 64, embed_dim="32", depth="2", num_heads="2"),
]
# a few of each kind again in bfloat16 ("+bf16"), as LLMs and many vision models ship: weights and float inputs
LOW_PRECISION = (
    "transformers:llama/CausalLM",
    "transformers:qwen2/CausalLM",
    "transformers:mistral/CausalLM",
    "transformers:phi/CausalLM",
    "transformers:gemma/CausalLM",
    "transformers:roberta",
    "timm:resnet18d",
    "timm:deit_tiny_patch16_224",
    "timm:convnext_atto",
    "timm:efficientnet_b0",
    "timm:swin_tiny_patch4_window7_224",
    "torchvision:mobilenet_v3_small",
)
CASES += [
    replace(
        case,
        name=f"{case.name}+bf16",
        kwargs=f'{case.kwargs}, dtype = "bfloat16"',
        inputs=case.inputs.replace("] }", '], dtype = "bfloat16" }'),
    )
    for case in CASES
    if case.name in LOW_PRECISION
]
# images of any height and width ("+hw"), as detectors and segmenters take them
# more architectures: vision backbones, a video transformer, multilingual T5s, LED, audio encoders, character and
# layout models
AUDIO = '[{ name = "input_values", shape = ["batch", "n"] }]'
AUDIO_DIMS = "{ batch = { min = 1, max = 4 }, n = { min = 400, max = 4000, multiple_of = 20 } }"
SMALL_CONV_AUDIO = (
    SMALL_TEXT + ", conv_dim = [16, 16, 16], conv_stride = [5, 2, 2], conv_kernel = [10, 3, 3],"
    " num_conv_pos_embeddings = 16, num_conv_pos_embedding_groups = 4"
)
SMALL_T5 = "d_model = 32, d_kv = 8, d_ff = 37, num_layers = 2, num_decoder_layers = 2, num_heads = 4, vocab_size = 99"
STAGES = "hidden_sizes = [8, 16, 32, 64], depths = [1, 1, 1, 1], image_size = 32"
CASES += [
    hf("convnextv2", STAGES, inputs=PIXELS, dims=BATCH),
    hf("focalnet", "embed_dim = 16, depths = [1, 1, 1, 1], image_size = 32, patch_size = 4", inputs=PIXELS, dims=BATCH),
    hf("pvt_v2", STAGES + ", num_attention_heads = [1, 1, 2, 2]", inputs=PIXELS, dims=BATCH),
    hf("poolformer", STAGES, inputs=PIXELS, dims=BATCH),
    hf(
        "timesformer",
        SMALL_VISION + ", num_frames = 2",
        inputs='[{ name = "pixel_values", shape = ["batch", 2, 3, 32, 32] }]',
        dims=BATCH,
    ),
    hf("roformer", SMALL_TEXT + ", embedding_size = 32"),
    hf("mt5", SMALL_T5, inputs=TEXT_AND_TARGET, dims=BATCH_SEQ_TARGET),
    hf("umt5", SMALL_T5, inputs=TEXT_AND_TARGET, dims=BATCH_SEQ_TARGET),
    hf(
        "led",
        "d_model = 32, encoder_layers = 2, decoder_layers = 2, vocab_size = 99, attention_window = [4, 4],"
        " max_encoder_position_embeddings = 64, max_decoder_position_embeddings = 64, " + SEQ2SEQ,
        inputs=TEXT_AND_TARGET,
        dims=BATCH_SEQ_TARGET,
    ),
    hf("data2vec-audio", SMALL_CONV_AUDIO + ", conv_pos_kernel_size = 3", inputs=AUDIO, dims=AUDIO_DIMS),
    hf("unispeech-sat", SMALL_CONV_AUDIO, inputs=AUDIO, dims=AUDIO_DIMS),
    # Canine downsamples its characters with MaxPool1d, whose torch code fixes the length it is traced at: a fixed sequence
    hf(
        "canine",
        "hidden_size = 32, num_hidden_layers = 2, num_attention_heads = 4, intermediate_size = 37,"
        " downsampling_rate = 2, num_hash_buckets = 64, num_hash_functions = 2, local_transformer_stride = 4",
        inputs=TOKENS_16,
        dims=BATCH,
    ),
    hf("ibert", SMALL_TEXT),
    hf("layoutlm", SMALL_TEXT),
    hf("mra", SMALL_TEXT),
    # transformers' architectures no sweep had built (2026-12-07)
    hf("cohere", SMALL_DECODER, "CausalLM"),
    hf("helium", SMALL_DECODER + ", head_dim = 8", "CausalLM"),
    hf(
        "glm4_moe",
        SMALL_MOE + ", head_dim = 8, n_routed_experts = 4, num_experts_per_tok = 2, moe_intermediate_size = 48,"
        " first_k_dense_replace = 1, n_group = 1, topk_group = 1, pad_token_id = 0",
        "CausalLM",
    ),
    hf(
        "ernie4_5_moe",
        SMALL_MOE + ", head_dim = 8, moe_num_experts = 4, moe_k = 2, moe_intermediate_size = 48",
        "CausalLM",
    ),
    hf("arcee", SMALL_DECODER, "CausalLM"),
    hf("seed_oss", SMALL_DECODER + ", head_dim = 8", "CausalLM"),
    hf("hunyuan_v1_moe", SMALL_MOE + ", head_dim = 8, num_experts = 4, moe_topk = 2", "CausalLM"),
    hf("bitnet", SMALL_DECODER, "CausalLM"),
    hf("minimax", SMALL_MOE + ", head_dim = 8, num_local_experts = 4, num_experts_per_tok = 2", "CausalLM"),
    hf("olmo3", SMALL_DECODER, "CausalLM"),
    hf("vaultgemma", SMALL_DECODER + ", head_dim = 8", "CausalLM"),
    hf(
        "granitemoeshared",
        SMALL_MOE + ", num_local_experts = 4, num_experts_per_tok = 2, shared_intermediate_size = 48",
        "CausalLM",
    ),
    hf(
        "exaone_moe",
        SMALL_MOE + ", head_dim = 8, num_experts = 4, num_experts_per_tok = 2, moe_intermediate_size = 48",
        "CausalLM",
    ),
    hf("jais2", SMALL_DECODER, "CausalLM"),
    hf("flex_olmo", SMALL_MOE + ", num_experts = 4, num_experts_per_tok = 2, pad_token_id = 0", "CausalLM"),
    hf("nemotron_h", SMALL_DECODER, "CausalLM"),
    hf("yoso", SMALL_TEXT),
    hf("rembert", SMALL_TEXT + ", input_embedding_size = 16, output_embedding_size = 16"),
    hf(
        "roc_bert",
        SMALL_TEXT + ", pronunciation_vocab_size = 20, shape_vocab_size = 20, pronunciation_embed_dim = 8,"
        " shape_embed_dim = 8",
    ),
    hf("megatron-bert", SMALL_TEXT),
]
HW = ("timm:resnet18d", "timm:convnext_atto", "transformers:segformer", "transformers:detr/ObjectDetection")
CASES += [
    replace(
        case,
        name=f"{case.name}+hw",
        inputs=case.inputs.replace("3, 224, 224", '3, "h", "w"')
        .replace("3, 32, 32", '3, "h", "w"')
        .replace("3, 64, 64", '3, "h", "w"'),
        dims="{ batch = { min = 1, max = 2 }, h = { min = 64, max = 160, multiple_of = 32 },"
        " w = { min = 64, max = 160, multiple_of = 32 } }",
    )
    for case in CASES
    if case.name in HW
]
# the chunked scans again over a dynamic sequence ("+seq"): padded to whole chunks, the range below one chunk's length
SCANS = ("mamba2", "qwen3_next", "falcon_h1", "bamba", "granitemoehybrid")
CASES += [
    replace(case, name=f"{case.name}+seq", inputs=TEXT, dims=BATCH_SEQ)
    for case in CASES
    if case.name.removeprefix("transformers:").partition("/")[0] in SCANS
]


def spec_text(case: Case, device: str) -> str:
    archs = ""
    if device == "cuda":
        import torch

        archs = 'archs = ["sm_{}{}"]\n'.format(*torch.cuda.get_device_capability())
    return f"""[project]
name = "sweep"

[[graph]]
name = "model"
entry = "models.sweep_models:{case.entry}"
kwargs = {{ {case.kwargs} }}
inputs = {case.inputs}
dims = {case.dims}
atol = {case.tolerance}
rtol = {case.tolerance}

[[target]]
device = "{device}"
{archs}"""


def first_lines(text: str, n: int = 4) -> str:
    """The first lines of shimgen's message (what precedes it is torch's warnings)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip() and not line.startswith("[")]
    lines = lines[next((k for k, line in enumerate(lines) if line.startswith("shimgen")), 0) :]
    return " / ".join(lines[:n])[:600]


def sweep_one(case: Case, device: str, work: Path, gpu: int | None, threads: int) -> tuple[str, str, float]:
    """(outcome, detail, seconds): built and checked with `threads` threads for torch, or where it failed."""
    directory = work / case.name.replace(":", "_").replace("/", "_")
    directory.mkdir(parents=True)
    (directory / "models").symlink_to(work / "models")
    spec = directory / "sweep.toml"
    spec.write_text(spec_text(case, device))
    start = time.perf_counter()
    command = [sys.executable, "-m", "shimgen"]
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": str(gpu)} if gpu is not None else {})}
    env.setdefault("OMP_NUM_THREADS", str(threads))
    built = subprocess.run(
        [*command, "build", str(spec), "--out", str(directory / "out"), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    if built.returncode != 0:
        return "build failed", first_lines(built.stderr), time.perf_counter() - start
    summary = json.loads(built.stdout)
    scalar, onednn_off = summary.get("scalar_kernels", {}), summary.get("onednn_off", {})
    templates_off = summary.get("gemm_templates_off", {})
    freezing_off = summary.get("freezing_off", {})
    checked = subprocess.run(
        [*command, "check", str(spec), "--out", str(directory / "out")],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    seconds = time.perf_counter() - start
    if checked.returncode != 0:
        return "check failed", first_lines(checked.stderr + checked.stdout), seconds
    notes = [f"{unit}: scalar kernels ({why[:200]})" for unit, why in scalar.items()]
    notes += [f"{unit}: without oneDNN ({why[:200]})" for unit, why in onednn_off.items()]
    notes += [f"{unit}: without GEMM templates ({why[:200]})" for unit, why in templates_off.items()]
    notes += [f"{unit}: without freezing ({why[:200]})" for unit, why in freezing_off.items()]
    shutil.rmtree(directory / "out", ignore_errors=True)  # about 0.5 GB a model: a whole sweep would fill a disk
    return "passed", "; ".join(notes), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument(
        "--only", nargs="*", default=None, help="case names; one that names no case picks the cases containing it"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch

    names = {c.name for c in CASES}
    cases = [c for c in CASES if not args.only or any(o == c.name if o in names else o in c.name for o in args.only)]
    work = Path(tempfile.mkdtemp(prefix="shimgen-sweep-"))
    (work / "models").mkdir()
    shutil.copy(HERE / "sweep_models.py", work / "models" / "sweep_models.py")
    shutil.copy(REPO / "projects" / "models" / "torchvision_ops.py", work / "models" / "torchvision_ops.py")
    (work / "models" / "__init__.py").write_text("")
    report = Report(args.out)
    report(
        f"### model_sweep.py --device {args.device}, {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}, {len(cases)} models, {args.jobs} at once\n"
    )
    report("| model | outcome | seconds | detail |\n| --- | --- | --- | --- |")
    threads = max(1, (os.cpu_count() or 1) // args.jobs)  # the cores shared out among the builds
    gpus = itertools.cycle(range(torch.cuda.device_count())) if args.device == "cuda" else itertools.repeat(None)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # reported as they finish
        running = {pool.submit(sweep_one, case, args.device, work, next(gpus), threads): case for case in cases}
        for done in as_completed(running):
            outcome, detail, seconds = done.result()
            report(f"| {running[done].name} | {outcome} | {seconds:.0f} | {detail.replace('|', '/')} |")
    passed = sum("| passed |" in line for line in report.lines)
    report(f"\n{passed} of {len(cases)} passed")


if __name__ == "__main__":
    main()
