"""Slot-cache policy on a routing trace, tables only: hit rate, misses, fills and CPU runs per policy.

Runs the real device plan (``experts/slot_plan.py``) on the slot tables alone, no expert weights, so it
takes seconds on any CPU and compares cache sizes, batch sizes, fill shares and the hybrid's admission
control on identical routing. ``python -m freetoken.bench.cache_sim --trace FILE``.

With ``--bw-copy``/``--bw-cpu`` (GB/s, concurrent) and ``--expert-mb`` it also models the time the misses
take per token: ``whole`` = sum over layer steps of max(q*S/B_P', (m-q)*S/B_H') (whole experts per
branch, as the engine splits; share 1 is offload; with ``--share-expert I`` one expert per layer step is
shared by rows, as ``EngineConfig.hybrid_share_expert`` does), ``split`` = sum of m*S/(B_P'+B_H') (the
floor of BENCH.md: every layer's misses split exactly).

Two hybrid policies the engine does not have, to see what they would buy before building them:
``--admission recent`` fills the misses most recently routed before first (the engine: the lower eid),
``--background B`` also copies up to B of a layer step's CPU-run experts into the cache off the critical
path; their copy time beyond the layer's idle PCIe time (``--gap-ms``, the non-MoE part) is added; and
``--split-fill`` defers the tail rows of one fill when the whole fills overload the GPU side: the CPU computes
those rows for this token, the copy of the tail follows off the critical path (a PCIe backlog drained in the
gaps and in the layer's PCIe slack, first in line before the next layer's fills), so the cache holds the same
experts as plain hybrid.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np
import torch

from freetoken.experts.share_split import share_one_expert
from freetoken.experts.slot_plan import PRIORITY_CAP, SlotTables, fill_quota, group_routes, plan_fills


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
    background: int = 0  # CPU-run experts also copied into the cache off the critical path


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
    share_inter: int = 0,  # > 0: share one expert per layer step (``share_split``) with this I
    admission: str = "eid",  # fill order among misses: "eid" (the engine's) or "recent" (last routed first)
    background: int = 0,  # per layer step, CPU-run experts also filled off the critical path
    gap_s: float = 0.0,  # idle PCIe time per layer step that background fills use for free
    split_fill: bool = False,  # defer one fill's tail rows when the GPU side is overloaded (tail_deferred)
) -> SimResult:
    """trace [tokens, layers, k] expert ids; request b replays from offset b * tokens // batch."""
    n, L, _ = trace.shape
    E = int(trace.max()) + 1
    N = L * E
    S = max(1, int(cache * N))
    t = SlotTables(
        torch.full((N + 1,), -1), torch.full((S + 1,), -1), torch.full((S + 1,), -1),
        torch.zeros(S + 1, dtype=torch.bool), torch.zeros((), dtype=torch.long),
    )  # fmt: skip
    ids_all = torch.from_numpy(trace.astype(np.int64))
    offsets = [b * (n // batch) for b in range(batch)]
    share_t = torch.tensor(share)
    if admission not in ("eid", "recent"):
        raise ValueError(f"admission must be 'eid' or 'recent', got {admission!r}")
    if background and share_inter:
        raise ValueError("background fills and a shared expert are separate experiments")
    if background and split_fill:
        raise ValueError("background fills and split fills are separate experiments")
    last = torch.zeros(N + 1, dtype=torch.long)  # 1 + the last step each eid was routed (0: never)
    h = m = f = bg = 0
    whole = split = backlog = 0.0
    for step in range(warmup + steps):
        rows = [(o + step) % n for o in offsets]
        for layer in range(L):
            g = group_routes(ids_all[rows, layer].reshape(-1) + layer * E, N)
            e = g.eid.clamp(max=N)
            pr = last[e].clamp(max=PRIORITY_CAP - 1) if admission == "recent" else None
            q_s, b = share_t, 0
            if background:  # the critical q as the engine picks it, plus b more fills for the cache only
                lm_ = (g.valid & (t.slot_of[e] < 0)).sum()
                q = int(fill_quota(lm_, share_t, torch.tensor(S), 1))
                b = min(int(lm_) - q, background)
                q_s = torch.tensor((q + b) / int(lm_) if int(lm_) else share)
            p = plan_fills(t, g, g.valid, q_s, 1, protect_steps * L, recent_last, priority=pr)
            last[e[g.valid]] = step + 1
            gpu = float(p.copy_count) - b  # experts' worth on the GPU side (fills + a shared expert's rows)
            if share_inter:
                gpu += int(share_one_expert(p, share_t, share_inter, N, S).rows) / share_inter
            if step >= warmup:
                lm, lq = int(p.num_misses), int(p.copy_count) - b
                h, m, f, bg = h + int(p.num_hits), m + lm, f + lq, bg + b
                if bw is not None and split_fill:
                    layer_s, backlog = tail_deferred(gpu, lm, lq >= 1, backlog, bw, gap_s)
                    whole += layer_s
                elif bw is not None:
                    b_p, b_h, gb = bw
                    whole += max(gpu * gb / b_p, (lm - gpu) * gb / b_h) + max(0.0, b * gb / b_p - gap_s)
                if bw is not None:
                    split += lm * bw[2] / (bw[0] + bw[1])
    r = SimResult(cache, batch, share, protect_steps, h / max(h + m, 1), m, f, m - f, steps * batch, whole, split)
    r.background = bg
    return r


def tail_deferred(
    gpu: float, m: int, can_split: bool, backlog: float, bw: tuple[float, float, float], gap_s: float,
    granule: float = 1 / 12,
) -> tuple[float, float]:  # fmt: skip
    """One layer step with ``--split-fill``: (its miss time in s, the PCIe backlog in GB after it).

    ``gpu`` experts' worth go to the GPU side, ``m`` misses in all. The backlog (earlier deferred tails) drains
    in the serial gap first, the rest goes before this layer's fills. When the fills would finish after the CPU,
    the last fill keeps only its first rows critical (at least a granule, at most all), chosen so both branches
    would finish together without a backlog (``m * share``, as the device plan can); the CPU computes its other
    rows, whose copy joins the backlog and drains in the layer's PCIe slack."""
    b_p, b_h, gb = bw
    backlog = max(0.0, backlog - gap_s * b_p)
    crit = gpu
    if can_split and gpu > 0:  # the device plan knows m and the share, not the backlog
        crit = min(gpu, max(gpu - 1 + granule, m * b_p / (b_p + b_h)))
    t_p = (backlog + crit * gb) / b_p
    t = max(t_p, (m - crit) * gb / b_h)
    return t, max(0.0, (gpu - crit) * gb - (t - t_p) * b_p)


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
    p.add_argument("--share-expert", type=int, default=0, metavar="I",
                   help="share one expert per layer step between both branches (share_split), intermediate size I")
    p.add_argument("--admission", default="eid", choices=("eid", "recent"),
                   help="fill order among a step's misses: the lower eid (the engine) or the last routed first")
    p.add_argument("--background", type=int, default=0, metavar="B",
                   help="also fill up to B CPU-run experts per layer step into the cache, off the critical path")
    p.add_argument("--gap-ms", type=float, default=0.0, help="idle PCIe ms per layer step that background fills use")
    p.add_argument("--split-fill", action="store_true",
                   help="fills overload the GPU: one fill's tail rows run on the CPU (this token), copied later")
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
                    r = simulate(
                        trace, c, b, s, pr, args.steps, args.warmup, args.recent == "last", bw, args.share_expert,
                        args.admission, args.background, args.gap_ms / 1e3, args.split_fill,
                    )  # fmt: skip
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
