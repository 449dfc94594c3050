"""Per-request token constraints and the allowed-token bitmask they fill.

A constraint (structured output: a grammar, a JSON schema) says which tokens may come next and
follows the tokens sampled. The mask is the grammar engines' packed format: int32 words
``[ceil(V / 32)]``, bit ``t % 32`` of word ``t // 32`` set when token ``t`` is allowed (llguidance
and xgrammar both fill it). ``apply_bitmask`` is the torch reference that applies it to logits;
it works on a batch ``[B, V]`` on any device without a host synchronisation, so a batched GPU
sampler can take it (or a kernel that matches it).
"""

from __future__ import annotations

from typing import Protocol

import torch


class TokenConstraint(Protocol):
    """What the engine asks of a request's constraint around each sampled token."""

    def fill_bitmask(self, bitmask: torch.Tensor) -> None:
        """Writes the tokens allowed next into ``bitmask`` (int32 ``[ceil(V/32)]``, CPU, contiguous)."""
        ...

    def accept(self, token: int) -> bool:
        """Advances over the sampled ``token``; False when the constraint refuses it (then it is broken)."""
        ...

    def is_done(self) -> bool:
        """True once nothing but the end of the sequence may follow."""
        ...

    def error(self) -> str:
        """Why the constraint broke ("" while it is sound)."""
        ...


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def new_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """``[rows, ceil(V/32)]`` int32, every token allowed."""
    return torch.full((rows, bitmask_words(vocab_size)), -1, dtype=torch.int32)


_BITS: dict[torch.device, torch.Tensor] = {}  # per device: made once, outside any CUDA graph capture


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool ``[..., V]``: the bits of ``bitmask [..., W]`` unpacked (token t: bit t % 32 of word t // 32)."""
    bits = _BITS.get(bitmask.device)
    if bits is None:
        bits = _BITS[bitmask.device] = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    unpacked = (bitmask.unsqueeze(-1) >> bits) & 1  # [..., W, 32]
    return unpacked.flatten(-2)[..., :vocab_size].bool()


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Logits ``[V]`` or ``[B, V]`` with every token the mask ``[W]`` / ``[B, W]`` does not allow set to
    -inf (a new tensor: logits made under inference mode cannot change in place); tokens past
    ``32 * W`` are disallowed too."""
    vocab = logits.shape[-1]
    words = bitmask.shape[-1]
    ok = allowed_tokens(bitmask.to(logits.device), min(vocab, 32 * words))
    if 32 * words < vocab:
        pad = torch.zeros((*ok.shape[:-1], vocab - ok.shape[-1]), dtype=torch.bool, device=logits.device)
        ok = torch.cat([ok, pad], dim=-1)
    return logits.masked_fill(~ok, float("-inf"))
