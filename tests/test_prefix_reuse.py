"""Prefix reuse in the engine (CPU, fp32, a tiny random qwen3_moe checkpoint): a request starts after
the longest prefix cached in the radix tree, computes only the rest, and produces the same greedy
tokens as an engine without the cache and as transformers (near-tie rule, DESIGN §8)."""

from __future__ import annotations

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.cache.kv_pool import KVPool
from freetoken.cache.radix import RadixCache
from freetoken.engine.detokenizer import IncrementalDetokenizer
from freetoken.engine.kv_manager import KVManager
from freetoken.engine.request import Request
from reference import LOGIT_MARGIN, ROUTER_MARGIN, reference_greedy
from tiny_models import save_checkpoint

S = 8  # page size
STEPS = 8
# Seeds of the random prompts, picked so transformers' reference has no near ties on them (asserted).
MULTI_TURN_SEED, PRESSURE_SEED, PREEMPT_SEED = 50, 40, 54
PARAMS = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("prefix")
    model = save_checkpoint("qwen3_moe", d, seed=1)
    return d, model


@pytest.fixture(autouse=True)
def _check_every_step(freetoken_env):
    freetoken_env("FREETOKEN_DEBUG", "1")  # the engine checks every cache's integrity after each step


def _tokens(seed: int, n: int) -> list[int]:
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _reference(model, prompt: list[int], steps: int = STEPS) -> list[int]:
    """transformers' greedy tokens, asserting the prompt is free of near ties (else pick other seeds)."""
    r = reference_greedy(model, prompt, steps, top_k=model.config.num_experts_per_tok)
    assert r.min_logit_margin > LOGIT_MARGIN and r.min_router_margin > ROUTER_MARGIN, "near tie: change the seed"
    return r.tokens


def _llm(d, **kw) -> LLM:
    return LLM(model=str(d), device="cpu", dtype="float32", page_size=S, **kw)


def _run(llm: LLM, prompt: list[int]) -> tuple[list[int], int, int]:
    """Greedy tokens, and the prefill tokens computed / prompt tokens reused for this request."""
    before = llm.stats()
    out = llm.generate([prompt], PARAMS)[0].token_ids
    after = llm.stats()
    computed = after["prefill_tokens"] - before["prefill_tokens"]
    return out, computed, after["prefix_tokens_reused"] - before["prefix_tokens_reused"]


def test_second_request_sharing_90_percent_prefills_only_the_rest(ckpt):
    d, model = ckpt
    first = _tokens(1, 100)
    second = first[:90] + _tokens(2, 10)  # 90% shared, diverging inside page 11
    llm = _llm(d)
    out1, computed1, reused1 = _run(llm, first)
    assert (computed1, reused1) == (100, 0)
    assert llm.stats()["radix_pages"] == (100 + STEPS - 1) // S  # every full computed page entered the tree
    out2, computed2, reused2 = _run(llm, second)
    assert computed2 <= 10 + S - 1
    assert (reused2, computed2) == (88, 12)  # 11 whole pages shared
    fresh = _llm(d, prefix_cache=False)
    assert _run(fresh, second)[0] == out2 == _reference(model, second)
    assert _run(fresh, first)[0] == out1 == _reference(model, first)
    assert fresh.stats()["prefix_tokens_reused"] == 0 and fresh.stats()["radix_pages"] == 0
    # the very same prompt again: everything but the last token comes from the tree
    assert _run(llm, second) == (out2, 4, 96)
    llm.check_integrity()
    assert llm.stats()["kv_pages_used"] == 0  # tree pages are cached, not in use


def test_multi_turn_conversation_reuses_the_history(ckpt):
    d, model = ckpt
    llm, fresh = _llm(d), _llm(d, prefix_cache=False)
    history: list[int] = []
    for turn in range(4):
        # the harness re-sends the history and adds new user text
        prompt = history + _tokens(MULTI_TURN_SEED + turn, 13 + 5 * turn)
        out, computed, reused = _run(llm, prompt)
        # the previous turn computed K/V for all of its history but its last sampled token
        expected = (len(history) - 1) // S * S if history else 0
        assert reused == expected and computed == len(prompt) - expected
        assert out == _run(fresh, prompt)[0] == _reference(model, prompt)
        history = prompt + out
    # an edit in the middle of the context (a tool output rewritten): reuse stops at its page
    edited = list(history)
    edited[43] = (edited[43] + 1) % 500 + 3
    out, computed, reused = _run(llm, edited)
    assert reused == 43 // S * S and computed == len(edited) - reused
    assert out == _run(fresh, edited)[0] == _reference(model, edited)
    llm.check_integrity()


