"""Whether Triton is importable here: the GPU paths use its kernels where it is, torch ops elsewhere; and the ticket
counters that let a kernel's last program to finish do the launch's final step (a merge, a sum) itself."""

from __future__ import annotations

import functools

import torch


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


_TICKETS: dict[tuple[torch.device, str], torch.Tensor] = {}
_KEPT: list[torch.Tensor] = []


def tickets(device: torch.device, n: int, owner: str) -> torch.Tensor:
    """``n`` int32 ticket counters of one kernel (``owner``) on ``device``, zero between its launches: each launch's
    last program resets the ones it took. One set per (device, kernel): the compute stream orders the launches.
    Made once at the largest size asked; a set outgrown, or made during a graph capture, is kept (never freed: a
    captured graph holds its address)."""
    key = (device, owner)
    t = _TICKETS.get(key)
    if t is None or t.numel() < n:
        t = _TICKETS[key] = torch.zeros(max(n, 256), dtype=torch.int32, device=device)
        _KEPT.append(t)
    return t
