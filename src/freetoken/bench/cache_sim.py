"""Slot-cache policy on a routing trace, tables only: hit rate, misses, fills and CPU runs per policy.

Runs the real device plan (``experts/slots/plan.py``) on the slot tables alone, no expert weights, so it
takes seconds on any CPU and compares cache sizes, batch sizes, fill shares and recency windows on identical
routing. ``python -m freetoken.bench.cache_sim --trace FILE``.

With ``--bw-copy``/``--bw-cpu`` (GB/s, concurrent) and ``--expert-mb`` it also models the time the misses
take per token: ``whole`` = sum over layer steps of max(q*S/B_P', (m-q)*S/B_H') (whole experts per
branch, as the engine splits; share 1 is offload), ``split`` = sum of m*S/(B_P'+B_H') (the floor of
BENCH.md: every layer's misses split exactly).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np
import torch

from freetoken.experts.slots.plan import FillRule, SlotTables, group_routes, plan_fills


@dataclass
class SimResult:
    cache: float
    batch: int
    share: float
    protect_steps: int
    hit_rate: float  # distinct (layer, expert) hits / (hits + misses), measured steps only
    misses: int
    fills: int
    cpu_runs: int
    tokens: int
    whole_s: float = 0.0  # modelled seconds of the misses, whole experts per branch
    split_s: float = 0.0  # ... with the misses split exactly in the bandwidth ratio


def simulate(
    trace: np.ndarray,
    cache: float,
    batch: int,
    share: float,
    protect_steps: int,
    steps: int,
    warmup: int,
    recent_last: bool = False,
    bw: tuple[float, float, float] | None = None,  # (B_P' GB/s, B_H' GB/s, expert GB)
) -> SimResult:
    """trace [tokens, layers, k] expert ids; request b replays from offset b * tokens // batch."""
    n, L, _ = trace.shape
    E = int(trace.max()) + 1
    N = L * E
    S = max(1, int(cache * N))
    t = SlotTables.empty(N, S)
    ids_all = torch.from_numpy(trace.astype(np.int64))
    offsets = [b * (n // batch) for b in range(batch)]
    share_t = torch.tensor(share)
    rule = FillRule(1, protect_steps * L, recent_last)
    h = m = f = 0
    whole = split = 0.0
    for step in range(warmup + steps):
        rows = [(o + step) % n for o in offsets]
        for layer in range(L):
            g = group_routes(ids_all[rows, layer].reshape(-1) + layer * E, N)
            p = plan_fills(t, g, g.valid, share_t, rule)
            if step >= warmup:
                lm, lq = int(p.num_misses), int(p.copy_count)
                h, m, f = h + int(p.num_hits), m + lm, f + lq
                if bw is not None:
                    b_p, b_h, gb = bw
                    whole += max(lq * gb / b_p, (lm - lq) * gb / b_h)
                    split += lm * gb / (b_p + b_h)
    return SimResult(cache, batch, share, protect_steps, h / max(h + m, 1), m, f, m - f, steps * batch, whole, split)


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--trace", required=True, help="[tokens, layers, k] uint8 routing (.npy)")
    p.add_argument("--cache", default="0.11,0.25,0.37", help="comma-separated fractions of the pool")
    p.add_argument("--batch", default="1,4", help="comma-separated concurrent requests")
    p.add_argument("--share", default="1.0", help="comma-separated shares of misses to fill")
    p.add_argument("--protect", default="0,1", help="comma-separated recency windows in steps (0: LRU)")
    p.add_argument(
        "--recent",
        default="last",
        choices=("block", "last"),
        help="recent slots: victims last, newest first (what offload and hybrid do) or never victims",
    )
    p.add_argument("--layers", type=int, default=None, help="the trace's first N layers (default: all)")
    p.add_argument("--bw-copy", type=float, default=None, help="B_P' GB/s: model the misses' time per token")
    p.add_argument("--bw-cpu", type=float, default=None, help="B_H' GB/s (with --bw-copy)")
    p.add_argument("--expert-mb", type=float, default=9.44, help="one expert's MB (default: Qwen3-30B-A3B bf16)")
    p.add_argument("--steps", type=int, default=200, help="measured decode steps")
    p.add_argument("--warmup", type=int, default=50, help="unmeasured steps first")
    return p


def run(args: argparse.Namespace) -> int:
    trace = np.load(args.trace)
    if args.layers:
        trace = trace[:, : args.layers]
    bw = (args.bw_copy, args.bw_cpu, args.expert_mb / 1e3) if args.bw_copy and args.bw_cpu else None
    print(f"# {args.trace}: {trace.shape[0]} tokens x {trace.shape[1]} layers x top-{trace.shape[2]}")
    print(
        f"{'cache':>6}{'batch':>6}{'share':>6}{'protect':>8}{'hit':>7}{'misses/tok':>11}{'fills/tok':>10}{'cpu/tok':>8}"
        + (f"{'whole ms/tok':>13}{'split ms/tok':>13}" if bw else "")
    )
    torch.set_num_threads(1)
    for c in (float(v) for v in args.cache.split(",")):
        for b in (int(v) for v in args.batch.split(",")):
            for s in (float(v) for v in args.share.split(",")):
                for pr in (int(v) for v in args.protect.split(",")):
                    r = simulate(trace, c, b, s, pr, args.steps, args.warmup, args.recent == "last", bw)
                    tok = r.tokens
                    model = f"{r.whole_s / tok * 1e3:13.2f}{r.split_s / tok * 1e3:13.2f}" if bw else ""
                    print(
                        f"{c:6.2f}{b:6d}{s:6.2f}{pr:8d}{r.hit_rate:7.3f}{r.misses / tok:11.1f}"
                        f"{r.fills / tok:10.1f}{r.cpu_runs / tok:8.1f}{model}",
                        flush=True,
                    )
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(add_arguments(argparse.ArgumentParser(prog="ft bench cache-sim")).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