def test_kv_pressure_with_a_full_tree_evicts_and_completes(ckpt):
    d, model = ckpt
    prompts = [_tokens(PRESSURE_SEED + i, 30 + 7 * i) for i in range(5)]
    # three more share their first 3 pages with earlier ones
    prompts += [p[:24] + _tokens(PRESSURE_SEED + 20 + i, 9) for i, p in enumerate(prompts[:3])]
    refs = [_reference(model, p) for p in prompts]
    # 14 pages of 8 tokens: a few requests at a time, and the tree fills up after the first ones
    llm = _llm(d, kv_pages=14, max_running_requests=2)
    for p, ref in zip(prompts[:3], refs[:3]):  # one after the other: the tree fills
        assert _run(llm, p)[0] == ref
    assert llm.stats()["radix_pages"] + llm.engine.kv.num_free == 14  # all of it is free or cached
    outs = llm.generate(prompts, PARAMS)  # all together: evictions, reuse and preemptions
    assert [o.token_ids for o in outs] == refs
    stats = llm.stats()
    assert stats["radix_evictions"] > 0 and stats["prefix_tokens_reused"] > 0
    assert stats["kv_pages_used"] == 0 and stats["radix_pages"] <= 14
    llm.check_integrity()


def test_preempted_request_resumes_from_its_cached_pages(ckpt):
    d, model = ckpt
    # Two decodes of 40 + 30 tokens (9 pages each) in 12 pages. Both hold 6 pages when a needs its 7th
    # (48 tokens computed each): b, the newer, is preempted and its 6 full pages enter the tree; a then
    # takes the 3 pages it still needs from the tree, b's deepest first; b resumes after the other 3;
    # a's 8 full pages entered the tree when it finished, and 5 of them make room for b's last 6 pages.
    a, b = _tokens(PREEMPT_SEED, 40), _tokens(PREEMPT_SEED + 1, 40)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    llm = _llm(d, kv_pages=12, max_running_requests=2)
    outs = llm.generate([a, b], params)
    assert [o.token_ids for o in outs] == [_reference(model, a, 30), _reference(model, b, 30)]
    stats = llm.stats()
    assert stats["preemptions"] == 1 and stats["prefix_tokens_reused"] == 3 * S and stats["radix_evictions"] == 3 + 5
    # without the tree the same run recomputes everything it had computed
    plain = _llm(d, kv_pages=12, max_running_requests=2, prefix_cache=False)
    assert [o.token_ids for o in plain.generate([a, b], params)] == [o.token_ids for o in outs]
    assert plain.stats()["prefill_tokens"] > stats["prefill_tokens"]
    llm.check_integrity()


def _request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, PARAMS, len(tokens) + STEPS, IncrementalDetokenizer(None, [], [], True))


def test_admission_evicts_only_when_that_makes_room():
    kv = KVPool(1, 6, 2, 1, 1, torch.float32, torch.device("cpu"))
    pages = KVManager(kv, RadixCache(kv))
    for rid, toks in (("a", [1, 2, 3, 4]), ("b", [5, 6, 7, 8])):
        done = _request(rid, toks)
        assert pages.admit(done, budget=100) == 4
        done.num_computed_tokens = 4
        pages.release(done)  # its 2 full pages enter the tree
    assert pages.tree is not None and pages.tree.num_pages == 4 and kv.num_free == 2
    big = _request("big", [9] * 13)  # 7 pages: more than free + evictable, so nothing is evicted
    assert pages.admit(big, budget=100) == 0 and pages.tree.num_pages == 4 and not big.pages
    reuse = _request("c", [1, 2, 3, 4] + [9] * 7)  # a's 2 pages, then 4 more: 2 free and b's 2 (LRU)
    assert pages.admit(reuse, budget=100) == 7 and reuse.num_computed_tokens == 4
    assert pages.tree.num_evictions == 2 and pages.num_prefix_tokens_reused == 4
    assert pages.tree.lookup([5, 6, 7, 8]).pages == [] and kv.num_free == 0
    pages.check_integrity([reuse])
