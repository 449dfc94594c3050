"""Layer-major prefill: a scheduled prefill that spans several chunks runs layer by layer over all of them
(``models/layer_major.py``), so a cold prompt streams the expert pool through the slot pool once, not once
per chunk. Between any two units (layer, chunk) the engine may stop and run other requests' decode steps,
within a latency budget; the job carries on at the next step.

Planning: when a scheduled prefill item was cut by the step's token budget, every prefill item of the step
is extended to its whole remaining prompt, as far as the activations (``h`` and ``x`` of every token kept
per layer) fit the memory plan's activations share and the KV pool has the pages; the result is cut into chunks of at
most ``max_batched_tokens``. When fewer than two chunks come of it the step stays chunk-major. While a job runs
its requests are ``busy``: the scheduler neither schedules nor preempts them, and admits no new request.

Beside running streams (the step had decode items) the chunks are balanced instead (``balanced_chunks``): a unit's
cost grows with its chunk's context (attention reads every earlier token), so with equal chunks the last chunks'
units are the longest and set the other streams' worst inter-token gap; balanced chunks cost at most what a full
chunk at context 0 costs, the later ones holding fewer tokens.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from freetoken.checkpoint.hf_config import HFConfig
from freetoken.config import EngineConfig
from freetoken.engine.kv_manager import KVManager
from freetoken.engine.request import Request
from freetoken.models.layer_major import LayerMajorPass
from freetoken.runner.runner import ModelRunner
from freetoken.runner.step_sampler import Choice

ORDERS = ("auto", "layer", "chunk")


@dataclass
class Chunk:
    items: list[tuple[Request, int]]  # (request, tokens) in this chunk
    starts: list[int]  # first token of each item


def cut_chunks(extents: list[tuple[Request, int, int]], chunk_tokens: int) -> list[Chunk]:
    """(request, first token, tokens) runs -> chunks of at most ``chunk_tokens`` tokens, in order."""
    chunks: list[Chunk] = [Chunk([], [])]
    room = chunk_tokens
    for req, start, n in extents:
        while n > 0:
            if room == 0:
                chunks.append(Chunk([], []))
                room = chunk_tokens
            k = min(n, room)
            chunks[-1].items.append((req, k))
            chunks[-1].starts.append(start)
            start, n, room = start + k, n - k, room - k
    return chunks


def attention_crossover(hf: HFConfig) -> float:
    """Context length at which a token's attention flops in a layer (QK and PV: 4 * heads * head_dim per earlier
    token) equal its projections' and MLP's (2 per weight it reads: q/k/v/o, the routed experts' top-k or the dense
    MLP, the shared expert): a unit of ``n`` tokens starting at context ``s`` costs ~ n * (crossover + s + n / 2)."""
    d, hd = hf.hidden_size, hf.head_dim
    weights = d * (hf.num_heads + 2 * hf.num_kv_heads) * hd + hf.num_heads * hd * d
    if hf.num_experts:
        weights += hf.top_k * 3 * d * hf.moe_intermediate_size + 3 * d * hf.shared_expert_intermediate_size
    else:
        weights += 3 * d * hf.intermediate_size
    return 2 * weights / (4 * hf.num_heads * hd)


def chunk_cost(n: int, start: int, crossover: float) -> float:
    """The cost model of ``attention_crossover``: ``n`` tokens at context ``start``."""
    return n * (crossover + start + n / 2)


def balanced_chunks(extents: list[tuple[Request, int, int]], chunk_tokens: int, crossover: float) -> list[Chunk]:
    """Like ``cut_chunks``, but each chunk also costs (``chunk_cost``) at most a full chunk at context 0: later
    pieces of a long prompt get fewer tokens, so no unit of the pass takes much longer than its first."""
    target = chunk_cost(chunk_tokens, 0, crossover)
    chunks: list[Chunk] = [Chunk([], [])]
    room, budget = chunk_tokens, target
    for req, start, n in extents:
        while n > 0:
            b = crossover + start  # k * (b + k / 2) <= budget
            k = min(n, room, math.floor(-b + math.sqrt(b * b + 2 * budget)))
            if k <= 0:
                if chunks[-1].items:  # full: the next chunk
                    chunks.append(Chunk([], []))
                    room, budget = chunk_tokens, target
                    continue
                k = 1  # a lone token costs more than a chunk at 0 (no such crossover in practice): progress
            chunks[-1].items.append((req, k))
            chunks[-1].starts.append(start)
            room, budget = room - k, budget - chunk_cost(k, start, crossover)
            start, n = start + k, n - k
    return chunks


class LayerMajorJob:
    """One layer-major prefill in flight: its requests' extents, the pass, and where each one samples."""

    def __init__(self, runner: ModelRunner, extents: list[tuple[Request, int, int]], chunks: list[Chunk]) -> None:
        self.runner = runner
        self.extents = extents
        self.chunks = chunks
        built = [runner.build_batch(c.items, c.starts) for c in self.chunks]
        self.sample_at: list[tuple[Request, int, int]] = []  # (request, chunk, row) of a request's last token
        for c, (chunk, (_, _, rows)) in enumerate(zip(self.chunks, built)):
            for (req, n), start, row in zip(chunk.items, chunk.starts, rows):
                if start + n == req.num_tokens:
                    self.sample_at.append((req, c, row))
        self.tokens = sum(n for _, _, n in extents)
        self.pass_ = LayerMajorPass(runner.model, [(ids, batch) for ids, batch, _ in built], runner.kv)
        for req, _, _ in extents:
            req.busy = True

    @property
    def requests(self) -> list[Request]:
        return [req for req, _, _ in self.extents]

    @property
    def done(self) -> bool:
        return self.pass_.done

    def advance(self, budget_s: float | None) -> None:
        """Runs units until done, or (``budget_s`` set) while the next unit, as long as the last one took, still
        ends within ``budget_s`` (at least one unit per call)."""
        backend = self.runner.backend
        if backend is not None:  # a safe point: other steps may have run since the last unit
            backend.begin_step(int(self.pass_.batches[self.pass_.chunk].positions.shape[0]), False)
        t0 = time.perf_counter()
        while not self.pass_.done:
            t_unit = time.perf_counter()
            self.pass_.run_unit()
            if budget_s is not None:
                if self.runner.device.type == "cuda":
                    torch.cuda.synchronize(self.runner.device)  # the budget is wall time, not enqueue time
                now = time.perf_counter()
                if now - t0 + (now - t_unit) > budget_s:
                    return

    def finish(self) -> list[tuple[Request, Choice]]:
        """The pass is done: the requests' tokens count as computed; a choice for each that reached its end."""
        for req, start, n in self.extents:
            req.num_computed_tokens = start + n
            req.busy = False
        if not self.sample_at:
            return []
        hidden = self.pass_.hidden()
        rows = torch.stack([hidden[c][row] for _, c, row in self.sample_at])
        reqs = [req for req, _, _ in self.sample_at]
        logits = self.runner.model.logits(rows)
        return list(zip(reqs, self.runner.sampler.sample(reqs, logits)))

    def cancel(self) -> None:
        """Dropped before done (one of its requests finished): the others recompute these tokens later."""
        for req, _, _ in self.extents:
            req.busy = False


