"""One MoE layer's routed experts for the synthetic frontier checkpoints (``synthetic_kimi.py``, ``synthetic_dsv4.py``):
every expert's tensors by name, drawn per expert or, with ``same``, drawn once and copied (fast to write, the same
bytes to read: what a decode benchmark measures)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def expert_tensors(
    num_experts: int, make: Callable[[], dict[str, torch.Tensor]], prefix: str, same: bool
) -> dict[str, torch.Tensor]:
    """``make()``: one expert's tensors by suffix (its draws in a fixed order); expert e's are named
    ``{prefix}{e}.{suffix}``."""
    one = make() if same else None
    out: dict[str, torch.Tensor] = {}
    for e in range(num_experts):
        tensors = one or make()
        for suffix, t in tensors.items():
            out[f"{prefix}{e}.{suffix}"] = t.clone() if one else t
    return out
