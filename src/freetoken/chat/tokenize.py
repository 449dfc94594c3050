"""Encoding text with special tokens recognised or not, for `tokenizers.Tokenizer` and HF tokenizers."""

from __future__ import annotations

import re
import threading
from typing import Any

_COPIES_LOCK = threading.Lock()
_COPIES: dict[int, tuple[Any, Any, Any]] = {}  # id(tokenizer) -> (tokenizer, specials on, specials off)


def encode(tokenizer: Any, text: str, special: bool) -> list[int]:
    """Token ids of `text` without BOS/EOS. `special=False`: special-token strings are plain text.

    Safe from any thread at once, and long texts do not stall the others: each mode has its own copy of
    the Rust tokenizer (`encode_special_tokens` is a setting on it, so one shared copy would need a
    lock that one huge prompt holds against every other request), and `encode_batch` releases the GIL
    while it works (`encode` holds it).
    """
    if not text:
        return []
    backends = _backends(tokenizer)
    if backends is None:  # a tokenizer without a Rust backend: its own call, one at a time
        with _COPIES_LOCK:
            return list(tokenizer(text, add_special_tokens=False, split_special_tokens=not special)["input_ids"])
    on, off = backends
    return list((on if special else off).encode_batch([text], add_special_tokens=False)[0].ids)


def _backends(tokenizer: Any) -> tuple[Any, Any] | None:
    """The two copies of a `tokenizers.Tokenizer` (or an HF tokenizer's backend), made once."""
    entry = _COPIES.get(id(tokenizer))
    if entry is not None and entry[0] is tokenizer:
        return entry[1], entry[2]
    from tokenizers import Tokenizer

    backend = tokenizer if isinstance(tokenizer, Tokenizer) else getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    with _COPIES_LOCK:
        on, off = Tokenizer.from_str(backend.to_str()), Tokenizer.from_str(backend.to_str())
        on.encode_special_tokens, off.encode_special_tokens = False, True
        _COPIES[id(tokenizer)] = (tokenizer, on, off)  # keeps the tokenizer alive, so its id stays its own
    return on, off


def added_token_strings(tokenizer: Any) -> list[tuple[str, bool]]:
    """Every added token's text, and whether it is marked special."""
    if hasattr(tokenizer, "get_added_tokens_decoder"):
        decoder = tokenizer.get_added_tokens_decoder()
    else:
        decoder = getattr(tokenizer, "added_tokens_decoder", {})
    return [(t.content, bool(getattr(t, "special", False))) for t in decoder.values()]


def special_token_strings(tokenizer: Any) -> list[str]:
    """Every added token marked special (what `special=False` stops recognising)."""
    return [text for text, special in added_token_strings(tokenizer) if special]


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
    touched = touched_pieces([len(t) for t, _ in pieces], _special_spans(text, specials))
    out: list[int] = []
    run: list[str] = []
    for (piece, untrusted), touch in zip(pieces, touched):
        if untrusted and touch:
            out += encode(tokenizer, "".join(run), special=True)
            out += encode(tokenizer, piece, special=False)
            run = []
        else:
            run.append(piece)
    return out + encode(tokenizer, "".join(run), special=True)


def touched_pieces(lengths: list[int], spans: list[tuple[int, int]]) -> list[bool]:
    """For consecutive pieces of these lengths, whether any of ``spans`` (sorted, non-overlapping
    [a, b) ranges of the joined text) overlaps each. One pass over both lists: O(pieces + spans)."""
    out: list[bool] = []
    j, pos = 0, 0
    for n in lengths:
        start, pos = pos, pos + n
        while j < len(spans) and spans[j][1] <= start:  # spans ending before this piece touch no later one
            j += 1
        out.append(j < len(spans) and spans[j][0] < pos)
    return out


def _special_spans(text: str, specials: list[str]) -> list[tuple[int, int]]:
    """Where special-token strings occur (leftmost-longest, as added tokens are matched)."""
    if not specials:
        return []
    pattern = "|".join(re.escape(s) for s in sorted(set(specials), key=len, reverse=True))
    return [m.span() for m in re.finditer(pattern, text)]


# Normalizers that never shrink text by more than this factor (NFC composes a letter and its marks).
_NORMALIZER_SHRINK = {"NFC": 4, "NFKC": 4, "NFD": 1, "NFKD": 1, "Lowercase": 1, "Prepend": 1, "ByteLevel": 1}


def chars_per_token_bound(tokenizer: Any) -> int | None:
    """An upper bound on the characters of text one token can stand for, so that a prompt of C
    characters has at least C // bound tokens; None where no bound is known (a normalizer that may
    delete text, an unknown-token model that swallows whole spans).

    It lets the server refuse a prompt far past the context without tokenising it. Holds for BPE
    models that cannot emit an unknown token (byte-level or byte-fallback): a token's vocabulary text
    is at least as long as the characters it covers, after normalisation.
    """
    import json

    backend = tokenizer if hasattr(tokenizer, "to_str") else getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    cfg = json.loads(backend.to_str())
    model = cfg.get("model") or {}
    byte_level = "ByteLevel" in json.dumps(cfg.get("pre_tokenizer")) or model.get("byte_fallback")
    if model.get("type") != "BPE" or not byte_level:
        return None
    shrink = _shrink(cfg.get("normalizer"))
    if shrink is None:
        return None
    longest = max((len(t) for t in backend.get_vocab(with_added_tokens=True)), default=1)
    return max(1, longest) * shrink


def _shrink(normalizer: dict[str, Any] | None) -> int | None:
    if normalizer is None:
        return 1
    kind = normalizer.get("type")
    if kind == "Sequence":
        factor = 1
        for n in normalizer.get("normalizers", []):
            f = _shrink(n)
            if f is None:
                return None
            factor *= f
        return factor
    if kind == "Replace":  # Llama-style " " -> "▁": a plain string for one at least as long
        pattern, content = (normalizer.get("pattern") or {}).get("String"), normalizer.get("content")
        if isinstance(pattern, str) and isinstance(content, str) and content:
            return max(1, -(-len(pattern) // len(content)))
        return None
    return _NORMALIZER_SHRINK.get(str(kind))
