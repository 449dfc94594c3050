"""Polling a flag the CPU kernel's feeder sets (queued batches' done flags), with a timeout."""

from __future__ import annotations

import time

import torch


def wait_flag(flag: torch.Tensor, value: int, timeout: float = 10.0) -> None:
    """Until ``flag[0] == value``; fails the test after ``timeout`` seconds."""
    t0 = time.monotonic()
    while int(flag[0]) != value:
        assert time.monotonic() - t0 < timeout, f"done flag stuck at {int(flag[0])}, wanted {value}"
        time.sleep(0.0005)
