"""The RMSNorm ops' one dispatch point, computed in float32 like the reference implementations: one Triton launch on
CUDA (``norm_triton.py``); one C++ call on a CPU in float32 (``cpu_step``); these torch ops elsewhere, and as their
reference (``*_reference``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.kernels import cpu_step
from freetoken.kernels.triton_support import use_triton


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if use_triton(x):
        from freetoken.kernels.norm_triton import rms_norm_triton

        return rms_norm_triton(x, weight, eps)
    if cpu_step.norm_takes(x, weight):
        return cpu_step.add_rms_norm(x, None, weight, eps)[1]
    return rms_norm_reference(x, weight, eps)


def add_rms_norm(
    h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual sum and its norm: ``(h + delta, rms_norm(h + delta))``."""
    if use_triton(h):
        from freetoken.kernels.norm_triton import add_rms_norm_triton

        return add_rms_norm_triton(h, delta, weight, eps)
    if cpu_step.norm_takes(h, weight) and delta.shape == h.shape and cpu_step.available(delta):
        return cpu_step.add_rms_norm(h, delta, weight, eps)
    s = h + delta
    return s, rms_norm_reference(s, weight, eps)


def embed_rms_norm(
    ids: torch.Tensor, embed: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The embeddings of ``ids`` and their norm: ``(embed[ids], rms_norm(embed[ids]))``."""
    if use_triton(embed):
        from freetoken.kernels.norm_triton import embed_rms_norm_triton

        return embed_rms_norm_triton(ids, embed, weight, eps)
    h = F.embedding(ids, embed)
    return h, rms_norm(h, weight, eps)


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """A gated DeltaNet layer's output norm, per row of the last dim: ``rms_norm(x, weight) * silu(z)`` in z's dtype
    (x, float32 or the model dtype, rounded to it first). x, z [T, H, n] -> [T, H, n] contiguous."""
    if use_triton(z):
        from freetoken.kernels.norm_triton import gated_rms_norm_triton

        return gated_rms_norm_triton(x, z, weight, eps)
    return (rms_norm(x.to(z.dtype), weight, eps) * F.silu(z.float())).to(z.dtype)


def gated_rms_norm_reference(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return (rms_norm_reference(x.to(z.dtype), weight, eps) * F.silu(z.float())).to(z.dtype)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)
