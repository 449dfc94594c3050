"""Token sampling: greedy, temperature, top-k, top-p, per-request seeded generators."""

from __future__ import annotations

import torch

from freetoken.engine.sampling_params import SamplingParams


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """logits [V] float32 -> one token id. Raises ValueError on logits that hold NaN (a broken model
    step): the engine fails that request alone."""
    if params.greedy:
        return int(torch.argmax(logits).item())
    # Shifted so the best logit is 0: the division cannot overflow to inf - inf = NaN.
    x = (logits - logits.max()) / params.temperature
    if params.top_k > 0 and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        # drop tokens once the mass before them already exceeds top_p (the top token always stays)
        drop = (torch.cumsum(probs, dim=-1) - probs) > params.top_p
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(0, order, sorted_x)
    probs = torch.softmax(x, dim=-1)
    if not bool(torch.isfinite(probs).all()):
        raise ValueError("the model produced non-finite logits")
    return int(torch.multinomial(probs, 1, generator=generator).item())


def make_generator(seed: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g
