"""The linear op's one dispatch point: ``linear(x, w, bias)`` is ``F.linear``, except that decode-sized float32 steps
on a CPU read a bf16 copy of ``w`` where every value of ``w`` is a bf16 (a bf16 checkpoint under float32 steps: half
the bytes, the same values; ``cpu_step.linear``).

The copy is the op's own, not its caller's: ``PreparedWeights`` makes it on a weight's first such step and keeps it
while the weight lives, so models and layers hold weights only (DESIGN §3). Callers pass the weight they hold (the
same tensor object every step), never a fresh view.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F

from freetoken.kernels import cpu_step


class PreparedWeights:
    """A derived form of each weight (``make(w)``, None where there is none), keyed by the weight's identity, made
    once and dropped when the weight is freed (a later tensor at the same address is a new key)."""

    def __init__(self, make: Callable[[torch.Tensor], torch.Tensor | None]) -> None:
        self._make = make
        self._held: dict[int, torch.Tensor | None] = {}

    def get(self, w: torch.Tensor) -> torch.Tensor | None:
        key = id(w)
        if key in self._held:
            return self._held[key]
        made = self._held[key] = self._make(w)
        weakref.finalize(w, self._held.pop, key, None).atexit = False
        return made

    def held(self, w: torch.Tensor) -> torch.Tensor | None:
        """What ``get`` made for ``w`` so far (None: nothing made yet, or nothing to make); makes nothing."""
        return self._held.get(id(w))

    def __len__(self) -> int:
        return len(self._held)


BF16_COPIES = PreparedWeights(cpu_step.bf16_copy)


def takes_bf16_copy(x: torch.Tensor) -> bool:
    """Whether a step's input rows ``x`` [T, I] read the weights' bf16 copies: decode-sized, CPU float32."""
    return x.dim() == 2 and x.shape[0] <= cpu_step.LINEAR_ROWS and cpu_step.available(x)


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, bias)`` (x [T, I], w [O, I]); the C++ bf16 path where ``takes_bf16_copy(x)`` and ``w`` has a
    bf16 copy."""
    if not takes_bf16_copy(x):
        return F.linear(x, w, bias)
    w16 = BF16_COPIES.get(w)
    return F.linear(x, w, bias) if w16 is None else cpu_step.linear(x, w, w16, bias)


def linear_reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, w, bias)
