"""The one narrow interface between the MoE layer and everything in ``experts/``.

Shapes: T = tokens in the step, D = hidden size, I = expert intermediate size, k = experts per token,
L = MoE layers, E = routed experts per layer, N = L * E pool rows (``eid = moe_layer * E + expert``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from freetoken.hardware.huge_pages import advise_huge_pages
from freetoken.quant import BF16, WeightFormat


@dataclass
class ExpertBanks:
    """All routed experts of all MoE layers, one bank per tensor kind, ``eid`` rows.

    ``gate_up[eid]`` is ``[2I, D]`` (gate rows first, then up rows); ``down[eid]`` is ``[D, I]``, in the compute
    dtype (``fmt`` bf16) or packed by a quantised ``fmt`` (``quant/``), with the scale banks beside them
    (``gate_up_scale[eid]``: the scales of ``gate_up[eid]``, gate's block rows first). Filled straight from the
    checkpoint in this layout; this is the host expert pool's content. Pool, slots and fills treat
    ``tensors()`` as opaque banks (one slot = one whole expert, every bank); only kernels read a format.
    """

    gate_up: torch.Tensor  # [N, 2I, D'] (D' = fmt.packed_cols(D))
    down: torch.Tensor  # [N, D, I']
    num_layers: int  # L (MoE layers only)
    num_experts: int  # E
    activation: str = "silu"  # one of ``experts/reference.py`` ``ACTIVATIONS`` (the kernels' index order)
    top_k: int = 0  # experts per token per layer (0: unknown); lets caches refuse a size below it up front
    fmt: WeightFormat = BF16
    gate_up_scale: torch.Tensor | None = None  # [N, *fmt.scale_shape(2I, D)]
    down_scale: torch.Tensor | None = None  # [N, *fmt.scale_shape(D, I)]
    # gpt-oss: biases added to gate_up @ x before the activation, float32 [N, 2I] (gate half, then up half); small,
    # so not a bank: every kernel reads them by eid (the down biases live on the MoE layer, ``layers/moe.py``)
    gate_up_bias: torch.Tensor | None = None

    @property
    def hidden_size(self) -> int:  # rows are never packed: D from down's rows
        return int(self.down.shape[1])

    @property
    def intermediate_size(self) -> int:
        return int(self.gate_up.shape[1]) // 2

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every bank, in a fixed order: gate_up, down, then the scale banks the format has."""
        scales = tuple(t for t in (self.gate_up_scale, self.down_scale) if t is not None)
        return (self.gate_up, self.down, *scales)

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert as stored (packed data and scales): what a fill copies and the CPU streams."""
        return sum(t[0].numel() * t.element_size() for t in self.tensors())

    @property
    def pool_bytes(self) -> int:
        return self.expert_bytes * self.num_layers * self.num_experts

    def dequantized(self, rows: torch.Tensor | slice, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The reference: (gate_up, down) of pool ``rows`` as floats of ``dtype``."""
        return dequantize_rows(self.fmt, self.gate_up, self.gate_up_scale, self.down, self.down_scale, rows, dtype)

    @classmethod
    def empty(
        cls, num_layers: int, num_experts: int, hidden: int, inter: int, dtype: torch.dtype, fmt: WeightFormat = BF16
    ) -> ExpertBanks:
        """Unwritten banks, advised onto huge pages first (``hardware/huge_pages.py`` says why). ``dtype``: the
        banks' dtype for an unquantised ``fmt`` (a packed format has its own)."""
        n = num_layers * num_experts
        data = fmt.packed_dtype or dtype
        gate_up = torch.empty((n, 2 * inter, fmt.packed_cols(hidden)), dtype=data)
        down = torch.empty((n, hidden, fmt.packed_cols(inter)), dtype=data)
        gs = ds = None
        if fmt.scale_dtype is not None:
            gs = torch.empty((n, *fmt.scale_shape(2 * inter, hidden)), dtype=fmt.scale_dtype)
            ds = torch.empty((n, *fmt.scale_shape(hidden, inter)), dtype=fmt.scale_dtype)
        for t in (gate_up, down):
            advise_huge_pages(t)
        return cls(gate_up=gate_up, down=down, num_layers=num_layers, num_experts=num_experts, fmt=fmt,
                   gate_up_scale=gs, down_scale=ds)  # fmt: skip


def dequantize_rows(
    fmt: WeightFormat,
    gate_up: torch.Tensor,
    gate_up_scale: torch.Tensor | None,
    down: torch.Tensor,
    down_scale: torch.Tensor | None,
    rows: torch.Tensor | slice | int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate_up, down) of ``rows`` of any bank set (pool or slots) in ``dtype``, by the format's reference."""
    gs = None if gate_up_scale is None else gate_up_scale[rows]
    ds = None if down_scale is None else down_scale[rows]
    return fmt.dequantize(gate_up[rows], gs, dtype), fmt.dequantize(down[rows], ds, dtype)


def raw(t: torch.Tensor) -> torch.Tensor:
    """``t`` as plain bytes-of-its-width ints where torch lacks copy kernels for its dtype (float8 on the CPU):
    the view fills, gathers and resizes go through."""
    return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else t


class ExpertBackend(ABC):
    """Runs the routed experts of one MoE layer for the tokens of a step.

    ``forward`` returns ``sum_j topk_w[t, j] * expert_{topk_ids[t, j]}(x[t])`` exactly: every
    routed expert contributes (no dropping), whichever device or cache computes it.
    """

    name: str = "base"
    # whether the engine may launch decode step N+1 before reading step N (engine/overlap.py): ``begin_step`` and
    # ``before_step_replay`` do no host work that needs step N done (a CPU branch collecting N's batches does)
    runs_ahead: bool = False

    @property
    def cpu_busy_in_step(self) -> bool:
        """Whether CPU workers compute during a decode step (a CPU branch): the engine's thread then waits for the
        device sleeping, not spinning on a core the branch needs."""
        return False

    @abstractmethod
    def forward(
        self,
        layer: int,  # MoE layer index in [0, L)
        x: torch.Tensor,  # [T, D] compute dtype, on the compute device
        topk_ids: torch.Tensor,  # [T, k] int64 expert ids in [0, E)
        topk_w: torch.Tensor,  # [T, k] float32 routing weights
    ) -> torch.Tensor:  # [T, D] compute dtype
        ...

    def begin_step(self, num_tokens: int, is_decode: bool) -> None:  # noqa: B027 - optional hook
        """Called once before each model forward (a safe point between steps)."""

    def prefetch(self, layer: int, topk_ids: torch.Tensor) -> None:  # noqa: B027 - optional hook
        """A hint, before the step's first layer: ``layer``'s routes of this step are ``topk_ids`` [T, k] (known
        ahead, e.g. routed by token id); a backend with a slot cache may fill them early. Results never change."""

    def stats(self) -> dict[str, int | float]:
        """Cumulative counters; DESIGN §4 names (``expert_hits``, ``expert_fills``, ``expert_cpu_runs``)."""
        return {}

    def layer_counts(self) -> dict[str, list[int]] | None:
        """Cumulative ``misses``, ``fills`` and ``cpu_runs`` per MoE layer (one int each), read at a safe point (may
        sync), or None where the backend does not count them (fused: no misses). Not in ``stats()``."""
        return None

    def check_integrity(self) -> None:  # noqa: B027 - optional hook
        """Raise AssertionError when an internal invariant is broken (slot tables, counts)."""

    # -- elastic memory (``engine/elastic.py``): backends with a device slot cache override these -------------
    @property
    def num_slots(self) -> int:
        """Device expert slots that a resize can change (0: none, e.g. fused keeps every expert)."""
        return 0

    @property
    def slot_bytes(self) -> int:
        """Device bytes of one slot."""
        return 0

    @property
    def slot_range(self) -> tuple[int, int]:
        """(fewest, most) slots ``resize_expert_cache`` takes: one layer's top-k, the pool."""
        return (0, 0)

    def resize_expert_cache(self, num_slots: int, fallback: Sequence[int] = ()) -> None:
        """A safe point between steps: the slot cache becomes ``num_slots`` slots (LRU slots go first), or
        the ``fallback`` sizes in turn when the device refuses that many."""
        raise NotImplementedError(f"the {self.name} backend has no expert cache to resize")

    # -- the whole decode step as one CUDA graph (``runner/step_graph.py``) -------------------------------
    def step_capturable(self, tokens: int, top_k: int) -> bool:
        """Whether a decode step of ``tokens`` can be captured into the engine's step graph."""
        return False

    def begin_step_capture(self) -> None:  # noqa: B027 - optional hook
        """The engine starts capturing a decode step: run layers as captured bodies, and record the host's
        share of each (what ``before_step_replay`` must redo at every replay)."""

    def end_step_capture(self, tokens: int) -> None:  # noqa: B027 - optional hook
        """The capture of a ``tokens``-row step ended."""

    def before_step_replay(self, tokens: int) -> None:  # noqa: B027 - optional hook
        """The host's share of every layer of a captured ``tokens``-row step, right before its replay."""
