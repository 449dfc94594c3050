"""Does the host run ahead of the GPU in decode? (issue "expert hierarchy": no host sync in the MoE layer)

``runahead_share``: in steady state (steps back to back, no sync between them, as in the timed loop),
the share of steps in which the host had queued the step's last MoE layer before the GPU had finished
the step's first (an event recorded after layer 0 is still pending when the last layer's ``forward``
returns). 100%: the host is ahead by more than a layer's worth of work, the GPU (or the CPU branch it
waits on) sets the pace; 0%: the host sets the pace — it is slower than the device work, or it blocks.
``profile_steps`` writes a ``torch.profiler`` Chrome trace of a few steps to see the same on a timeline.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

Step = Callable[[torch.Tensor, Callable[[int], None] | None], None]  # (x, after_layer) -> None


def runahead_share(step: Step, inputs: Callable[[], torch.Tensor], steps: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        step(inputs(), None)
    ahead = 0
    for _ in range(steps):
        first = torch.cuda.Event()

        def mark(layer: int, ev: torch.cuda.Event = first) -> None:
            if layer == 0:
                ev.record()

        step(inputs(), mark)
        ahead += not first.query()  # the last layer is queued: has the GPU finished the first yet?
    torch.cuda.synchronize()
    return ahead / steps


def profile_steps(step: Step, inputs: Callable[[], torch.Tensor], path: Path, steps: int = 3) -> None:
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            with record_function(f"decode_step_{i}"):
                step(inputs(), None)
        torch.cuda.synchronize()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:25]
    lines = [f"{e.self_cpu_time_total / 1e3 / steps:9.3f} ms {e.count // steps:6d}/step  {e.key[:60]}" for e in ops]
    dev = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:20]
    lines += ["device self time by op"] + [
        f"{e.self_device_time_total / 1e3 / steps:9.3f} ms {e.count // steps:6d}/step  {e.key[:60]}" for e in dev
    ]
    path.with_suffix(".txt").write_text("host self time by op\n" + "\n".join(lines) + "\n")
