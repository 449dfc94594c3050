"""Batched token sampling on the device: no host round trip, the same ops eager or inside a CUDA graph.

Per row, in order: repetition / presence / frequency penalties, logit bias, an allowed-token mask
(structured output), then greedy rows take the argmax; the others divide by their temperature, keep
their top-k, top-p and min-p set, and draw by the exponential race (Gumbel-max) with counter-based
noise (``noise.py``), so a seeded request draws the same tokens in any batch. Logprobs are of the
model's raw distribution (before any of the above), as OpenAI reports them.

B = rows that sample this step, V = vocabulary, R = rows of the penalty state (running requests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from freetoken.kernels.triton_support import use_triton
from freetoken.runner import noise
from freetoken.runner.constraint import apply_bitmask

MAX_TOP_LOGPROBS = 20
TOPK_KERNEL_MAX = 64  # kernels/topk_triton.py's K_LIMIT (not imported: triton is optional)


@dataclass
class SamplingBatch:
    """One step's per-row settings, as device tensors (static buffers under CUDA graphs)."""

    temperature: torch.Tensor  # [B] float32; below 1e-5: greedy
    top_k: torch.Tensor  # [B] int64; 0: no cut
    top_p: torch.Tensor  # [B] float32 in (0, 1]
    min_p: torch.Tensor  # [B] float32 in [0, 1]
    seed_lo: torch.Tensor  # [B] int64: the seed's two 32-bit halves
    seed_hi: torch.Tensor
    step: torch.Tensor  # [B] int64: tokens this request generated before this one
    rows: torch.Tensor  # [B] int64: each row's row in the penalty state
    presence: torch.Tensor  # [B] float32 (OpenAI presence_penalty; 0: off)
    frequency: torch.Tensor  # [B] float32 (OpenAI frequency_penalty; 0: off)
    repetition: torch.Tensor  # [B] float32 (HF repetition_penalty; 1: off)


@dataclass(frozen=True)
class Features:
    """Which optional stages run: a step turns off what no row asks for (a step graph per set)."""

    draw: bool = True  # any row samples (False: every row is greedy, no noise needed)
    cuts: bool = True  # top-k / top-p / min-p (a sort of every row)
    penalties: bool = True
    logprobs: bool = True
    mask: bool = False  # a row is grammar-constrained: the allowed-token bitmask applies (a step-graph input)
    top_k: int = 0  # > 0: every drawn row keeps at most this many tokens (top_k): the cut takes torch.topk of them
    # instead of sorting the whole row (the same kept set: nothing past a row's top_k survives the cut anyway)
    nucleus: bool = False  # no drawn row has a top_k: on CUDA the top-p / min-p cut is a radix select, not a sort
    # (kernels/nucleus_triton.py)
    mixed_top_k: int = 0  # > 0: some drawn rows have a top_k (at most this) and others none: on CUDA each row takes
    # the draw of its own kind (topk_triton's or nucleus_triton's); elsewhere the sort, as top_k 0 says


@dataclass
class Sampled:
    ids: torch.Tensor  # [B] int64
    logprob: torch.Tensor | None = None  # [B] float32, of the sampled token
    top_ids: torch.Tensor | None = None  # [B, MAX_TOP_LOGPROBS] int64
    top_logprobs: torch.Tensor | None = None  # [B, MAX_TOP_LOGPROBS] float32


class PenaltyState:
    """Per running request: how often it generated each token, and which tokens it has seen (prompt and
    output) — what the penalties read. Rows are handed out by the engine; ``[R, V]`` on the device.

    ``update`` and ``apply_penalties`` run inside the step graph: fixed-shape gathers and scatters on the flat
    ``[R*V]`` views, no host read (no ``index_put_(accumulate=True)``, which some torch versions cannot capture).
    ``reset`` runs on the host at a request's first step, outside any graph."""

    def __init__(self, rows: int, vocab: int, device: torch.device) -> None:
        self.vocab = vocab
        self.counts = torch.zeros((rows, vocab), dtype=torch.int32, device=device)
        self.seen = torch.zeros((rows, vocab), dtype=torch.bool, device=device)

    def reset(self, row: int, prompt_ids: list[int]) -> None:
        self.counts[row].zero_()
        self.seen[row].zero_()
        if prompt_ids:
            ids = torch.tensor(prompt_ids, dtype=torch.int64).to(self.seen.device)
            self.seen[row].scatter_(0, ids, True)

    def update(self, rows: torch.Tensor, ids: torch.Tensor) -> None:
        """Counts token ``ids[i]`` in row ``rows[i]`` ([B] int64 each); a row may repeat (the shared row, the
        graph's padding rows): every occurrence counts."""
        flat = rows * self.vocab + ids
        self.counts.view(-1).scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        self.seen.view(-1).scatter_(0, flat, True)


