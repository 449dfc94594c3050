"""Tiny randomly initialised Hugging Face checkpoints for tests (saved with transformers' save_pretrained).

Weights are drawn wide (std 0.2, norm weights in [0.5, 1.5]) so routing, norms and logits are not
degenerate; vocab >= 500; >= 2 layers; >= 8 experts, top-2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

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
    raise ValueError(family)


def make_model(family: str, seed: int = 0) -> Any:
    import transformers as tf

    torch.manual_seed(seed)
    cfg = make_config(family)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


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
