"""DeepSeek-V4's MoE layer: a router whose scores are ``sqrtsoftplus`` (sqrt(softplus(logits)); ``sigmoid`` and
``softmax`` too), top-k of the scores plus a correction bias, or, on the first ``hash_moe`` layers, the experts a
frozen table assigns to the token id (``tid2eid[input_ids]``: known before the layer runs); either way the weights are
the chosen experts' scores renormalised, times ``routed_scaling_factor``. Routed experts run through ``experts/``
under the clamped SiLU (``experts/reference.py`` ``dsv4``); one shared expert, clamped the same way, is added."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from freetoken.kernels.linear import linear
from freetoken.layers.moe import MoELayer

SCORING = ("sqrtsoftplus", "sigmoid", "softmax")


def scores_of(logits: torch.Tensor, scoring: str) -> torch.Tensor:
    """Router logits [T, E] -> float32 scores."""
    logits = logits.float()
    if scoring == "sqrtsoftplus":
        return torch.sqrt(F.softplus(logits))
    if scoring == "sigmoid":
        return torch.sigmoid(logits)
    if scoring == "softmax":
        return torch.softmax(logits, dim=-1)
    raise ValueError(f"scoring_func must be one of {SCORING}, got {scoring!r}")


@dataclass
class ClampedMLP:
    """The shared expert: ``down(silu(min(gate, l)) * clamp(up, -l, l))``."""

    gate: torch.Tensor  # [I, D]
    up: torch.Tensor  # [I, D]
    down: torch.Tensor  # [D, I]
    limit: float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = linear(x, self.gate).clamp(max=self.limit)
        u = linear(x, self.up).clamp(min=-self.limit, max=self.limit)
        return linear(F.silu(g) * u, self.down)


@dataclass
class V4MoE(MoELayer):
    scoring: str = "sqrtsoftplus"
    scale: float = 1.0  # routed_scaling_factor
    tid2eid: torch.Tensor | None = None  # [V, k] int64: a hash layer's experts by token id (no bias then)
    shared_mlp: ClampedMLP | None = None

    def choose(self, x: torch.Tensor, ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, D], the step's token ids [T] -> (experts [T, k] int64, weights [T, k] float32)."""
        scores = scores_of(F.linear(x, self.router), self.scoring)  # [T, E]
        if self.tid2eid is not None:
            assert ids is not None, "a hash-routed layer needs the step's token ids"
            experts = self.tid2eid[ids]
        elif self.router_override is not None:
            experts = self.router_override.route(self.moe_index, scores, True)[0]
        else:
            assert self.bias is not None
            experts = torch.topk(scores + self.bias, self.top_k, dim=-1, sorted=False).indices
        return experts, self._weights(scores, experts)

    def _weights(self, scores: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        w = scores.gather(1, experts)
        return w / (w.sum(dim=-1, keepdim=True) + 1e-20) * self.scale

    def prefetch(self, ids: torch.Tensor) -> None:
        """A hash layer's experts are known from the step's token ids before it runs: tell the backend."""
        if self.tid2eid is not None:
            self.backend.prefetch(self.moe_index, self.tid2eid[ids])

    def forward_ids(self, x: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
        experts, w = self.choose(x, ids)
        out = self.backend.forward(self.moe_index, x, experts, w)
        if self.shared_mlp is not None:
            out = out + self.shared_mlp.forward(x)
        return out