def apply_penalties(x: torch.Tensor, b: SamplingBatch, state: PenaltyState) -> torch.Tensor:
    """Repetition, presence and frequency penalties from each row's counts and seen flags: one Triton launch on
    CUDA (``kernels/penalty_triton.py``), these torch ops (the reference) elsewhere."""
    if use_triton(x) and x.dtype == torch.float32:
        from freetoken.kernels.penalty_triton import penalties_triton

        return penalties_triton(x, state.counts, state.seen, b.rows, b.repetition, b.presence, b.frequency)
    counts = state.counts.index_select(0, b.rows).float()  # [B, V]
    seen = state.seen.index_select(0, b.rows)
    r = b.repetition[:, None]
    x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    return x - b.presence[:, None] * (counts > 0).float() - b.frequency[:, None] * counts


def sample_batch(
    logits: torch.Tensor,
    b: SamplingBatch,
    state: PenaltyState | None = None,
    features: Features | None = None,
    bitmask: torch.Tensor | None = None,
) -> Sampled:
    """logits [B, V] float32 -> one token per row (and logprobs when asked)."""
    f = features or Features()
    x = logits
    if f.penalties and state is not None:
        x = apply_penalties(x, b, state)
    if bitmask is not None:
        x = apply_bitmask(x, bitmask)
    if not f.draw:
        return _with_logprobs(Sampled(torch.argmax(x, dim=-1)), logits, f)
    if f.cuts and f.nucleus and use_triton(x):
        from freetoken.kernels.nucleus_triton import nucleus_draw_triton

        # the cut at each row's temperature (a greedy row's at 1, which keeps its argmax), drawn in its masking pass
        ids = nucleus_draw_triton(x, b.temperature, b.top_p, b.min_p, b.seed_lo, b.seed_hi, b.step)
    elif f.cuts and 0 < f.mixed_top_k <= TOPK_KERNEL_MAX and use_triton(x):
        from freetoken.kernels.nucleus_triton import nucleus_draw_triton
        from freetoken.kernels.topk_triton import topk_draw_triton

        # rows with a top-k take its draw, the others the nucleus one (each kernel's other rows are discarded)
        k = 1 << (f.mixed_top_k - 1).bit_length()
        by_k = topk_draw_triton(x, k, b.temperature, b.top_k, b.top_p, b.min_p, b.seed_lo, b.seed_hi, b.step)
        by_p = nucleus_draw_triton(x, b.temperature, b.top_p, b.min_p, b.seed_lo, b.seed_hi, b.step)
        ids = torch.where(b.top_k > 0, by_k, by_p)
    elif f.cuts and 0 < f.top_k <= TOPK_KERNEL_MAX and use_triton(x):
        from freetoken.kernels.topk_triton import topk_draw_triton

        # every drawn row's top-k within f.top_k: the row's best (a power of 2 of them), cut and drawn in two launches
        k = 1 << (f.top_k - 1).bit_length()
        ids = topk_draw_triton(x, k, b.temperature, b.top_k, b.top_p, b.min_p, b.seed_lo, b.seed_hi, b.step)
    elif f.cuts:
        greedy = b.temperature < 1e-5
        temp = torch.where(greedy, torch.ones_like(b.temperature), b.temperature)
        z = _cut((x - x.max(dim=-1, keepdim=True).values) / temp[:, None], b, f.top_k)  # shifted: no overflow
        # z's best is 0 and its temperature 1: the draw's own shift and division leave it as it is
        ids = torch.where(greedy, torch.argmax(x, dim=-1), gumbel_argmax(z, b, unit=True))
    else:
        ids = gumbel_argmax(x, b)
    return _with_logprobs(Sampled(ids), logits, f)


