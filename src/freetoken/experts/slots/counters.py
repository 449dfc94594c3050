"""Step counters: device values accumulate in one device vector (one add per layer, no host sync) and, per MoE
layer, in one ``[L, 3]`` device table (misses, fills, CPU runs: the bandwidth bound's ``m_l``, ``bench/bound.py``);
host-known values (layer steps) are plain ints. ``read`` and ``read_layers`` sync once each."""

from __future__ import annotations

import torch

# Device-accumulated, in this order: distinct hits, distinct misses, fills, distinct CPU runs,
# layer-steps with a miss; then the last round's fills (set, not added). The fused plan (``plan_triton``)
# updates the same vector.
DEVICE_NAMES = ("hits", "misses", "fills", "cpu_runs", "miss_layers")
# The per-layer table's columns (``DeviceCounters.per_layer``; the fused plan updates its layer's row too).
LAYER_NAMES = ("misses", "fills", "cpu_runs")


class DeviceCounters:
    def __init__(self, device: torch.device, num_layers: int) -> None:
        self.vector = torch.zeros(len(DEVICE_NAMES) + 1, dtype=torch.long, device=device)
        self._v = self.vector[: len(DEVICE_NAMES)]
        self._q_last = self.vector[len(DEVICE_NAMES)]
        # [L, 3] int64. Never reallocated: captured graphs (layer and step graphs) add into its rows in place.
        self.per_layer = torch.zeros(num_layers, len(LAYER_NAMES), dtype=torch.long, device=device)
        self.layer_steps = 0

    def add_step(
        self,
        layer: int,
        hits: torch.Tensor,  # [] int64
        misses: torch.Tensor,
        fills: torch.Tensor,
        cpu_runs: torch.Tensor,
        first_round: bool = True,
    ) -> None:
        """One layer round's counts; a layer's later rounds (offload) add fills only."""
        if first_round:
            self.layer_steps += 1
            counts = torch.stack((hits, misses, fills, cpu_runs, (misses > 0).long()))
            self._v[:5] += counts
            self.per_layer[layer] += counts[1:4]
        else:
            self._v[2:3] += fills
            self.per_layer[layer, 1:2] += fills
        self._q_last.copy_(fills)

    def expert_stats(self, expert_bytes: int, slots: int) -> dict[str, int | float]:
        """The backends' stats (DESIGN §4 names, and the bytes and q that follow from them); one sync."""
        c = self.read()
        return {"expert_hits": c["hits"], "expert_misses": c["misses"], "expert_fills": c["fills"],
                "expert_cpu_runs": c["cpu_runs"], "pcie_bytes": c["fills"] * expert_bytes,
                "cpu_bytes": c["cpu_runs"] * expert_bytes, "q_last": c["q_last"],
                "q_mean": c["fills"] / c["miss_layers"] if c["miss_layers"] else 0.0,
                "expert_slots": slots, "layer_steps": c["layer_steps"]}  # fmt: skip

    def read(self) -> dict[str, int]:
        vals = self._v.tolist()
        out = dict(zip(DEVICE_NAMES, (int(v) for v in vals)))
        out["q_last"] = int(self._q_last)
        out["layer_steps"] = self.layer_steps
        return out

    def read_layers(self) -> dict[str, list[int]]:
        """Cumulative per-MoE-layer counts (``LAYER_NAMES`` -> one int per layer); one sync. Kept out of
        ``stats()``, which the server refreshes after every step."""
        cols = self.per_layer.t().tolist()
        return {name: [int(v) for v in col] for name, col in zip(LAYER_NAMES, cols)}
