"""Rotary position embeddings (default, linear, llama3, yarn, proportional), rotate-half convention."""

from __future__ import annotations

import math

import torch

from freetoken.checkpoint.hf_config import RopeConfig
from freetoken.kernels.triton_support import use_triton


def inv_freq_and_scale(rope: RopeConfig, head_dim: int, max_pos: int) -> tuple[torch.Tensor, float]:
    """Returns the inverse frequencies [head_dim/2] and the attention scaling of cos/sin."""
    base = rope.theta
    if rope.kind == "proportional":  # Gemma-4's full layers: a share of the frequencies, exponents over the whole
        # head; the rest 0 (cos 1, sin 0: those dims pass unrotated); rotate-half over the whole head
        angles = int(float(rope.params.get("partial_rotary_factor", 1.0)) * head_dim // 2)
        rot = 1.0 / (base ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).float() / head_dim))
        return torch.cat((rot, torch.zeros(head_dim // 2 - angles))) / float(rope.params.get("factor", 1.0)), 1.0
    dim = int(head_dim * float(rope.params.get("partial_rotary_factor", 1.0)))
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    p = rope.params
    if rope.kind == "default":
        return inv, 1.0
    if rope.kind == "linear":
        return inv / float(p["factor"]), 1.0
    if rope.kind == "llama3":
        factor, lo, hi = float(p["factor"]), float(p["low_freq_factor"]), float(p["high_freq_factor"])
        old = float(p["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= old / hi) & (wavelen <= old / lo)
        return torch.where(is_mid, mid, scaled), 1.0
    if rope.kind == "yarn":
        return _yarn(inv, base, dim, p, max_pos)
    raise ValueError(f"unsupported rope type {rope.kind!r} (supported: default, linear, llama3, yarn, proportional)")


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude scale ``0.1 * mscale * ln(factor) + 1`` (1 without stretch)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(inv: torch.Tensor, base: float, dim: int, p: dict, max_pos: int) -> tuple[torch.Tensor, float]:
    factor = float(p["factor"])
    old = float(p.get("original_max_position_embeddings", max_pos))
    beta_fast, beta_slow = float(p.get("beta_fast") or 32), float(p.get("beta_slow") or 1)
    mscale = p.get("attention_factor")
    if mscale is None:  # DeepSeek's configs: the ratio of mscale and mscale_all_dim (the rest goes to the softmax)
        ms, ms_all = p.get("mscale"), p.get("mscale_all_dim")
        mscale = yarn_mscale(factor, ms) / yarn_mscale(factor, ms_all) if ms and ms_all else yarn_mscale(factor)
    mscale = float(mscale)
    truncate = bool(p.get("truncate", True))

    def correction_dim(rot: float) -> float:
        return (dim * math.log(old / (rot * 2 * math.pi))) / (2 * math.log(base))

    lo, hi = correction_dim(beta_fast), correction_dim(beta_slow)
    low = float(max(math.floor(lo) if truncate else lo, 0))
    high = float(min(math.ceil(hi) if truncate else hi, dim - 1))
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    interp = inv / factor
    return interp * (1 - extrapolation) + inv * extrapolation, mscale


class Rotary:
    """Precomputed cos/sin tables; ``apply`` rotates q/k at given positions."""

    def __init__(self, rope: RopeConfig, head_dim: int, max_pos: int, device: torch.device) -> None:
        inv, scale = inv_freq_and_scale(rope, head_dim, max_pos)
        t = torch.arange(max_pos, dtype=torch.float32)
        freqs = torch.outer(t, inv)
        emb = torch.cat((freqs, freqs), dim=-1)  # [P, rot_dim]
        self.cos = (emb.cos() * scale).to(device)
        self.sin = (emb.sin() * scale).to(device)
        self.rot_dim = emb.shape[-1]
        self._last: tuple[torch.Tensor, torch.dtype, torch.Tensor, torch.Tensor] | None = None

    def _tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [T, 1, rot] at ``positions``. On a CPU looked up once per step (every layer passes the same
        tensor); on CUDA each time (a graph's static positions are rewritten in place, and lookups are cheap)."""
        last = self._last
        if last is not None and last[0] is positions and last[1] == dtype:
            return last[2], last[3]
        cos = self.cos[positions].unsqueeze(1).to(dtype)
        sin = self.sin[positions].unsqueeze(1).to(dtype)
        self._last = None if positions.is_cuda else (positions, dtype, cos, sin)
        return cos, sin

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [T, H, hd], positions [T] -> rotated x (same dtype)."""
        if use_triton(x):  # one launch for the ~9 below
            from freetoken.kernels.rope_triton import half_rope_triton

            return half_rope_triton(x, positions, self.cos, self.sin)
        return self.reference(x, positions)

    def reference(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``apply`` in torch ops (every device)."""
        cos, sin = self._tables(positions, x.dtype)
        rot, rest = x[..., : self.rot_dim], x[..., self.rot_dim :]
        half = self.rot_dim // 2
        rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
        out = rot * cos + rotated * sin
        return torch.cat((out, rest), dim=-1) if rest.numel() else out
