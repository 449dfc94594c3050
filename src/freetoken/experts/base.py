"""The one narrow interface between the MoE layer and everything in ``experts/``.

Shapes: T = tokens in the step, D = hidden size, I = expert intermediate size, k = experts per token,
L = MoE layers, E = routed experts per layer, N = L * E pool rows (``eid = moe_layer * E + expert``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from freetoken.hardware.huge_pages import advise_huge_pages

ACTIVATIONS = ("silu",)


@dataclass
class ExpertBanks:
    """All routed experts of all MoE layers, one bank per weight kind, ``eid`` rows.

    ``gate_up[eid]`` is ``[2I, D]`` (gate rows first, then up rows); ``down[eid]`` is ``[D, I]``.
    Filled straight from the checkpoint in this layout; this is the host expert pool's content.
    """

    gate_up: torch.Tensor  # [N, 2I, D]
    down: torch.Tensor  # [N, D, I]
    num_layers: int  # L (MoE layers only)
    num_experts: int  # E
    activation: str = "silu"
    top_k: int = 0  # experts per token per layer (0: unknown); lets caches refuse a size below it up front

    @property
    def hidden_size(self) -> int:
        return int(self.gate_up.shape[2])

    @property
    def intermediate_size(self) -> int:
        return int(self.down.shape[2])

    @property
    def expert_bytes(self) -> int:
        return (self.gate_up[0].numel() + self.down[0].numel()) * self.gate_up.element_size()

    @property
    def pool_bytes(self) -> int:
        return self.expert_bytes * self.num_layers * self.num_experts

    @classmethod
    def empty(
        cls, num_layers: int, num_experts: int, hidden: int, inter: int, dtype: torch.dtype
    ) -> ExpertBanks:
        """Unwritten banks, advised onto huge pages first (``hardware/huge_pages.py`` says why)."""
        n = num_layers * num_experts
        gate_up = torch.empty((n, 2 * inter, hidden), dtype=dtype)
        down = torch.empty((n, hidden, inter), dtype=dtype)
        advise_huge_pages(gate_up)
        advise_huge_pages(down)
        return cls(gate_up=gate_up, down=down, num_layers=num_layers, num_experts=num_experts)


class ExpertBackend(ABC):
    """Runs the routed experts of one MoE layer for the tokens of a step.

    ``forward`` returns ``sum_j topk_w[t, j] * expert_{topk_ids[t, j]}(x[t])`` exactly: every
    routed expert contributes (no dropping), whichever device or cache computes it.
    """

    name: str = "base"

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

    def stats(self) -> dict[str, int | float]:
        """Cumulative counters; DESIGN §4 names (``expert_hits``, ``expert_fills``, ``expert_cpu_runs``)."""
        return {}

    def check_integrity(self) -> None:  # noqa: B027 - optional hook
        """Raise AssertionError when an internal invariant is broken (slot tables, counts)."""

    # -- the whole decode step as one CUDA graph (``engine/step_graph.py``) -------------------------------
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
