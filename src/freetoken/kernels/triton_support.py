"""Whether an op takes its Triton kernel (``use_triton``: a CUDA tensor and Triton importable, the one rule every
dispatch in the package follows), and the ticket counters that let a kernel's last program to finish do the launch's
final step (a merge, a sum) itself."""

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


def use_triton(where: torch.Tensor | torch.device) -> bool:
    """Whether an op on ``where`` (a tensor or its device) runs its Triton kernel: on CUDA where Triton imports."""
    cuda = where.is_cuda if isinstance(where, torch.Tensor) else where.type == "cuda"
    return cuda and triton_available()


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
