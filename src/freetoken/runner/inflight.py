"""A step queued on the device whose sampled tokens the host has not read yet (``engine/overlap.py``): the
runner returns one from ``launch``, the engine reads it with ``read`` (waiting on this step's event only, not the
whole stream), and a step launched after it takes its input ids from ``ids`` on the device."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic

import torch

from freetoken.runner.batch import R
from freetoken.runner.step_sampler import Choice, unpack


@dataclass
class Launch(Generic[R]):
    items: list[tuple[R, int]]  # (request, tokens) rows, as launched
    starts: list[int]  # each row's first position
    out: torch.Tensor  # ``step_sampler.pack``'s rows on the device (padded rows past len(items) ignored)
    host: torch.Tensor  # where ``out`` is copied to (``out`` itself on a CPU device)
    done: torch.cuda.Event | None  # recorded after that copy (None on a CPU device: already computed)

    @property
    def ids(self) -> torch.Tensor:
        """[rows] float64 the sampled ids, on the device (what the next step's rows gather)."""
        return self.out[:, 0]

    def read(self) -> list[Choice]:
        """Waits for this step (only) and returns one choice per row."""
        if self.done is not None:
            self.done.synchronize()
        return unpack([req for req, _ in self.items], self.host)


def launched(
    items: Sequence[tuple[R, int]],
    starts: list[int],
    out: torch.Tensor,
    host: torch.Tensor | None = None,
    blocking: bool = False,
) -> Launch[R]:
    """The launch of ``out``: on CUDA its copy to ``host`` (pinned; None: a new one) queued, and an event after;
    ``blocking``: reading it sleeps instead of spinning (the step's CPU branch needs every core)."""
    if out.device.type != "cuda":
        return Launch(list(items), starts, out, out, None)
    if host is None:
        host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
    host.copy_(out, non_blocking=True)
    done = torch.cuda.Event(blocking=blocking)
    done.record()
    return Launch(list(items), starts, out, host, done)
