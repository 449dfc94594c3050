"""The gated delta rule on CUDA through flash-linear-attention's Triton kernels (``fla-core``, an optional GPU
dependency): ``chunk_gated_delta_rule`` for prefill and mixed steps (variable-length sequences in one launch).
Decode steps run our fused step kernel instead (``deltanet_triton.py``); ``gated_delta.py`` stays the reference and
the path everywhere else.

Chosen per layer at construction (``kernels``): CUDA, a 16-bit model dtype (fla's chunked kernels multiply in TF32
on float32 inputs, which the float32 reference tests would not match), ``FREETOKEN_FLA`` not ``0``, and
``fla.ops.gated_delta_rule`` importable; else the torch path, said once per reason.

Conventions, checked against our reference: q/k enter at the Hk key heads, unnormalised (the kernels L2-normalise
them, eps 1e-6 inside the square root as ``l2norm``; value head i reads key head i // (H/Hk), as
``repeat_interleave``), scale dk^-0.5; ``g`` the log decay in float32, ``beta`` already sigmoid-ed; states
``[N, H, dk, dv]`` float32 (k-first, the ``StatePool.ssm`` layout), read as the initial state and returned as a new
tensor (the caller writes them into the slots). Shapes: T tokens, N sequences.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from freetoken.config import env

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FlaKernels:
    chunk: Callable[..., tuple[torch.Tensor, torch.Tensor]]


@functools.cache
def _import() -> FlaKernels | None:
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as e:
        log.info("fla-core is not importable (%s): the gated DeltaNet layers run our torch ops on CUDA", e)
        return None
    return FlaKernels(chunk_gated_delta_rule)


@functools.cache
def _say_once(message: str) -> None:
    log.info(message)


def kernels(device: torch.device, dtype: torch.dtype) -> FlaKernels | None:
    """fla's kernels for a layer on ``device`` computing in ``dtype``, or None (the torch path)."""
    if device.type != "cuda":
        return None  # never imported off CUDA
    if not env().fla:
        _say_once("FREETOKEN_FLA=0: the gated DeltaNet layers run our torch ops")
        return None
    if dtype not in (torch.bfloat16, torch.float16):
        _say_once(f"a {dtype} model: the gated DeltaNet layers run our torch ops (fla's kernels are for 16-bit)")
        return None
    return _import()


def chunk(
    fla: FlaKernels,
    q: torch.Tensor,  # [T, Hk, dk] model dtype, unnormalised
    k: torch.Tensor,  # [T, Hk, dk]
    v: torch.Tensor,  # [T, H, dv]
    g: torch.Tensor,  # [T, H] float32 log decay
    beta: torch.Tensor,  # [T, H]
    state: torch.Tensor,  # [N, H, dk, dv] float32, each sequence's state before its first token
    lengths: list[int],  # N tokens counts summing to T, each >= 1
) -> tuple[torch.Tensor, torch.Tensor]:  # out [T, H, dv] (model dtype), the states after the last tokens
    kw: dict[str, Any] = {}
    if len(lengths) > 1:
        cu = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)
        kw = {"cu_seqlens": cu.to(q.device, non_blocking=True), "cu_seqlens_cpu": cu}
    out, final = fla.chunk(
        q[None], k[None], v[None], g[None], beta.to(q.dtype)[None], scale=q.shape[-1] ** -0.5,
        initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True, **kw,
    )  # fmt: skip
    return out[0], final


@functools.cache
def warm(fla: FlaKernels, device: torch.device, dtype: torch.dtype, hk: int, h: int, dk: int, dv: int) -> None:
    """Compile (and autotune) the chunked kernel for one layer shape before any step, so the first prefill does not
    pay for it: one sequence and two (varlen)."""
    rng = torch.Generator(device).manual_seed(0)  # not the default generator: sampling may draw from it
    for lengths in ([70], [5, 70]):
        T = sum(lengths)
        q, k = (torch.randn(T, hk, dk, device=device, dtype=dtype, generator=rng) for _ in range(2))
        v = torch.randn(T, h, dv, device=device, dtype=dtype, generator=rng)
        g = -torch.rand(T, h, device=device, generator=rng)
        beta = torch.rand(T, h, device=device, generator=rng)
        state = torch.zeros(len(lengths), h, dk, dv, device=device)
        chunk(fla, q, k, v, g, beta, state, lengths)
