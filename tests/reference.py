"""The transformers oracle: greedy continuations with logits and router margins (near-tie rule, DESIGN §8)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOGIT_MARGIN = 1e-3
ROUTER_MARGIN = 1e-4


@dataclass
class RefRun:
    prompt: list[int]
    tokens: list[int]  # greedy continuation
    prompt_logits: torch.Tensor  # [n, V] float32
    min_logit_margin: float  # smallest top1 - top2 over the generated steps
    min_router_margin: float  # smallest k-th minus (k+1)-th router prob over all tokens and MoE layers


def _top2_margin(x: torch.Tensor) -> torch.Tensor:
    top = torch.topk(x, 2, dim=-1).values
    return top[..., 0] - top[..., 1]


@torch.no_grad()
def reference_greedy(model, prompt: list[int], steps: int, top_k: int | None = None) -> RefRun:
    ids = list(prompt)
    first_logits = None
    margins = []
    for _ in range(steps):
        out = model(torch.tensor([ids]), use_cache=False)
        logits = out.logits[0].float()
        if first_logits is None:
            first_logits = logits
        margins.append(float(_top2_margin(logits[-1])))
        ids.append(int(torch.argmax(logits[-1])))
    router_margin = float("inf")
    if top_k:
        out = model(torch.tensor([ids[:-1]]), use_cache=False, output_router_logits=True)
        for rl in out.router_logits:
            probs = torch.softmax(rl.float().reshape(-1, rl.shape[-1]), dim=-1)
            top = torch.topk(probs, top_k + 1, dim=-1).values
            router_margin = min(router_margin, float((top[:, top_k - 1] - top[:, top_k]).min()))
    assert first_logits is not None
    return RefRun(prompt, ids[len(prompt):], first_logits, min(margins), router_margin)


def assert_close_logits(ours: torch.Tensor, ref: torch.Tensor, rel: float = 1e-4) -> None:
    tol = rel * max(1.0, float(ref.abs().max()))
    err = float((ours - ref).abs().max())
    assert err <= tol, f"logits differ by {err:.3g} > {tol:.3g}"
