"""A tiny random Qwen3.5-MoE checkpoint for CPU benchmarks and tests of the hybrid paths: 4 layers (3 gated
DeltaNet : 1 gated attention, the real ratio), hidden 64, 8 experts top-2, saved with transformers'
``save_pretrained``; a byte-level BPE tokenizer with Qwen's special tokens and a Qwen3.5-style chat template
(thinking blocks, tool calls in Qwen3-Coder's XML form, tool outputs in ``<tool_response>``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

# 2 value heads per key head; head dims 16 (rotary 4); the real model's layer types and norms
SHAPE: dict[str, Any] = dict(
    vocab_size=512, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
    num_hidden_layers=4, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=48, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=16, linear_conv_kernel_dim=4,
)  # fmt: skip

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
            "<tool_response>", "</tool_response>"]  # fmt: skip

# Qwen3.5's layout: tools as JSON in the system turn, calls as <function=...><parameter=...> XML, tool outputs as
# user turns; an assistant turn's reasoning_content is rendered whenever the client sends it (which turns keep
# their thinking is the harness's choice, the edit this template must not hide).
CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n"
    "{% endif %}# Tools\n\nYou have access to the following functions:\n\n<tools>"
    "{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\n\n"
    "If you choose to call a function reply in the following format:\n<tool_call>\n<function=example>\n"
    "<parameter=name>\nvalue\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- set content = m.content if m.content is string else '' %}"
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}"
    "<|im_start|>{{ m.role }}\n{{ content }}<|im_end|>\n"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant\n"
    "{%- if m.reasoning_content is string and m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n"
    "{%- endif %}{{ content }}"
    "{%- for tc in m.tool_calls or [] %}{% set f = tc.function or tc %}\n<tool_call>\n<function={{ f.name }}>\n"
    "{%- for k, v in (f.arguments if f.arguments is mapping else {}) | items %}"
    "<parameter={{ k }}>\n{{ v if v is string else v | tojson }}\n</parameter>\n{% endfor %}"
    "</function>\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ content }}\n</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{%- endif %}"
)


def make_model(max_position_embeddings: int = 65536, seed: int = 0) -> Any:
    import transformers as tf

    cfg = tf.Qwen3_5MoeTextConfig(**SHAPE, max_position_embeddings=max_position_embeddings)
    return randomize(tf.Qwen3_5MoeForCausalLM(cfg).float(), seed)


def randomize(model: Any, seed: int) -> Any:
    """Weights drawn wide (std 0.2, norm weights in [0.5, 1.5]) so routing, norms and logits are not degenerate."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


def save_tokenizer(directory: Path, corpus: Sequence[str], vocab_size: int = 500) -> Any:
    """A byte-level BPE tokenizer trained on ``corpus`` (so its text tokenises about as densely as a real one's),
    with Qwen's special tokens and ``CHAT_TEMPLATE``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(list(corpus), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", additional_special_tokens=SPECIALS[1:]
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    return fast


def save_checkpoint(directory: Path, corpus: Sequence[str], seed: int = 0) -> Path:
    """The tiny model and its tokenizer in ``directory`` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    make_model(seed=seed).save_pretrained(directory)
    save_tokenizer(directory, corpus)
    return directory
