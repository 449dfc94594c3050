"""Does the host run ahead of the GPU in decode? (issue "expert hierarchy": no host sync in the MoE layer)

``runahead_share``: over a few decode steps, each started from an idle GPU, the share of steps in which
the host had queued the last MoE layer before the GPU had finished the first (an event recorded after
layer 0 is still pending when the last layer's ``forward`` returns). A backend whose MoE layer blocks
the host (a ``.item()``, a host wait for the CPU branch) scores 0. ``profile_steps`` writes a
``torch.profiler`` Chrome trace of a few steps to look at the same thing on a timeline.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

Step = Callable[[torch.Tensor, Callable[[int], None] | None], None]  # (x, after_layer) -> None


def runahead_share(step: Step, inputs: Callable[[], torch.Tensor], steps: int = 10) -> float:
    ahead = 0
    for _ in range(steps):
        torch.cuda.synchronize()
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
