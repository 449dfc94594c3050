"""Step counters kept in one device tensor: adding is a device op, reading (``read``) syncs once."""

from __future__ import annotations

import torch

NAMES = ("hits", "misses", "fills", "cpu_runs", "miss_layers", "q_last", "layer_steps")


class DeviceCounters:
    def __init__(self, device: torch.device) -> None:
        self._index = {n: i for i, n in enumerate(NAMES)}
        self._v = torch.zeros(len(NAMES), dtype=torch.long, device=device)

    def add(self, name: str, value: torch.Tensor | int) -> None:
        i = self._index[name]
        self._v[i : i + 1] += value

    def set(self, name: str, value: torch.Tensor) -> None:
        i = self._index[name]
        self._v[i : i + 1].copy_(value.reshape(1))

    def read(self) -> dict[str, int]:
        return dict(zip(NAMES, (int(v) for v in self._v.tolist())))
