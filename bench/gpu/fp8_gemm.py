"""The Triton fp8 grouped GEMM (``slots/gemm_fp8_triton.py``) against its torch reference and the bf16 kernel.

Qwen3-30B-A3B's expert shape (D 2048, I 768), top-8 distinct experts per token, T tokens (decode 1 and 4, prefill
64 and 2048), slots drawn at random from a bank larger than L2 for every call. Each call's fp8 output is checked
against the torch reference (the same slots dequantised to bf16 by ``quant/fp8_block.py``, gather + bmm, or the
per-expert loop for prefill sizes) and against the fp32 reference on the dequantised weights; times are device
µs per call (CUDA-graph replay, events, median). GB/s: weight bytes of the distinct experts read per call
(packed fp8 + scales; bf16 for the bf16 kernel). Also says whether torch has a native scaled grouped GEMM here.

    PYTHONPATH=src python3 bench/gpu/fp8_gemm.py [--tokens 1,4,64,2048] [--slots 96]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from event_time import graph_us, median_ms, slot_routes

from freetoken.experts.slots.gemm import grouped_experts_gather, grouped_experts_loop
from freetoken.experts.slots.gemm_fp8_triton import grouped_experts_fp8_triton
from freetoken.experts.slots.gemm_triton import grouped_experts_triton
from freetoken.experts.slots.weights import SlotWeights
from freetoken.quant import FP8_BLOCK_128

D, INTER, TOP_K = 2048, 768, 8
CALLS = 12


def _time_us(fn: Callable[[int], object], graph: bool, reps: int = 7) -> float:
    if graph:
        return graph_us(fn, CALLS, reps)

    def run() -> None:  # the torch loop reads group counts on the host: not capturable
        for i in range(CALLS):
            fn(i)

    return median_ms(run, reps) * 1e3 / CALLS


def bench_tokens(T: int, S: int, sw: SlotWeights, gub: torch.Tensor, dnb: torch.Tensor) -> str:
    """One table row: T tokens of top-k routes over the S slots."""
    dev = sw.gate_up.device
    fp8_bytes = 3 * D * INTER + (3 * D * INTER // 128**2) * 4
    x = torch.randn(T, D, device=dev).bfloat16()
    w = torch.rand(T, TOP_K, device=dev)
    calls = slot_routes(T, S, TOP_K, CALLS, dev)
    E = min(S, T * TOP_K)
    ours = lambda i: grouped_experts_fp8_triton(x, calls[i][0], calls[i][1], w, sw, E)  # noqa: E731
    bf16 = lambda i: grouped_experts_triton(x, calls[i][0], calls[i][1], w, gub, dnb, E)  # noqa: E731
    torch_ref = grouped_experts_gather if T * TOP_K <= 64 else grouped_experts_loop
    ref = lambda i: torch_ref(x, calls[i][0], calls[i][1], w, sw)  # noqa: E731
    out, want = ours(0), ref(0)
    exact = grouped_experts_loop(x.float(), calls[0][0], calls[0][1], w, sw)  # fp32 on the dequantised weights
    scale = max(1.0, float(exact.abs().max()))
    err_ref, err_exact = float((out - want).abs().max()) / scale, float((out - exact).abs().max()) / scale
    assert err_exact < 2e-2, f"T={T}: fp8 kernel off the fp32 reference by {err_exact:.3g}"
    n_exp = int(calls[0][0].n_groups)
    t8 = _time_us(ours, graph=True)
    tr = _time_us(ref, graph=torch_ref is grouped_experts_gather)
    t16 = _time_us(bf16, graph=True)
    gbps = n_exp * fp8_bytes / (t8 * 1e-6) / 1e9
    return (f"| {T} | {n_exp} | {t8:.1f} | {gbps:.0f} | {tr:.1f} | {tr / t8:.1f}x | {t16:.1f} | {t16 / t8:.2f}x "
            f"| {err_ref:.2e} | {err_exact:.2e} |")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", default="1,4,64,2048")
    p.add_argument("--slots", type=int, default=96, help="experts in the slot bank (fp8 and bf16 copies)")
    args = p.parse_args()
    dev = torch.device("cuda")
    S = args.slots
    g = torch.Generator(device="cpu").manual_seed(0)
    gu, gus = FP8_BLOCK_128.quantize(torch.randn(S + 1, 2 * INTER, D, generator=g) / D**0.5)
    dn, dns = FP8_BLOCK_128.quantize(torch.randn(S + 1, D, INTER, generator=g) / INTER**0.5)
    assert gus is not None and dns is not None
    sw = SlotWeights(gu.to(dev), dn.to(dev), FP8_BLOCK_128, gus.to(dev), dns.to(dev))
    gub, dnb = sw.rows(slice(None), torch.bfloat16)  # the same weights, dequantised: the bf16 kernel's slots
    gub, dnb = gub.contiguous(), dnb.contiguous()
    print(f"# torch: {torch.__version__}; native scaled grouped GEMM: "
          f"{'torch._scaled_grouped_mm present' if hasattr(torch, '_scaled_grouped_mm') else 'absent'} "
          "(not used: it takes fp8 activations and per-row scales, not 128x128 weight blocks with bf16 activations)")
    print("| T | experts/call | fp8 Triton us | GB/s | torch reference us | ref / fp8 | bf16 Triton us | bf16 / fp8 "
          "| max err vs torch ref | max err vs fp32 |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for T in (int(t) for t in args.tokens.split(",")):
        print(bench_tokens(T, S, sw, gub, dnb), flush=True)


if __name__ == "__main__":
    main()
