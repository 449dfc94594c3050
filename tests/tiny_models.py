"""Tiny randomly initialised Hugging Face checkpoints for tests (saved with transformers' save_pretrained).

Weights are drawn wide (std 0.2, norm weights in [0.5, 1.5]) so routing, norms and logits are not
degenerate; vocab >= 500; >= 2 layers; >= 8 experts, top-2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from freetoken.bench.tiny_hybrid import randomize

COMMON: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)

FAMILIES = ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "qwen3", "llama"]
MOE_FAMILIES = ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe"]
# gated DeltaNet + gated attention; "qwen3_5_moe_vl" is the text part of Qwen3_5MoeForConditionalGeneration
HYBRID_FAMILIES = ["qwen3_next", "qwen3_5_moe", "qwen3_5_moe_vl"]
# 4 layers, 3 DeltaNet : 1 full attention (the real ratio); 2 value heads per key head; head dims 16 (rotary 4)
HYBRID: dict[str, Any] = dict(
    COMMON, num_hidden_layers=4, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=48, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=16, linear_conv_kernel_dim=4,
)
# DeepSeek-V3-style sigmoid routing (``kernels/route.py``): GLM-4.5+ with and without group limits, MiniMax-M2
SIGMOID_FAMILIES = ["glm4_moe", "glm4_moe_groups", "minimax_m2"]
# 3 layers (GLM: the first dense), head dims 16: GLM rotates half of each head, MiniMax-M2 rotary_dim 8
GLM: dict[str, Any] = dict(
    COMMON, num_hidden_layers=3, head_dim=16, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    n_shared_experts=1, first_k_dense_replace=1,
)  # fmt: skip
VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)


def make_config(family: str) -> Any:
    import transformers as tf

    if family == "qwen3_moe":
        return tf.Qwen3MoeConfig(
            **COMMON, num_hidden_layers=3, head_dim=16, num_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1],
        )
    if family == "qwen2_moe":
        return tf.Qwen2MoeConfig(
            **COMMON, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, norm_topk_prob=False,
        )
    if family == "mixtral":
        return tf.MixtralConfig(**COMMON, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2)
    if family == "olmoe":
        return tf.OlmoeConfig(
            **COMMON, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2, clip_qkv=4.0,
            pad_token_id=0, eos_token_id=1,
        )
    if family == "qwen3":
        return tf.Qwen3Config(**COMMON, num_hidden_layers=2, head_dim=16)
    if family == "llama":
        return tf.LlamaConfig(**COMMON, num_hidden_layers=2, attention_bias=True, mlp_bias=True)
    if family == "gpt_oss":  # sliding and full layers alternate; yarn as shipped (truncate off), scaled down
        return tf.GptOssConfig(
            **{k: v for k, v in COMMON.items() if k != "intermediate_size"}, intermediate_size=32,
            num_hidden_layers=4, head_dim=16, num_local_experts=8, num_experts_per_tok=2, sliding_window=8,
            rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0, beta_fast=32.0, beta_slow=1.0,
                                 truncate=False, original_max_position_embeddings=128),
        )
    if family == "qwen3_next":
        return tf.Qwen3NextConfig(**HYBRID, norm_topk_prob=True)
    if family == "qwen3_5_moe":
        return tf.Qwen3_5MoeTextConfig(**{k: v for k, v in HYBRID.items() if k != "intermediate_size"})
    if family == "qwen3_5_moe_vl":
        text = {k: v for k, v in HYBRID.items() if k not in ("intermediate_size", "tie_word_embeddings")}
        return tf.Qwen3_5MoeConfig(text_config=text, vision_config=VISION, tie_word_embeddings=False)
    if family == "glm4_moe":  # GLM-4.5's switches: qk norms, q/k/v biases, scaled top-k, no groups
        return tf.Glm4MoeConfig(**GLM, use_qk_norm=True, attention_bias=True, routed_scaling_factor=2.5)
    if family == "glm4_moe_groups":  # group-limited (1 of 2 groups of 4), weights not renormalised
        return tf.Glm4MoeConfig(**GLM, n_group=2, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.5)
    if family == "minimax_m2":
        return tf.MiniMaxM2Config(
            **COMMON, num_hidden_layers=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2, rotary_dim=8,
            bos_token_id=None, eos_token_id=None,
        )  # fmt: skip
    raise ValueError(family)


def make_model(family: str, seed: int = 0) -> Any:
    return _random_model(make_config(family), seed)


def gpt_oss_model(seed: int) -> Any:
    """The tiny gpt-oss with sinks large enough to matter (its init draws them at std 0.2) and gate/up weights wide
    enough that the activation's clamp binds on some tokens."""
    model = make_model("gpt_oss", seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.copy_(torch.randn(p.shape, generator=g) + 1.0)
            elif name.endswith("gate_up_proj"):
                p.mul_(4.0)
    return model


def _random_model(cfg: Any, seed: int) -> Any:
    import transformers as tf

    torch.manual_seed(seed)
    if isinstance(cfg, tf.Qwen3_5MoeConfig):  # the multimodal wrapper (AutoModelForCausalLM has no entry for it)
        model = tf.Qwen3_5MoeForConditionalGeneration(cfg).float()
    elif isinstance(cfg, tf.Qwen3_5MoeTextConfig):
        model = tf.Qwen3_5MoeForCausalLM(cfg).float()
    else:
        model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model = randomize(model, seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # a correction bias as wide as the scores' spread: it moves choices
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
    return model


def save_checkpoint(
    family: str, directory: Path, seed: int = 0, max_shard_size: str | None = None, tokenizer: bool = False
) -> Any:
    model = make_model(family, seed)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kwargs)
    if tokenizer:
        save_tokenizer(directory)
    return model


CHAT_TEMPLATE = (
    "{%- for m in messages %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + (m['content'] if m['content'] is string else '') + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def save_tokenizer(directory: Path, vocab_size: int = 500) -> Any:
    """A byte-level BPE tokenizer trained on a little English, with Qwen-style special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "The quick brown fox jumps over the lazy dog. Hello world, how are you today?",
        "What is the weather in Paris? Add 23 and 19. The answer is 42. Thinking about it carefully.",
        "def main(): print('hello') # code, numbers 0123456789 and symbols {}[]()<>:;,.!?",
        "Café, naïve, 東京, emoji 🙂 — unicode text must decode cleanly.",
    ] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(ADDED), special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens(ADDED)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE
    )
    fast.save_pretrained(directory)
    return fast


def make_fp8_config() -> Any:
    """A Qwen3-MoE whose projections are whole 128x128 blocks (k/v [64, 128] are not: they stay float, as the layers
    real FP8 releases leave unquantised do). 3 layers, the middle one dense."""
    import transformers as tf

    return tf.Qwen3MoeConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, max_position_embeddings=512, tie_word_embeddings=False, num_hidden_layers=3, num_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=128, norm_topk_prob=True, mlp_only_layers=[1],
    )  # fmt: skip


FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}


def make_fp8_glm_config() -> Any:
    """A GLM-4.5 (group-limited sigmoid routing, first layer dense, a shared expert) whose projections are whole
    128x128 blocks but k/v (FP8 as GLM-4.5-FP8 ships it: attention, dense, shared and routed experts)."""
    import transformers as tf

    return tf.Glm4MoeConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, max_position_embeddings=512, tie_word_embeddings=False, num_hidden_layers=3, n_routed_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=128, n_shared_experts=1, first_k_dense_replace=1, n_group=2,
        topk_group=1, routed_scaling_factor=2.5, use_qk_norm=True, attention_bias=True,
    )  # fmt: skip


def save_fp8_checkpoint(directory: Path, seed: int = 0, cfg: Any = None) -> None:
    """A fake FP8-block checkpoint as the Qwen3/DeepSeek FP8 releases ship it: every projection of whole 128x128
    blocks in float8_e4m3fn with a float32 ``weight_scale_inv`` beside it, per-expert names, ``quantization_config``
    in config.json. The weights are random (std 0.2) rounded by the reference quantiser."""
    import json

    from safetensors.torch import load_file, save_file

    from freetoken.quant import FP8_BLOCK_128

    _random_model(cfg if cfg is not None else make_fp8_config(), seed).save_pretrained(directory)
    state = load_file(directory / "model.safetensors")
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if name.endswith("proj.weight") and t.dim() == 2 and t.shape[0] % 128 == 0 and t.shape[1] % 128 == 0:
            q, s = FP8_BLOCK_128.quantize(t)
            assert s is not None
            out[name], out[name + "_scale_inv"] = q, s
        else:
            out[name] = t
    save_file(out, directory / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((directory / "config.json").read_text())
    cfg["quantization_config"] = dict(FP8_CONFIG)
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))


def load_fp8_reference(directory: Path) -> Any:
    """transformers' own dequantised model of a fake FP8 checkpoint (``FineGrainedFP8Config(dequantize=True)``,
    float32 on the CPU)."""
    import transformers as tf

    qc = tf.FineGrainedFP8Config(dequantize=True)
    return tf.AutoModelForCausalLM.from_pretrained(directory, quantization_config=qc, dtype=torch.float32).eval()
