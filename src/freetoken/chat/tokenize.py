"""Encoding text with special tokens recognised or not, for `tokenizers.Tokenizer` and HF tokenizers."""

from __future__ import annotations

import re
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


def encode_pieces(tokenizer: Any, pieces: list[tuple[str, bool]], specials: list[str]) -> list[int]:
    """Token ids of (text, is_untrusted) pieces.

    An untrusted piece is tokenised apart, with special tokens off, only when a special-token
    string in the joined text touches it (inside it, or across its edge); every other piece is
    tokenised together with its neighbours, so ordinary prompts get exactly the ids of the plain
    rendered string (no BPE seams at message boundaries).
    """
    text = "".join(t for t, _ in pieces)
    hits = _special_spans(text, specials)
    out: list[int] = []
    run: list[str] = []
    pos = 0
    for piece, untrusted in pieces:
        start, pos = pos, pos + len(piece)
        if untrusted and any(a < pos and start < b for a, b in hits):
            out += encode(tokenizer, "".join(run), special=True)
            out += encode(tokenizer, piece, special=False)
            run = []
        else:
            run.append(piece)
    return out + encode(tokenizer, "".join(run), special=True)


def _special_spans(text: str, specials: list[str]) -> list[tuple[int, int]]:
    """Where special-token strings occur (leftmost-longest, as added tokens are matched)."""
    if not specials:
        return []
    pattern = "|".join(re.escape(s) for s in sorted(set(specials), key=len, reverse=True))
    return [m.span() for m in re.finditer(pattern, text)]