class LayerMajorPlanner:
    def __init__(
        self, config: EngineConfig, pages: KVManager, runner: ModelRunner, hf: HFConfig, tokens: int
    ) -> None:
        """``tokens``: how many tokens' activations one pass may keep (the memory plan's activations share)."""
        if config.prefill_order not in ORDERS:
            raise ValueError(f"prefill_order must be one of {ORDERS}, got {config.prefill_order!r}")
        self.config, self.pages, self.runner = config, pages, runner
        self.tokens = tokens
        self.crossover = attention_crossover(hf)
        self.jobs = 0
        self.balanced_jobs = 0  # jobs cut into balanced chunks (beside running streams)

    @property
    def enabled(self) -> bool:
        """auto: where the MoE backend streams whole layers through its slot pool (there it saves copies)."""
        order = self.config.prefill_order
        if order != "auto":
            return order == "layer"
        streamer = getattr(self.runner.backend, "streamer", None)
        return streamer is not None and streamer.mode != "off"

    def token_limit(self) -> int:
        """Tokens whose activations one pass keeps: the memory plan's share (``layer_major_tokens`` when given)."""
        return self.tokens

    def plan(self, items: list[tuple[Request, int]]) -> tuple[LayerMajorJob | None, list[tuple[Request, int]]]:
        """Takes the step's prefill items into a job when one of them was cut by the token budget and the
        extended prefill fills at least two chunks; returns (job or None, the items left to run now)."""
        prefill = [(r, n) for r, n in items if r.num_tokens - r.num_computed_tokens > 1]
        if not self.enabled or not any(n < r.num_tokens - r.num_computed_tokens for r, n in prefill):
            return None, items
        chunk = self.config.max_batched_tokens
        left = self.token_limit()
        extents: list[tuple[Request, int, int]] = []
        for req, n in prefill:
            want = self.pages.chunk(req, max(n, min(req.num_tokens - req.num_computed_tokens, left)))  # >= n
            if want > n and not self.pages.grow(req, want):
                want = n  # the KV pool is short: this one stays at its scheduled chunk
            extents.append((req, req.num_computed_tokens, want))
            left -= want
        total = sum(n for _, _, n in extents)
        if total <= chunk:
            return None, items
        self.jobs += 1
        beside_decode = len(prefill) < len(items)  # the step also decodes other requests
        if beside_decode:
            self.balanced_jobs += 1
            chunks = balanced_chunks(extents, chunk, self.crossover)
        else:
            chunks = cut_chunks(extents, chunk)
        job = LayerMajorJob(self.runner, extents, chunks)
        taken = {id(r) for r, _ in prefill}
        return job, [(r, n) for r, n in items if id(r) not in taken]
