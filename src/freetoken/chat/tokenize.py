"""Encoding text with special tokens recognised or not, for `tokenizers.Tokenizer` and HF tokenizers."""

from __future__ import annotations

import threading
from typing import Any

_LOCK = threading.Lock()  # `encode_special_tokens` is a setting on the shared Rust tokenizer


def encode(tokenizer: Any, text: str, special: bool) -> list[int]:
    """Token ids of `text` without BOS/EOS. `special=False`: special-token strings are plain text."""
    if not text:
        return []
    if hasattr(tokenizer, "encode_special_tokens"):  # a `tokenizers.Tokenizer`
        with _LOCK:
            before = tokenizer.encode_special_tokens
            tokenizer.encode_special_tokens = not special
            try:
                return list(tokenizer.encode(text, add_special_tokens=False).ids)
            finally:
                tokenizer.encode_special_tokens = before
    with _LOCK:
        return list(tokenizer(text, add_special_tokens=False, split_special_tokens=not special)["input_ids"])


def special_token_strings(tokenizer: Any) -> list[str]:
    """Every added token marked special (what `special=False` stops recognising)."""
    if hasattr(tokenizer, "get_added_tokens_decoder"):
        decoder = tokenizer.get_added_tokens_decoder()
    else:
        decoder = getattr(tokenizer, "added_tokens_decoder", {})
    return [t.content for t in decoder.values() if getattr(t, "special", False)]


def template_token_kwargs(tokenizer: Any) -> dict[str, str]:
    """`bos_token`, `eos_token`, ... as HF passes them to chat templates (HF tokenizers only)."""
    tokens = getattr(tokenizer, "special_tokens_map", None)
    if not isinstance(tokens, dict):
        return {}
    return {k: v for k, v in tokens.items() if isinstance(v, str)}
