"""One ``ft bench e2e`` decode row (what e2e.py times, e2e_bound.py bounds and llama_peer.py sets beside llama.cpp),
and the bandwidths its bound used."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BoundBandwidths:
    """GB/s: ``copy_c``/``cpu_c`` measured while both run (B_P', B_H'), ``read`` the streaming host read and ``cpu``
    the CPU kernel alone (the ``cpu`` policy's figures)."""

    copy_c: float | None
    cpu_c: float | None
    read: float | None
    cpu: float | None
    source: str

    def describe(self) -> str:
        def f(v: float | None) -> str:
            return "n/a" if v is None else f"{v:.1f}"

        figures = f"B_P' {f(self.copy_c)}, B_H' {f(self.cpu_c)}, read {f(self.read)}, B_H {f(self.cpu)}"
        return f"{figures} GB/s ({self.source})"



@dataclass
class Row:
    policy: str
    threads: int | None
    batch: int
    e2e_tok_s: float
    moe_tok_s: float | None
    step_graph_replays: int
    runs: list[float]
    hit_rate: float | None = None  # distinct (layer, expert) hits over all routed, end to end
    moe_layers: int = 0
    backend: str = ""  # what ran
    counts: dict[str, float] = field(default_factory=dict)  # timed tokens: layer_steps, misses, cpu_runs
    layer_counts: dict[str, list[int]] = field(default_factory=dict)  # timed tokens: misses, cpu_runs per MoE layer
    expert_bytes: int | None = None  # S: one expert as the pool holds it
    bandwidths: BoundBandwidths | None = None
    bound_tok_s: float | None = None  # e2e_bound.py / bound.py
    of_bound: float | None = None
    peer_runs: list[float] = field(default_factory=list)  # llama-bench tok/s, alternating with ``runs``
    peer_n_cpu_moe: int | None = None
    prefetched: int = 0  # experts filled ahead of their layer (hash layers routed by token id), whole run
    eager_steps: dict[str, int] = field(default_factory=dict)  # decode steps eager though graphs are on, by reason

    def graph_cell(self) -> str:
        """The table's step-graph cell: replays, and the row's eager decode steps by reason (each a fallback: a step
        off the graph costs the host's launches, ms on a big model)."""
        eager = ", ".join(f"{n} eager ({why})" for why, n in sorted(self.eager_steps.items()))
        return f"{self.step_graph_replays}" + (f"; {eager}" if eager else "")

    def layer_misses_per_step(self) -> list[float]:
        """Each MoE layer's misses per timed step ([] without per-layer counts): a prefetched layer's is 0."""
        misses, L = self.layer_counts.get("misses"), self.moe_layers
        steps = self.counts.get("layer_steps", 0) / L if L else 0
        return [m / steps for m in misses] if misses and steps else []

    @property
    def ratio(self) -> float | None:
        return self.e2e_tok_s / self.moe_tok_s if self.moe_tok_s else None
