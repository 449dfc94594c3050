"""Device time of a callable on CUDA for the kernel benchmarks here: one warm-up run, then ``reps`` runs each between
two CUDA events; the median in milliseconds. (Scripts run as ``python3 bench/gpu/X.py`` import it as ``event_time``.)"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


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
