"""The Triton FP4 grouped GEMM (``slots/gemm_fp4_triton.py``, MXFP4 and NVFP4) against the bf16 kernel on the same
weights, and against another tree's FP4 kernel (``--before DIR``: that tree's ``gemm_fp4_triton.py``, loaded beside
this one) in the same loop; then a sweep of one token's tiles.

Shapes: Qwen3-30B-A3B's experts (D 2048, I 768, top-8) and gpt-oss-20b's (D 2880, I 2880, top-4, its biased clamped
activation), T tokens (decode 1 and 4, prefill 64), slots drawn at random from a bank larger than L2 for every call.
Every output is checked against the fp32 reference on the dequantised weights (``grouped_experts_loop``); times are
device µs per call (CUDA-graph replay, events, median). GB/s: packed bytes of the distinct experts read per call
(codes + scale rows; bf16 bytes for the bf16 kernel).

    PYTHONPATH=src python3 bench/gpu/fp4_gemm.py [--tokens 1,4,64] [--before .before/src] [--no-tiles]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
from pathlib import Path
from types import ModuleType

import torch
from event_time import graph_us, slot_routes

from freetoken.experts.reference import ExpertAct
from freetoken.experts.slots import gemm_fp4_triton
from freetoken.experts.slots.gemm import grouped_experts_loop
from freetoken.experts.slots.gemm_triton import GemmTiles, grouped_experts_triton
from freetoken.experts.slots.weights import SlotWeights
from freetoken.quant import format_by_name

CALLS = 12
SHAPES = {"qwen3": (2048, 768, 8, False), "gpt-oss": (2880, 2880, 4, True)}  # D, I, top-k, gpt-oss's activation
SLOTS = {"qwen3": 48, "gpt-oss": 16}  # the bank's experts: 115 / 200 MB packed, both well past the L2 cache


def _load_before(src: Path) -> ModuleType:
    """Another tree's FP4 kernel module, imported under its own name (its imports resolve to this tree)."""
    path = src / "freetoken" / "experts" / "slots" / "gemm_fp4_triton.py"
    spec = importlib.util.spec_from_file_location("gemm_fp4_before", path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.cache  # one bank per shape and format
def _weights(fmt_name: str, D: int, inter: int, S: int, gptoss: bool, dev: torch.device) -> SlotWeights:
    """Random experts rounded by the format's own quantiser (on ``dev``: gpt-oss's 17 slots are 0.4 G weights)."""
    fmt = format_by_name(fmt_name)
    g = torch.Generator(device=dev).manual_seed(0)
    gu, gus = fmt.quantize(torch.randn(S + 1, 2 * inter, D, generator=g, device=dev) / D**0.5)
    dn, dns = fmt.quantize(torch.randn(S + 1, D, inter, generator=g, device=dev) / inter**0.5)
    assert gus is not None and dns is not None
    act = None
    if gptoss:  # biases by eid: slots double as eids here
        act = ExpertAct("gptoss", torch.randn(S + 1, 2 * inter, generator=g, device=dev) * 0.1)
    return SlotWeights(gu, dn, fmt, gus, dns, act=act)


def bench_row(shape: str, fmt_name: str, T: int, before: ModuleType | None, dev: torch.device) -> str:
    D, inter, k, gptoss = SHAPES[shape]
    S = SLOTS[shape]
    sw = _weights(fmt_name, D, inter, S, gptoss, dev)
    assert sw.gate_up_scale is not None and sw.down_scale is not None
    packed = (sw.gate_up[0].numel() + sw.down[0].numel() + sw.gate_up_scale[0].numel() + sw.down_scale[0].numel())
    x = torch.randn(T, D, device=dev).bfloat16()
    w = torch.rand(T, k, device=dev)
    calls = slot_routes(T, S, k, CALLS, dev)
    E = min(S, T * k)
    ours = lambda i: gemm_fp4_triton.grouped_experts_fp4_triton(x, calls[i][0], calls[i][1], w, sw, E)  # noqa: E731
    exact = grouped_experts_loop(x.float(), calls[0][0], calls[0][1], w, sw)  # fp32 on the dequantised weights
    scale = max(1.0, float(exact.abs().max()))
    err = float((ours(0) - exact).abs().max()) / scale
    assert err < 2e-2, f"{shape} {fmt_name} T={T}: FP4 kernel off the fp32 reference by {err:.3g}"
    n_exp = int(calls[0][0].n_groups)
    t4 = graph_us(ours, CALLS)
    cells = [shape, fmt_name, str(T), str(n_exp), f"{t4:.1f}", f"{n_exp * packed / (t4 * 1e-6) / 1e9:.0f}"]
    if before is not None:
        old = lambda i: before.grouped_experts_fp4_triton(x, calls[i][0], calls[i][1], w, sw, E)  # noqa: E731
        err_old = float((old(0) - exact).abs().max()) / scale
        t_old = graph_us(old, CALLS)
        cells += [f"{t_old:.1f}", f"{t_old / t4:.2f}x", f"{err_old:.1e}"]
    else:
        cells += ["–", "–", "–"]
    if not gptoss:  # the bf16 kernel has no gpt-oss activation path here: the Qwen shape only
        gub, dnb = (t.contiguous() for t in sw.rows(slice(None), torch.bfloat16))
        t16 = graph_us(lambda i: grouped_experts_triton(x, calls[i][0], calls[i][1], w, gub, dnb, E), CALLS)
        cells += [f"{t16:.1f}", f"{t16 / t4:.2f}x"]
    else:
        cells += ["–", "–"]
    return "| " + " | ".join(cells + [f"{err:.1e}"]) + " |"


# One token's tiles to compare (``fp4_decode_tiles(k, format)`` is the default): the dequantising kernel is
# compute-heavier than the bf16 one, so its best tile may differ
TILES = [
    GemmTiles(gu_bn=32, gu_bk=128),
    GemmTiles(gu_bn=32, gu_bk=256),
    GemmTiles(gu_bn=64, gu_bk=128),
    GemmTiles(gu_bn=16, gu_bk=256, dn_bn=32, dn_bk=128),
    GemmTiles(gu_bn=32, gu_bk=128, dn_bn=32, dn_bk=128),
    GemmTiles(gu_bn=32, gu_bk=128, gu_warps=8, dn_warps=8),
]


def sweep_tiles(shape: str, fmt_name: str, dev: torch.device) -> None:
    """T = 1: µs per call of each of ``TILES`` (output checked against the default's)."""
    D, inter, k, gptoss = SHAPES[shape]
    S = SLOTS[shape]
    sw = _weights(fmt_name, D, inter, S, gptoss, dev)
    x, w = torch.randn(1, D, device=dev).bfloat16(), torch.rand(1, k, device=dev)
    calls = slot_routes(1, S, k, CALLS, dev)
    run = gemm_fp4_triton.grouped_experts_fp4_triton
    ref = run(x, calls[0][0], calls[0][1], w, sw, k)
    for t in TILES:
        try:
            err = float((run(x, calls[0][0], calls[0][1], w, sw, k, tiles=t) - ref).abs().max())
            us = graph_us(lambda i, t=t: run(x, calls[i][0], calls[i][1], w, sw, k, tiles=t), CALLS)
        except Exception as e:  # a setting the compiler refuses
            print(f"| {shape} | {fmt_name} | {t} | failed: {type(e).__name__} |")
            continue
        print(f"| {shape} | {fmt_name} | gu {t.gu_bn}x{t.gu_bk} w{t.gu_warps}, dn {t.dn_bn}x{t.dn_bk} w{t.dn_warps} "
              f"| {us:.1f} | {err:.1e} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", default="1,4,64")
    p.add_argument("--before", type=Path, default=None, help="another tree's src/: its FP4 kernel timed alongside")
    p.add_argument("--no-tiles", action="store_true", help="skip the one-token tile sweep")
    args = p.parse_args()
    before = _load_before(args.before) if args.before is not None else None
    dev = torch.device("cuda")
    print("| shape | format | T | experts/call | FP4 µs | packed GB/s | before µs | before / this | before's err "
          "| bf16 µs | bf16 / FP4 | err vs fp32 |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        for fmt_name in ("mxfp4", "nvfp4"):
            for T in (int(t) for t in args.tokens.split(",")):
                print(bench_row(shape, fmt_name, T, before, dev), flush=True)
    if not args.no_tiles:
        print("\n| shape | format | tiles (T = 1) | µs | max diff vs the default's |\n|---|---|---|---|---|")
        for shape in SHAPES:
            for fmt_name in ("mxfp4", "nvfp4"):
                sweep_tiles(shape, fmt_name, dev)


if __name__ == "__main__":
    main()
