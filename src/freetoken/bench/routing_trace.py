"""Benchmarks only: MoE layers route by a recorded trace instead of their routers (``install`` puts it on a built
model as each ``MoELayer``'s ``router_override``: ``ft bench e2e --routing-trace``).

A trace is ``[tokens, layers, k]`` uint8 expert ids (``bench/traces/``, ``ft bench record-routing``).
The trace and its cursor live on the compute device, so replay copies nothing per step and runs inside
the engine's CUDA graphs. Row ``t`` of a step reads trace token ``(cursor + t * (n // T)) % n``: the
requests of a decode batch follow their own stretches of the trace, one token further each step (the
last MoE layer moves the cursor). The routing weights stay the router's, at the trace's experts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from freetoken.layers.moe import MoELayer
from freetoken.models.gemma4_layers import GemmaLayer


class RoutingTrace:
    def __init__(self, path: str, num_layers: int, num_experts: int, top_k: int, device: torch.device) -> None:
        trace = np.load(path)
        if trace.ndim != 3 or trace.shape[2] != top_k:
            raise ValueError(f"{path}: a routing trace is [tokens, layers, {top_k}], got {list(trace.shape)}")
        if int(trace.max()) >= num_experts:
            raise ValueError(f"{path}: expert ids up to {int(trace.max())}, the model has {num_experts} experts")
        layer_idx = torch.arange(num_layers) % trace.shape[1]  # more layers than the trace: wrap around
        self.ids = torch.from_numpy(trace.astype(np.int64))[:, layer_idx].to(device)  # [n, L, k]
        self.n = int(trace.shape[0])
        self.last_layer = num_layers - 1
        self.cursor = torch.zeros((), dtype=torch.int64, device=device)

    def route(self, layer: int, probs: torch.Tensor, norm_topk: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """probs [T, E] the router's float32 softmax -> (ids [T, k], weights [T, k]) from the trace."""
        T = probs.shape[0]
        rows = (self.cursor + torch.arange(T, device=probs.device) * (self.n // max(T, 1))) % self.n
        ids = self.ids[rows, layer]
        w = probs.gather(1, ids)
        if norm_topk:
            w = w / w.sum(dim=-1, keepdim=True)
        if layer == self.last_layer:
            self.cursor.add_(1)
        return ids, w


def moe_layers(model: Any) -> list[MoELayer]:
    """The MoE layers of a built model (``DecoderModel``), in order: each layer's ``ffn``, or (Gemma-4) the routed
    experts beside its dense MLP."""
    found = []
    for layer in model.layers:
        beside = layer.moe.layer if isinstance(layer, GemmaLayer) and layer.moe is not None else None
        found += [m for m in (layer.ffn, beside) if isinstance(m, MoELayer)]
    return found


def install(llm: Any, path: str) -> RoutingTrace:
    """Routes every MoE layer of ``llm``'s model by the trace at ``path`` from now on (before its first step: the
    engine's CUDA graphs capture the routing they meet). Raises ``ValueError`` for a trace the model cannot use."""
    eng = llm.engine
    layers = moe_layers(eng.setup.loaded.model)
    hf = eng.hf
    trace = RoutingTrace(path, len(layers), hf.num_experts, hf.top_k, eng.device)
    for layer in layers:
        layer.router_override = trace
    return trace
