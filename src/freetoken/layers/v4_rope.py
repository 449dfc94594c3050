"""DeepSeek-V4's rotary: interleaved pairs (channels 2i and 2i + 1 rotate together) on the *trailing* ``rot`` channels
of a head (``[nope | rope]``), from a per-kind table (``main``: the sliding layers' plain rope; ``compress``: the
compressed layers', their compressors' and indexers', possibly YaRN without its magnitude scale). ``apply(x, pos,
inverse=True)`` rotates by ``-pos`` (the attention output's rope slice, K = V having carried the keys' rotation)."""

from __future__ import annotations

import torch

from freetoken.checkpoint.hf_config import RopeConfig
from freetoken.kernels.triton_support import use_triton
from freetoken.layers.rope import inv_freq_and_scale


class InterleavedRope:
    def __init__(self, rope: RopeConfig, rot: int, max_pos: int, device: torch.device) -> None:
        whole = RopeConfig(rope.theta, rope.kind, {**rope.params, "partial_rotary_factor": 1.0})
        inv, scale = inv_freq_and_scale(whole, rot, max_pos)
        freqs = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv[None, :]  # [P, rot/2]
        self.cos, self.sin = (freqs.cos() * scale).to(device), (freqs.sin() * scale).to(device)
        self.rot = rot

    def apply(self, x: torch.Tensor, positions: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """x [T, ..., hd], positions [T] -> x with its last ``rot`` channels rotated (float32 math, x's dtype)."""
        if use_triton(x):  # one launch for the torch path's ~12
            from freetoken.kernels.rope_triton import interleaved_rope_triton

            return interleaved_rope_triton(x, positions, self.cos, self.sin, self.rot, inverse)
        return self.reference(x, positions, inverse)

    def reference(self, x: torch.Tensor, positions: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """``apply`` in torch ops (every device)."""
        shape = (positions.shape[0],) + (1,) * (x.dim() - 2) + (self.rot // 2,)
        cos, sin = self.cos[positions].view(shape), self.sin[positions].view(shape)
        if inverse:
            sin = -sin
        nope, rope = x[..., : -self.rot], x[..., -self.rot :].float()
        even, odd = rope[..., 0::2], rope[..., 1::2]
        out = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
        return torch.cat((nope, out.to(x.dtype)), dim=-1)
