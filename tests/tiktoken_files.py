"""A small but real Kimi-style tokenizer directory for tests: ``tiktoken.model`` (a byte-level BPE trained here, with
Kimi's pre-tokenizer, on a few kilobytes of mixed text: English, code, Chinese, Cyrillic, emoji, digits), and a
``tokenizer_config.json`` laid out as Kimi-Linear's (``added_tokens_decoder`` from the first id past the ranks, two
tokens past the 256-token block, ``auto_map`` naming ``tokenization_kimi``, a chat template in Kimi's markup).

``reference_encode`` is the ``tiktoken`` library's encoding as Kimi's wrapper drives it (special tokens split out by
the HF added-token trie first, then 400,000-character chunks, 25,000-character runs, ``allowed_special="all"``):
the oracle the converted tokenizer is held to."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from freetoken.checkpoint.tiktoken_tokenizer import KIMI_PATTERN, RESERVED_SPECIAL_TOKENS, byte_to_unicode

CORPUS = (
    "The quick brown fox jumps over the lazy dog. It's what we'd do; they're sure you'll see. "
    "In 2024 the model read 1234567 tokens at 3.14159 per second!\n\n"
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
    'for (int i = 0; i < 10; ++i) { printf("%d\\n", i); }\n'
    "月之暗面的模型能够理解中文，也能写代码。我们今天讨论分词器的实现。\n"
    "Привет, мир! Это тест токенизатора.  Ünïcödé façade naïve café.\n"
    "Emoji: 😀🚀✨ and symbols ∑∫√ ≤≥ → ←.\n"
    "HTTPServer JSONDecoder camelCaseName snake_case_name SCREAMING_CASE.\n"
)
# the ids past the BPE ranks the config names (offsets from the first), as Kimi's do: the rest is reserved fill
NAMED = {
    0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>", 6: "<|start_header_id|>",
    7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>", 11: "<|tool_calls_section_begin|>",
    12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>", 14: "<|tool_call_argument_begin|>",
    15: "<|tool_call_end|>", 17: "<|im_middle|>", 254: "[UNK]", 255: "[PAD]",
    256: "<|media_begin|>", 257: "<|media_end|>",  # past the block: the tokenizer outgrows the model's vocab_size
}  # fmt: skip
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "<|im_system|>system<|im_middle|>You are a helpful assistant.<|im_end|>"
    "{%- endif -%}"
    "{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>"
    "{%- elif message['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- else -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
    "{{ message['content'] }}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


def train_ranks(merges: int = 300, texts: list[str] | None = None) -> dict[bytes, int]:
    """Byte-level BPE ranks: the 256 bytes (in byte order), then each token a merge made, in merge order, trained on
    ``texts`` (default: ``CORPUS``)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(KIMI_PATTERN), behavior="isolated"),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )  # fmt: skip
    trainer = trainers.BpeTrainer(
        vocab_size=256 + merges, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(texts or [CORPUS] * 3, trainer)
    unicode_to_byte = {u: b for b, u in byte_to_unicode().items()}
    ranks = {bytes([b]): b for b in range(256)}
    for a, b in json.loads(tok.to_str())["model"]["merges"]:
        token = bytes(unicode_to_byte[c] for c in (a + b))
        ranks.setdefault(token, len(ranks))
    return ranks


def write_tiktoken_model(path: Path, ranks: dict[bytes, int]) -> None:
    lines = [f"{base64.b64encode(t).decode()} {r}" for t, r in sorted(ranks.items(), key=lambda kv: kv[1])]
    path.write_text("\n".join(lines) + "\n")


def kimi_config(n_base: int, named: dict[int, str] = NAMED) -> dict[str, Any]:
    decoder = {
        str(n_base + off): {"content": c, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                            "special": True}
        for off, c in named.items()
    }  # fmt: skip
    return {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|start_header_id|>",
                                      "<|end_header_id|>", "[EOT]", "<|im_system|>", "<|im_middle|>"],
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False, "model_max_length": 1048576,
        "tokenizer_class": "TikTokenTokenizer",
    }  # fmt: skip


def write_kimi_tokenizer(directory: Path, merges: int = 300) -> dict[bytes, int]:
    """``tiktoken.model`` and ``tokenizer_config.json`` into ``directory``; the ranks written."""
    directory.mkdir(parents=True, exist_ok=True)
    ranks = train_ranks(merges)
    write_tiktoken_model(directory / "tiktoken.model", ranks)
    (directory / "tokenizer_config.json").write_text(json.dumps(kimi_config(len(ranks)), indent=2))
    return ranks


def specials_of(n_base: int, reserved: int = RESERVED_SPECIAL_TOKENS, named: dict[int, str] = NAMED) -> dict[str, int]:
    """Every special token tiktoken is given: the named ones and the reserved fill, as Kimi's wrapper makes them."""
    names = {n_base + off: c for off, c in named.items()}
    end = max(n_base + reserved, max(names) + 1)
    return {names.get(i, f"<|reserved_token_{i}|>"): i for i in range(n_base, end)}


def reference_encoding(ranks: dict[bytes, int], specials: dict[str, int] | None = None) -> Any:
    """The ``tiktoken`` library's ``Encoding`` as Kimi's wrapper builds it (``specials``: default ``specials_of``)."""
    import tiktoken

    specials = specials_of(len(ranks)) if specials is None else specials
    return tiktoken.Encoding(name="kimi-test", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def _runs(s: str, limit: int) -> Iterator[str]:
    """Kimi's cut: each run of whitespace (``str.isspace``) or non-whitespace in pieces of at most ``limit``."""
    run, is_space, start = 0, s[:1].isspace(), 0
    for i, ch in enumerate(s):
        if ch.isspace() != is_space:
            run, is_space = 1, ch.isspace()
        else:
            run += 1
            if run > limit:
                yield s[start:i]
                start, run = i, 1
    yield s[start:]


def reference_encode(enc: Any, text: str, chunk: int = 400_000, run: int = 25_000) -> list[int]:
    """What Kimi's tokenizer gives through transformers: special tokens split out, then each stretch between them
    cut into chunks and runs, each piece encoded by tiktoken with every special token allowed."""
    specials = sorted(enc.special_tokens_set, key=len, reverse=True)
    out: list[int] = []
    for part in re.split("(" + "|".join(map(re.escape, specials)) + ")", text):
        if part in enc.special_tokens_set:
            out.append(enc.encode_single_token(part))
            continue
        for i in range(0, len(part), chunk):
            for piece in _runs(part[i : i + chunk], run):
                out.extend(enc.encode(piece, allowed_special="all"))
    return out
