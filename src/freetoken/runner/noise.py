"""Counter-based random numbers for sampling: uniform(seed, step, token) from a 32-bit integer hash,
in plain tensor ops on any device and inside CUDA graphs. A request's draws depend on its seed and on
how many tokens it has generated, never on the batch it shares or the order of requests.

The hash is Wellons' two-multiply mixer with multipliers below 2**31, so every product of a 32-bit
value fits an int64 (no overflow on any device)."""

from __future__ import annotations

import functools

import torch

_M32 = 0xFFFFFFFF


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective mix of int64 values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & _M32
    return x ^ (x >> 15)


@functools.lru_cache(maxsize=8)
def _token_keys(vocab: int, device: torch.device) -> torch.Tensor:
    return mix32(torch.arange(vocab, dtype=torch.int64, device=device) + 0x9E3779B9)


def row_keys(seed_lo: torch.Tensor, seed_hi: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """[B] int64 keys of (seed, step); seeds as two 32-bit halves."""
    return mix32(seed_lo ^ mix32(seed_hi ^ mix32(step & _M32)))


def uniform(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, vocab] float32 in (0, 1), one independent draw per (row, token)."""
    return unit(mix32(keys[:, None] ^ _token_keys(vocab, keys.device)[None, :]))


def unit(h: torch.Tensor) -> torch.Tensor:
    """32-bit hashes as float32 strictly inside (0, 1), from their top 23 bits. (With 24, the top hash's
    2**24 - 1 + 0.5 rounds to 2**24 in float32: a draw of exactly 1.0, whose Gumbel noise is +inf, and a token the
    grammar masked to -inf became NaN, which argmax picks: a token the grammar refuses, a 500.)"""
    return ((h >> 9).float() + 0.5) * (1.0 / (1 << 23))


def split_seed(seed: int) -> tuple[int, int]:
    """A seed in [-2**63, 2**64) as its two 32-bit halves (unsigned 64-bit view)."""
    u = seed & 0xFFFFFFFFFFFFFFFF
    return u & _M32, u >> 32
