"""How well a MoE layer's experts can be known one layer early: the next layer's router applied to this layer's input.

``ft bench predict-routing`` (``python -m freetoken.bench.predict_routing``). Issue #39's candidate: start layer
l + 1's fills while layer l computes, from ``route_{l+1}(x_l)`` (x_l: layer l's MoE input). A prediction only
changes what is cached, never an output, so what matters is its recall: the share of layer l + 1's routed experts it
named. Greedy decode through ``LLM`` (the prompts of ``record_routing``); for every single-token decode step and every
MoE layer after the first, printed per layer and over all:

- ``next@k``: recall of the k experts ``route_{l+1}(x_l)`` picks (the layer's own routing function);
- ``next@2k``: recall of the 2k best scores of layer l + 1's router on x_l (twice the copies for more hits);
- ``prev token``: recall of the experts the same layer routed the previous token to (what an LRU cache keeps: the
  baseline a prediction must beat to be worth its copies).

    python -m freetoken.bench.predict_routing --model DIR --tokens 500 [--chat] [--device cpu]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
import torch.nn.functional as F

from freetoken.bench.record_routing import RecordingBackend, decode, install_wrapper
from freetoken.config import EngineConfig, add_config_args, config_kwargs
from freetoken.experts.base import ExpertBackend
from freetoken.layers.moe import MoELayer


def scores(m: MoELayer, x: torch.Tensor) -> torch.Tensor:
    """The router's per-expert preference [T, E] (float32) that its top-k reads: softmax logits, or sigmoid scores
    plus the correction bias."""
    logits = F.linear(x.float(), m.router.float(), None if m.router_bias is None else m.router_bias.float())
    if m.sigmoid is not None:
        assert m.bias is not None
        return torch.sigmoid(logits) + m.bias.float()
    return logits


def recall(predicted: torch.Tensor, actual: torch.Tensor) -> float:
    """Share of ``actual`` [k] found in ``predicted`` [n]."""
    return float(torch.isin(actual, predicted).float().mean())


class PredictingBackend(RecordingBackend):
    """The recorder (decode steps of one token), also predicting each next MoE layer's experts from this layer's
    input and scoring the prediction when that layer routes."""

    MEASURES = ("next@k", "next@2k", "prev token")

    def __init__(self, inner: ExpertBackend, layers: list[MoELayer]) -> None:
        super().__init__(inner, len(layers))
        self.layers = layers
        self._pred: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> (its k picks, its 2k best)
        self._prev: dict[int, torch.Tensor] = {}  # layer -> the previous decode token's experts
        self._cur: dict[str, list[float]] = {}  # this decode token's recall per measure and layer
        self.hits: dict[str, list[list[float]]] = {k: [] for k in self.MEASURES}  # per token

    def begin_step(self, num_tokens: int, is_decode: bool) -> None:
        self._flush_hits()
        if not (is_decode and num_tokens == 1):  # a prefill or a batch: predictions and history start over
            self._pred.clear()
            self._prev.clear()
        super().begin_step(num_tokens, is_decode)

    def _flush_hits(self) -> None:
        for k, v in self._cur.items():
            self.hits[k].append(v)
        self._cur = {}

    def forward(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        if self._decode:
            if not self._cur:
                self._cur = {k: [float("nan")] * self.num_layers for k in self.MEASURES}
            actual = topk_ids[0]
            if layer in self._pred:
                at_k, at_2k = self._pred.pop(layer)
                self._cur["next@k"][layer], self._cur["next@2k"][layer] = recall(at_k, actual), recall(at_2k, actual)
            if layer in self._prev:
                self._cur["prev token"][layer] = recall(self._prev[layer], actual)
            self._prev[layer] = actual.clone()
            if layer + 1 < len(self.layers):
                nxt, k = self.layers[layer + 1], topk_ids.shape[1]
                wide = scores(nxt, x)[0].topk(min(2 * k, nxt.router.shape[0])).indices
                self._pred[layer + 1] = (nxt.route(x)[0][0], wide)
        return super().forward(layer, x, topk_ids, topk_w)

    def table(self) -> dict[str, np.ndarray]:
        """Per measure: the mean recall per MoE layer [L] (NaN where never scored)."""
        self._flush_hits()
        out = {}
        for k, rows in self.hits.items():
            a = np.array(rows, dtype=float).reshape(-1, self.num_layers)
            n = np.isfinite(a).sum(axis=0)
            out[k] = np.where(n > 0, np.nansum(a, axis=0) / np.maximum(n, 1), np.nan)
        return out


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--tokens", type=int, default=500, help="decode tokens in all")
    p.add_argument("--chat", action="store_true", help="chat-formatted built-in questions, stopping at EOS")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sample (seeded) instead of greedy: random weights loop greedily")  # fmt: skip
    add_config_args(p, EngineConfig, only=("model", "device", "dtype", "moe_backend", "expert_cache"))
    return p


def run(args: argparse.Namespace) -> int:
    from freetoken import LLM

    llm = LLM(**config_kwargs(EngineConfig, args))
    rec = install_wrapper(llm, PredictingBackend)
    decode(llm, rec, args.tokens, args.chat, temperature=args.temperature)
    t = rec.table()
    L = rec.num_layers
    print(f"# {len(rec.rows)} decode tokens, {L} MoE layers; recall of layer l's routed experts")
    print("| measure | " + " | ".join(f"l{i}" for i in range(L)) + " | mean (l >= 1) |")
    print("|---|" + "---|" * (L + 1))
    for k, v in t.items():
        cells = " | ".join("–" if np.isnan(x) else f"{x:.2f}" for x in v)
        print(f"| {k} | {cells} | {float(np.nanmean(v[1:])) if L > 1 else float('nan'):.3f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(add_arguments(argparse.ArgumentParser(prog="ft bench predict-routing")).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
