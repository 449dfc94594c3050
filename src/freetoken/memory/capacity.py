"""What the machine has for the caches elastic memory resizes, measured when a budget is set (``memory.Capacity``):
device memory on CUDA; host RAM for the CPU engine (its caches live there), within the limits set on the process
(a cgroup's ``memory.max``, ``ulimit -v``)."""

from __future__ import annotations

import torch

from freetoken.hardware.device_memory import free_bytes, process_limit_left
from freetoken.memory.budget import Capacity


def machine_capacity(device: torch.device, held_bytes: int) -> Capacity:
    """``held_bytes``: what the resizable caches hold now (a resize gives it back before it takes more)."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return Capacity(int(free), held_bytes, int(total), f"device memory of {device}")
    import psutil

    total = int(psutil.virtual_memory().total)
    left = process_limit_left()
    where = "host RAM (the CPU engine's caches live there)" if left is None else "host RAM within this process's limits"
    return Capacity(free_bytes(device), held_bytes, total, where)
