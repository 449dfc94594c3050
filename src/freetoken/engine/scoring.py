"""``LLMEngine.score``: logits at every position of a prompt by prefill in chunks (tests, perplexity), with temporary
pages and state slot, chunk- or layer-major; touches no other request."""

from __future__ import annotations

import time

import torch

from freetoken.cache.state_pool import StatePool
from freetoken.engine.detokenizer import IncrementalDetokenizer
from freetoken.engine.errors import InputError, KVBusyError, PromptTooLongError
from freetoken.engine.kv_manager import KVManager
from freetoken.engine.request import Request
from freetoken.models.layer_major import LayerMajorPass
from freetoken.runner.runner import ModelRunner
from freetoken.runner.sampling_params import SamplingParams


def score(
    runner: ModelRunner,
    pages: KVManager,
    states: StatePool | None,
    max_model_len: int,
    token_ids: list[int],
    chunk: int | list[int] | None = None,
    layer_major: bool = False,
) -> torch.Tensor:
    """Logits [n, V] (float32, CPU) at every position of ``token_ids``, computed by prefill in chunks of
    ``chunk`` tokens (a list: these sizes in turn; None: one shot), each attending to the K/V of the chunks
    before it, chunk-major or (``layer_major``) layer by layer over all chunks, with temporary pages (for tests
    and perplexity; does not touch other requests)."""
    n = len(token_ids)
    if not 0 < n < max_model_len:
        raise PromptTooLongError(n, max_model_len) if n else InputError("the prompt is empty")
    step = chunk if isinstance(chunk, int) and chunk > 0 else n
    sizes = list(chunk) if isinstance(chunk, list) else [min(step, n - s) for s in range(0, n, step)]
    if sum(sizes) != n or min(sizes) < 1:
        raise InputError(f"chunk sizes {sizes} do not cut {n} tokens")
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    kv = runner.kv
    rid = f"score-{time.monotonic_ns()}"
    if kv.pages_for(n) > kv.num_pages:
        raise InputError(f"{n} tokens are more than the whole KV cache holds ({kv.num_pages * kv.page_size} tokens)")
    if not pages.reserve(kv.pages_for(n)):
        raise KVBusyError(f"{n} tokens do not fit the free KV pages now (running requests hold them); retry later")
    held = kv.allocate(kv.pages_for(n), rid)
    req = Request(rid, list(token_ids), SamplingParams(), n + 1, IncrementalDetokenizer(None, [], [], True))
    try:
        req.state_slot = states.allocate(rid) if states is not None else None
        req.pages = held
        chunks = [([(req, size)], [start]) for size, start in zip(sizes, starts)]
        if layer_major:
            if runner.backend is not None:
                runner.backend.begin_step(chunks[0][0][0][1], False)
            built = [runner.build_batch(items, starts)[:2] for items, starts in chunks]
            hidden = LayerMajorPass(runner.model, built, kv).run()
            return torch.cat([runner.model.logits(h).cpu() for h in hidden])
        out = []
        for items, starts in chunks:
            if runner.backend is not None:
                runner.backend.begin_step(items[0][1], False)
            input_ids, batch, _ = runner.build_batch(items, starts)
            out.append(runner.model.logits(runner.model.forward(input_ids, batch, kv)).cpu())
        return torch.cat(out)
    finally:
        kv.free(held, rid)
        if states is not None and req.state_slot is not None:
            states.free(req.state_slot, rid)


def check_token_ids(token_ids: list[int], vocab: int) -> None:
    bad = next((t for t in token_ids if not (0 <= int(t) < vocab)), None)
    if bad is not None:
        raise InputError(f"token id {bad} is outside the vocabulary [0, {vocab})")


def prompt_logprobs(
    logits: torch.Tensor, token_ids: list[int], top: int
) -> list[tuple[float, list[tuple[int, float]]]]:
    """From ``score``'s logits [n, V]: per token after the first, its logprob under the tokens before it and the
    ``top`` most likely tokens there (best first), all in float32 as the sampler computes them."""
    logp = torch.log_softmax(logits[:-1].float(), dim=-1)
    nxt = torch.tensor(token_ids[1:], dtype=torch.long)
    own = logp.gather(1, nxt[:, None])[:, 0].tolist()
    if top <= 0:
        return [(lp, []) for lp in own]
    vals, idx = logp.topk(min(top, logp.shape[-1]), dim=-1)
    return [(lp, list(zip(i, v))) for lp, i, v in zip(own, idx.tolist(), vals.tolist())]
