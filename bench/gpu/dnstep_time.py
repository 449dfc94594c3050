"""One gated DeltaNet layer's decode step at Qwen3.6-35B-A3B's shape (D 2048, Hk 16, H 32, dk = dv = 128, K 4, bf16)
on CUDA, replayed from a captured graph: µs per layer forward (in_proj GEMM .. out GEMM) with the fused kernels vs
the torch reference ops (``deltanet_step_reference`` + the torch gated norm: the decode path before the fused
kernels, less fla's recurrent kernel), and the step kernel alone per dv block size. Batch 1 and 4. Seconds
(FREETOKEN_FLA=0: no fla warm-up for the prefill kernel, which nothing here runs)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from unittest import mock

import torch

from freetoken.cache.state_pool import StatePool, StateShape
from freetoken.kernels import gated_delta, norm_triton
from freetoken.kernels.deltanet_triton import deltanet_step_triton
from freetoken.layers.attention import AttnBatch
from freetoken.layers.deltanet import DeltaNetWeights, GatedDeltaNet

D, HK, H, DK, DV, K, DT, DEV = 2048, 16, 32, 128, 128, 4, torch.bfloat16, torch.device("cuda")
C = 2 * HK * DK + H * DV


def _replay_us(fn: Callable[[], object], n: int = 200) -> float:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (n * 10)


def main() -> None:
    g = torch.Generator(DEV).manual_seed(0)

    def rnd(*shape: int, scale: float = 0.02) -> torch.Tensor:
        return (torch.randn(shape, generator=g, device=DEV) * scale).to(DT)

    w = DeltaNetWeights(rnd(C + H * DV + 2 * H, D), rnd(C, K, scale=0.5), torch.rand(H, device=DEV),
                        torch.rand(H, device=DEV), rnd(DV, scale=1.0) + 1, rnd(D, H * DV))  # fmt: skip
    print("| batch | layer fused µs | layer torch µs | step kernel µs by dv block (8 / 16 / 32 / 64) |")
    print("|---|---|---|---|")
    for B in (1, 4):
        _row(w, B, rnd(B, D, scale=1.0))


def _row(w: DeltaNetWeights, B: int, x: torch.Tensor) -> None:
    layer = GatedDeltaNet(w, 0, HK, H, DK, DV, 1e-6)
    pool = StatePool(StateShape(1, C, K - 1, H, DK, DV), 16, DT, DEV)
    slots = torch.arange(3, 3 + B, device=DEV)
    batch = AttnBatch(torch.full((B,), 7, device=DEV), torch.zeros(B, dtype=torch.long, device=DEV),
                      decode=object(), state_slots=slots)  # fmt: skip
    fused = _replay_us(lambda: layer.forward(x, batch, pool))
    with mock.patch.object(norm_triton, "gated_rms_norm_triton", _torch_gated_norm), \
            mock.patch.object(gated_delta, "use_triton", lambda _: False):  # the step's torch reference
        torch_ops = _replay_us(lambda: layer.forward(x, batch, pool))
    mixed, _, b, a = torch.nn.functional.linear(x, w.in_proj).split([C, H * DV, H, H], dim=-1)

    def step(bv: int) -> None:
        deltanet_step_triton(mixed, b, a, pool.conv[0], pool.ssm[0], slots, batch.positions, w.conv, w.A_log,
                             w.dt_bias, HK, DK, out_dtype=DT, block_v=bv)  # fmt: skip

    kernel = [_replay_us(functools.partial(step, bv)) for bv in (8, 16, 32, 64)]
    print(f"| {B} | {fused:.1f} | {torch_ops:.1f} | {' / '.join(f'{t:.1f}' for t in kernel)} |")


def _torch_gated_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    from freetoken.kernels.norm import rms_norm

    return (rms_norm(x.to(z.dtype), weight, eps) * torch.nn.functional.silu(z.float())).to(z.dtype)


if __name__ == "__main__":
    main()