def gumbel_argmax(x: torch.Tensor, b: SamplingBatch, unit: bool = False) -> torch.Tensor:
    """Per row of x [B, V]: rows at temperature < 1e-5 argmax x, the others argmax((x - max x) / temp + g), g the
    Gumbel noise of the row's key (``noise.row_keys`` of its seed and step; ``noise.uniform``): the exponential race.
    ``unit``: every row drawn, at temperature 1. One Triton pass on CUDA (``kernels/draw_triton.py``, the keys
    included), these torch ops (the reference) elsewhere."""
    if use_triton(x):
        from freetoken.kernels.draw_triton import gumbel_argmax_triton

        return gumbel_argmax_triton(x, b.temperature, b.seed_lo, b.seed_hi, b.step, unit)
    keys = noise.row_keys(b.seed_lo, b.seed_hi, b.step)
    ones = torch.ones_like(b.temperature)
    if unit:
        return gumbel_argmax_reference(x, ones, keys, torch.zeros_like(ones, dtype=torch.bool))
    greedy = b.temperature < 1e-5
    return gumbel_argmax_reference(x, torch.where(greedy, ones, b.temperature), keys, greedy)


def gumbel_argmax_reference(
    x: torch.Tensor, temp: torch.Tensor, keys: torch.Tensor, greedy: torch.Tensor
) -> torch.Tensor:
    z = (x - x.max(dim=-1, keepdim=True).values) / temp[:, None]  # shifted: the division cannot overflow
    gumbel = -torch.log(-torch.log(noise.uniform(keys, x.shape[1])))
    return torch.where(greedy, torch.argmax(x, dim=-1), torch.argmax(z + gumbel, dim=-1))


def _with_logprobs(out: Sampled, logits: torch.Tensor, f: Features) -> Sampled:
    """The sampled tokens' logprobs and each row's best ``MAX_TOP_LOGPROBS`` (when asked): on CUDA two Triton launches
    (``kernels/logprobs_triton.py``), elsewhere log_softmax and topk."""
    if f.logprobs and use_triton(logits) and logits.dtype == torch.float32:
        from freetoken.kernels.logprobs_triton import logprobs_triton

        n = min(MAX_TOP_LOGPROBS, logits.shape[1])
        out.logprob, out.top_logprobs, out.top_ids = logprobs_triton(logits.contiguous(), out.ids, n)
    elif f.logprobs:
        lp = torch.log_softmax(logits, dim=-1)
        out.logprob = lp.gather(1, out.ids[:, None])[:, 0]
        out.top_logprobs, out.top_ids = torch.topk(lp, min(MAX_TOP_LOGPROBS, lp.shape[1]), dim=-1)
    return out


def _cut(z: torch.Tensor, b: SamplingBatch, top_k: int = 0) -> torch.Tensor:
    """Top-k, then top-p over what is left, then min-p, each row by its own settings (the top token
    always stays). z [B, V]: temperature-scaled logits with the row's best at 0. ``top_k`` > 0: no drawn row keeps
    more than ``top_k`` tokens, so the row's best ``top_k`` (torch.topk, in order) stand for its full sort."""
    V = z.shape[1]
    zs, order = torch.topk(z, top_k, dim=-1) if 0 < top_k < V else torch.sort(z, dim=-1, descending=True)
    n = zs.shape[1]
    rank = torch.arange(n, device=z.device)[None, :]
    k = torch.where(b.top_k > 0, b.top_k.clamp(max=n), torch.full_like(b.top_k, n))
    keep = rank < k[:, None]
    probs = torch.softmax(zs.masked_fill(~keep, float("-inf")), dim=-1)
    keep &= (torch.cumsum(probs, dim=-1) - probs) <= b.top_p[:, None]
    keep &= probs >= b.min_p[:, None] * probs[:, :1]
    keep[:, 0].fill_(True)  # (a fill: setitem with a Python value makes a host tensor each call)
    return torch.full_like(z, float("-inf")).scatter(1, order, zs.masked_fill(~keep, float("-inf")))
