"""The decode bandwidth bound of ``../shared/BENCH.md`` ("The bandwidth model"), as pure arithmetic.

Per decode step (``b`` tokens at batch ``b``) and MoE layer ``l`` with ``m_l`` distinct missed experts of ``S`` bytes
each (``S``: one expert as the pool holds it, packed weights and their scales for a quantised format:
``ExpertBanks.expert_bytes``)::

    T_l  = max(T_gpu_l, m_l * S / (B_P' + B_H'))          policies with misses (offload, hybrid, placements)
    T_l  = T_gpu_l                                          policies without misses (fused: every expert resident)
    T_l  = c_l * S / B_read                                 ``cpu``: every routed expert (c_l distinct per step) runs
                                                             on the CPU, read from host memory once; ``B_read`` is
                                                             the streaming read, ``B_H`` (kernel alone) without it
    T_step = sum_l T_l,    bound tok/s = b / T_step,    e2e / bound = measured tok/s / bound tok/s

``m_l`` and ``c_l`` are counted per MoE layer by the slot backends' device counters (``DeviceCounters.per_layer``);
given only the mean over layers, every layer gets the mean, a bound no higher than the per-layer one (``max`` is
convex: the mean's max is at most the max's mean), so it can flatter a policy whose misses gather in a few layers.

``T_gpu_l`` is the all-resident (fused) GPU time of that layer with everything else the step does (attention, norms,
the head) spread over the MoE layers: the fused step time / MoE layers, so a step without misses is bounded by the
fused step itself (the fused row of the same command is then 1.00 of its bound by construction). ``B_P'`` and
``B_H'`` are the PCIe-fill and CPU-kernel bandwidths measured while both run (``hardware/bandwidth.measure``).
Offload and the placements are held to the box's bound (both branches), not to their own: the bound says what the
machine allows for these misses, whichever policy serves them.

Bandwidths are GB/s (1e9 bytes), times seconds. ``None`` means "not known" (no CUDA: no PCIe figure) and makes the
result ``None``, never a guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_GB = 1e9


def miss_time_s(misses: float, expert_bytes: int, gbps: float | None) -> float | None:
    """Seconds to move ``misses`` experts of ``expert_bytes`` at ``gbps``; 0 without misses, None unknown."""
    if misses <= 0:
        return 0.0
    if gbps is None or gbps <= 0:
        return None
    return misses * expert_bytes / _GB / gbps


def layer_bound_s(
    t_gpu_layer: float | None, misses: float, expert_bytes: int, b_copy_c: float | None, b_cpu_c: float | None
) -> float | None:
    """``max(T_gpu, m·S / (B_P' + B_H'))`` for one layer of one step; the GPU term alone without misses."""
    both = None if b_copy_c is None or b_cpu_c is None else b_copy_c + b_cpu_c
    miss = miss_time_s(misses, expert_bytes, both)
    if miss is None:
        return None
    if t_gpu_layer is None:
        return miss if misses > 0 else None  # without a fused timing: the bandwidth term alone
    return max(t_gpu_layer, miss)


def step_bound_s(
    t_gpu_layer: float | None, misses_per_layer: Sequence[float], expert_bytes: int,
    b_copy_c: float | None, b_cpu_c: float | None,
) -> float | None:  # fmt: skip
    """The sum over MoE layers of ``layer_bound_s`` (one entry of ``misses_per_layer`` per layer)."""
    if not misses_per_layer:
        return None
    parts = [layer_bound_s(t_gpu_layer, m, expert_bytes, b_copy_c, b_cpu_c) for m in misses_per_layer]
    return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)


def cpu_step_bound_s(cpu_runs_per_layer: Sequence[float], expert_bytes: int, read_gbps: float | None) -> float | None:
    """``cpu``: the experts' bytes each step reads from host memory over the streaming read (or B_H)."""
    if not cpu_runs_per_layer:
        return None
    return miss_time_s(sum(cpu_runs_per_layer), expert_bytes, read_gbps) if sum(cpu_runs_per_layer) > 0 else None


@dataclass(frozen=True)
class Bound:
    step_s: float
    batch: int

    @property
    def tok_s(self) -> float:
        return self.batch / self.step_s

    def of(self, measured_tok_s: float) -> float:
        """e2e / bound."""
        return measured_tok_s / self.tok_s


PerLayer = float | Sequence[float]  # one figure per MoE layer-step, or a sequence of one per MoE layer


def per_layer(value: PerLayer, layers: int, name: str) -> list[float]:
    """``value`` as one entry per layer: a float is every layer's (the mean); a sequence must have ``layers``."""
    if isinstance(value, (int, float)):
        return [float(value)] * layers
    if len(value) != layers:
        raise ValueError(f"{name}: {len(value)} per-layer figures for {layers} MoE layers")
    return [float(v) for v in value]


def policy_bound(
    kind: str, batch: int, layers: int, t_gpu_layer: float | None, misses_per_layer_step: PerLayer,
    cpu_runs_per_layer_step: PerLayer, expert_bytes: int, b_copy_c: float | None, b_cpu_c: float | None,
    read_gbps: float | None = None,
) -> Bound | None:  # fmt: skip
    """A row's bound from its measured counts per layer-step. ``kind``: "fused", "cpu" or "misses" (any policy that
    fills or runs misses beside a cache). A count is a sequence of one per MoE layer (the engine's per-layer
    counters), or one float, the mean over layers, that every layer then gets (a looser floor: see the module)."""
    if kind == "fused":
        step = None if t_gpu_layer is None else t_gpu_layer * layers
    elif kind == "cpu":
        step = cpu_step_bound_s(per_layer(cpu_runs_per_layer_step, layers, "cpu runs"), expert_bytes, read_gbps)
    else:
        misses = per_layer(misses_per_layer_step, layers, "misses")
        step = step_bound_s(t_gpu_layer, misses, expert_bytes, b_copy_c, b_cpu_c)
    return None if step is None or step <= 0 else Bound(step, batch)


def t_gpu_layer_s(fused_tok_s: float | None, batch: int, layers: int) -> float | None:
    """The fused step time at ``batch`` spread over the MoE layers (everything the step does but the misses)."""
    if not fused_tok_s or layers <= 0:
        return None
    return batch / fused_tok_s / layers
