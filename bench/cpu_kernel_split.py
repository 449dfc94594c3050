"""CPU expert kernel on part of each expert (``i_begin``): time vs the CPU's share of intermediate rows.

Qwen3-30B-A3B expert shape (D=2048, I=768, bf16), one token, top-8 distinct experts per call, rows
walking a pool of --pool-experts experts (default 128, 1.2 GB: larger than the L3 here) so weights
stream from DRAM. Variants alternate in one loop (same noise): whole experts, i_begin = each --cuts
value, and a contiguous pool with half the intermediate size (I=384 whole), the floor for
i_begin=384 (its gate/up rows are contiguous, but its down columns [384, 768) are a strided half of
each [D, I] row). Medians over --iters calls, the first 5 dropped.

    PYTHONPATH=src python bench/cpu_kernel_split.py [--threads 2] [--iters 60] [--cuts 64,384,704,768]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from freetoken.experts.cpu.kernel import CpuExpertKernel

D, INTER, TOP_K = 2048, 768, 8


def _pool(n: int, inter: int) -> tuple[torch.Tensor, torch.Tensor]:
    gate_up = (torch.randn(n, 2 * inter, D) / D**0.5).bfloat16()  # [N, 2I, D]
    down = (torch.randn(n, D, inter) / inter**0.5).bfloat16()  # [N, D, I]
    return gate_up, down


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--pool-experts", type=int, default=128)
    ap.add_argument("--cuts", default="64,384,704,768", help="i_begin values besides 0")
    args = ap.parse_args()
    full, half = _pool(args.pool_experts, INTER), _pool(args.pool_experts, INTER // 2)
    x, tok, w = torch.randn(1, D), torch.zeros(TOP_K, dtype=torch.int32), torch.rand(TOP_K)
    kern = CpuExpertKernel(num_threads=args.threads)
    # name -> (banks, i_begin, intermediate rows read per expert)
    variants = {f"I={INTER} i_begin={c}": (full, c, INTER - c) for c in [0, *map(int, args.cuts.split(","))]}
    variants[f"I={INTER // 2} whole (contiguous)"] = (half, 0, INTER // 2)
    times: dict[str, list[float]] = {name: [] for name in variants}
    step = 0
    for _ in range(args.iters):
        for name, ((gate_up, down), c, _rows) in variants.items():
            row = (torch.arange(TOP_K) + step * TOP_K) % args.pool_experts  # never the previous call's rows
            step += 1
            i_begin = torch.full((TOP_K,), c, dtype=torch.int32)
            t0 = time.perf_counter()
            kern.run(x, tok, row, w, gate_up, down, i_begin=i_begin)
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times[f"I={INTER} i_begin=0"][5:])
    print(f"# isa={kern.isa} threads={args.threads} iters={args.iters} (medians of {args.iters - 5})")
    for name, (_, _, rows) in variants.items():
        m = statistics.median(times[name][5:])
        gb = TOP_K * 3 * D * rows * 2 / 1e9
        print(f"{name:30s} rows {rows / INTER:5.3f}  {m * 1e3:7.3f} ms  time ratio {m / base:5.3f}  {gb / m:6.2f} GB/s")


if __name__ == "__main__":
    main()
