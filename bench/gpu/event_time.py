"""Device time of a callable on CUDA for the kernel benchmarks here: one warm-up run, then ``reps`` runs each between
two CUDA events; the median in milliseconds; and the routes the grouped-GEMM benchmarks replay. (Scripts run as
``python3 bench/gpu/X.py`` import it as ``event_time``.)"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from freetoken.experts.slots.plan import RouteGroups, group_routes


def median_ms(run: Callable[[], object], reps: int = 7) -> float:
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def graph_us(fn: Callable[[int], object], calls: int, reps: int = 7) -> float:
    """Device µs per call of ``fn(0) … fn(calls - 1)``, captured once in a CUDA graph (as the engine replays its
    steps) and replayed ``reps`` times (``median_ms``); ``fn(0)`` runs once first (compiles, allocates)."""
    fn(0)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    return median_ms(g.replay, reps) * 1e3 / calls


def slot_routes(T: int, S: int, k: int, n: int, dev: torch.device) -> list[tuple[RouteGroups, torch.Tensor]]:
    """``n`` steps of T tokens' top-k routes over S slots (distinct slots per token, drawn anew each step: the weights
    come from HBM, not L2), each as (its groups, each group's slot): what the grouped-GEMM benchmarks replay."""
    calls = []
    for _ in range(n):
        ids = torch.rand(T, S, device=dev).argsort(dim=1)[:, :k]  # [T, k]
        groups = group_routes(ids.reshape(-1), S)
        calls.append((groups, torch.where(groups.valid, groups.eid, torch.full_like(groups.eid, -1))))
    return calls
