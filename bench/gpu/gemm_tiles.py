"""The grouped expert GEMM's tiles at decode sizes: device time per call for each setting, one loop.

Qwen3-30B-A3B's expert shape (D 2048, I 768, bf16), k = 8 distinct experts per token, T tokens, slots drawn
at random from a bank larger than the L2 cache for every call (as decode reads them). Calls are captured in
a CUDA graph (as the engine replays MoE layers) and timed with events; every setting's output is checked
against the default's. ``PYTHONPATH=src python3 bench/gpu/gemm_tiles.py [--tokens 1,4]``
"""

from __future__ import annotations

import argparse
import itertools

import torch
from event_time import graph_us

from freetoken.experts.slots.gemm_triton import DEFAULT_TILES, GemmTiles, grouped_experts_triton
from freetoken.experts.slots.plan import group_routes

D, INTER, TOP_K = 2048, 768, 8


def bench_tokens(T: int, gu: torch.Tensor, dn: torch.Tensor, settings: list[tuple[str, GemmTiles]]) -> None:
    dev, S = gu.device, gu.shape[0] - 1
    x = torch.randn(T, D, device=dev).bfloat16()
    w = torch.rand(T, TOP_K, device=dev)
    calls = []  # a different set of slots for every captured call: the weights come from HBM, not L2
    for _ in range(24):
        ids = torch.stack([torch.randperm(S, device=dev)[:TOP_K] for _ in range(T)])  # [T, k] slot ids
        groups = group_routes(ids.reshape(-1), S)
        calls.append((groups, torch.where(groups.valid, groups.eid, torch.full_like(groups.eid, -1))))

    def run(i: int, t: GemmTiles) -> torch.Tensor:
        return grouped_experts_triton(x, calls[i][0], calls[i][1], w, gu, dn, TOP_K * T, t)

    ref = run(0, DEFAULT_TILES)
    print(f"\n# T={T}: {int(calls[0][0].n_groups)} experts, {D}x{INTER} bf16; us per call (graph replay)")
    for name, tiles in settings:
        try:
            err = (run(0, tiles) - ref).abs().max().item()
            us = graph_us(lambda i, t=tiles: run(i, t), 24)
        except Exception as e:  # a setting the compiler refuses
            print(f"{name:32s}  failed: {type(e).__name__}: {str(e)[:80]}")
            continue
        print(f"{name:32s} {us:8.1f} us  max|diff| {err:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,4")
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--bn", default="16,32,64")
    ap.add_argument("--bk", default="64,128,256")
    ap.add_argument("--warps", default="2,4,8")
    a = ap.parse_args()
    dev = torch.device("cuda")
    S = a.slots
    gu = (torch.randn(S + 1, 2 * INTER, D, device=dev) / D**0.5).bfloat16()
    dn = (torch.randn(S + 1, D, INTER, device=dev) / INTER**0.5).bfloat16()
    bns, bks, warps = (list(map(int, v.split(","))) for v in (a.bn, a.bk, a.warps))
    d = DEFAULT_TILES
    settings: list[tuple[str, GemmTiles]] = [("default", d)]
    for bn, bk, w in itertools.product(bns, bks, warps):
        settings.append((f"gate_up bn {bn} bk {bk} w {w}", GemmTiles(bn, bk, d.dn_bn, d.dn_bk, w, d.dn_warps)))
    for bn, bk, w in itertools.product(bns, bks, warps):
        settings.append((f"down    bn {bn} bk {bk} w {w}", GemmTiles(d.gu_bn, d.gu_bk, bn, bk, d.gu_warps, w)))
    for T in map(int, a.tokens.split(",")):
        bench_tokens(T, gu, dn, settings)


if __name__ == "__main__":
    main()
